"""Access to real Miles / slime sources for integration tests.

``MILES_SRC`` / ``SLIME_SRC`` name a checkout of radixark/miles / THUDM/slime. A test that
needs one calls ``require_miles()`` / ``require_slime()``: it skips with the reason when
the variable is unset, else puts the checkout on ``sys.path`` and returns it.

Miles' rollout modules import ``sglang.srt.entrypoints.openai.encoding_dsv4`` and
``...protocol.Tool`` at import time (chat templates), which CPU tests never call. When
``sglang`` (or that module of it) is not installed, ``require_miles`` registers import-only
stand-ins for those two modules in ``sys.modules``; nothing in Miles' tree is touched.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import pytest

MILES_SRC = os.environ.get("MILES_SRC") or None
SLIME_SRC = os.environ.get("SLIME_SRC") or None

_SGLANG_OPENAI = "sglang.srt.entrypoints.openai"


def _on_path(src: str) -> str:
    src = os.path.abspath(src)
    if not os.path.isdir(src):
        raise RuntimeError(f"{src} is not a directory")
    if src not in sys.path:
        sys.path.insert(0, src)
    return src


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def stub_sglang_for_miles() -> None:
    """Register stand-ins for the two sglang modules Miles imports but CPU tests never use."""
    if _module_exists(f"{_SGLANG_OPENAI}.encoding_dsv4") and _module_exists(
        f"{_SGLANG_OPENAI}.protocol"
    ):
        return
    parts = _SGLANG_OPENAI.split(".")
    parent = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        module = sys.modules.get(name)
        if module is None:
            if _module_exists(name):
                module = importlib.import_module(name)
            else:
                module = types.ModuleType(name)
                module.__path__ = []
                sys.modules[name] = module
        if parent is not None:
            setattr(parent, parts[i], module)
        parent = module
    if not _module_exists(f"{_SGLANG_OPENAI}.encoding_dsv4"):
        dsv4 = types.ModuleType(f"{_SGLANG_OPENAI}.encoding_dsv4")
        sys.modules[dsv4.__name__] = dsv4
        parent.encoding_dsv4 = dsv4
    if not _module_exists(f"{_SGLANG_OPENAI}.protocol"):
        from pydantic import BaseModel

        protocol = types.ModuleType(f"{_SGLANG_OPENAI}.protocol")
        protocol.Tool = type("Tool", (BaseModel,), {"__module__": protocol.__name__})
        sys.modules[protocol.__name__] = protocol
        parent.protocol = protocol


#: What Miles' buffer, conversion, tracking and trainer modules (and slime's worker and
#: advantage code) import on a CPU: the ``[integration]`` extra.
FRAMEWORK_DEPENDENCIES = (
    "torch",
    "ray",
    "httpx",
    "pydantic",
    "transformers",
    "pybase64",
    "aiohttp",
    "megatron.core",
)


def _require_dependencies(variable: str) -> None:
    missing = [m for m in FRAMEWORK_DEPENDENCIES if not _module_exists(m)]
    if missing:
        pytest.skip(
            f"{variable} is set but {', '.join(missing)} not installed: "
            "pip install -e '.[integration]' (or run `make integration`)"
        )


def require_miles() -> str:
    """Miles' checkout on ``sys.path`` (with the sglang stand-ins), or skip the test."""
    if MILES_SRC is None:
        pytest.skip("needs real Miles sources: set MILES_SRC=/path/to/miles to run")
    _require_dependencies("MILES_SRC")
    src = _on_path(MILES_SRC)
    stub_sglang_for_miles()
    return src


def require_slime() -> str:
    """slime's checkout on ``sys.path``, or skip the test."""
    if SLIME_SRC is None:
        pytest.skip("needs real slime sources: set SLIME_SRC=/path/to/slime to run")
    _require_dependencies("SLIME_SRC")
    return _on_path(SLIME_SRC)
