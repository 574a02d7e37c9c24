"""The import hook that applies the CPU-change table in every process of a rehearsal.

``install(patches)`` puts ``Hook`` first on ``sys.meta_path``: a module named in ``patches``
is patched right after its first import (the Miles checkout is never touched); a module named
in ``MISSING`` that the environment lacks is created as a ``stand-in`` whose names are
placeholders that fail when used; ``PLACEHOLDERS`` packages become such stand-ins once
``placeholders_on`` has run (after transformers recorded them as missing).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

#: Modules PyPI sglang 0.5.23 and this machine lack that Miles imports at module level, for
#: code paths the rehearsal never takes (each has a row in the table).
MISSING = (
    "sglang.srt.entrypoints.openai.encoding_dsv4",
    "sglang.srt.model_loader.parameter_mapper",
    "mooncake.engine",
)
#: Packages imported only by SGLang's vision code on the rollout side's import path; when
#: not installable next to the CPU torch they are stand-ins. They appear only after
#: transformers has recorded them as unavailable, so transformers never takes a stand-in for
#: the package.
PLACEHOLDERS = ("torchvision",)
_placeholders = False


def placeholders_on(module: types.ModuleType) -> None:
    """The row's ``apply`` on ``transformers.utils.import_utils``."""
    global _placeholders
    module.is_torchvision_available()  # cached as False before the stand-in exists
    _placeholders = True


class Placeholder(type):
    """Any attribute is another placeholder class; calling one says what is missing."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(name, (), {"_missing": cls._missing})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{cls._missing} is not installed (CPU rehearsal placeholder)")


class Hook(importlib.abc.MetaPathFinder):
    """Patches a module right after its first import; creates ``MISSING`` modules."""

    def __init__(self, patches: dict[str, list[Callable[[types.ModuleType], None]]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        top = name.split(".")[0]
        if _placeholders and top in PLACEHOLDERS and self._real_spec(top, None, None) is None:
            return importlib.machinery.ModuleSpec(name, _StandInLoader(), is_package=True)
        if name in MISSING or any(m.startswith(name + ".") for m in MISSING):
            spec = self._real_spec(name, path, target)
            if spec is None:
                return importlib.machinery.ModuleSpec(name, _StandInLoader(), is_package=True)
            return None
        if name not in self.patches:
            return None
        spec = self._real_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.patches[name])
        return spec

    def _real_spec(self, name: str, path: Any, target: Any) -> Any:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                return spec
        return None


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        missing = module.__name__
        module.__doc__ = "Stand-in created by rescue's CPU rehearsal: its names fail when used."
        module.__getattr__ = lambda name: (  # type: ignore[method-assign]
            Placeholder(name, (), {"_missing": missing})
            if not name.startswith("__")
            else (_ for _ in ()).throw(AttributeError(name))
        )


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patches: list[Callable[[types.ModuleType], None]]) -> None:
        self.loader = loader
        self.patches = patches

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        for patch in self.patches:
            patch(module)


def install(patches: dict[str, list[Callable[[types.ModuleType], None]]]) -> None:
    """Put the hook first on ``sys.meta_path`` (idempotent)."""
    if any(isinstance(f, Hook) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, Hook(patches))
