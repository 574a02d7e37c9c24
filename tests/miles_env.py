"""Access to real Miles / slime sources for integration tests.

``MILES_SRC`` / ``SLIME_SRC`` name a checkout of radixark/miles / THUDM/slime. A test that
needs one calls ``require_miles()`` / ``require_slime()``: it skips with the reason when
the variable is unset, fails naming the package when one the framework imports is not
installed, warns when the sources are not at the commit rescue is tested against
(``rescue.frameworks``), and puts the checkout on ``sys.path`` and returns it.

Which commit a source folder is at: a git checkout (a ``.git`` in the folder itself) by
``git rev-parse HEAD``; otherwise, the folder's name ``<name>-<commit>`` (7 to 40 hex
digits), which is how ``git archive`` tarballs of a commit unpack (GitHub's downloads, the
pinned archives; CI names the folder after the commit ``git get-tar-commit-id`` reads from
the archive itself). Neither: the warning says it cannot tell.

Miles' rollout modules import ``sglang.srt.entrypoints.openai.encoding_dsv4`` and
``...protocol.Tool`` at import time (chat templates), which CPU tests never call. When
``sglang`` (or that module of it) is not installed, ``require_miles`` registers import-only
stand-ins for those two modules in ``sys.modules``; nothing in Miles' tree is touched.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from rescue.frameworks import MILES, SLIME, PinnedFramework

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
    """Fail, naming them, when packages the framework imports are missing: the user asked
    for the integration tests by setting ``variable``, so a skip would hide them."""
    missing = [m for m in FRAMEWORK_DEPENDENCIES if not _module_exists(m)]
    if missing:
        pytest.fail(
            f"{variable} is set but {', '.join(missing)} not installed: "
            "pip install -e '.[integration]' (or run `make integration`)",
            pytrace=False,
        )


class FrameworkCommitWarning(UserWarning):
    """The framework sources are not (or not known to be) at the pinned commit."""


def source_commit(src: str | os.PathLike) -> tuple[str | None, str]:
    """The commit ``src`` is at (full, or the prefix its folder name gives) and how that is
    known; ``(None, why)`` when it cannot be told."""
    path = Path(src).resolve()
    if (path / ".git").exists():
        done = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        if done.returncode == 0:
            return done.stdout.strip(), "git rev-parse HEAD"
        return None, f"git rev-parse HEAD failed: {done.stderr.strip()}"
    named = re.fullmatch(r".+-([0-9a-f]{7,40})", path.name)
    if named:
        return named.group(1), f"its folder name {path.name}"
    return None, f"no .git in it and its name {path.name} is not <name>-<commit>"


def commit_mismatch(framework: PinnedFramework, src: str | os.PathLike) -> str | None:
    """A message when ``src`` is not known to be at ``framework``'s pinned commit, else None."""
    commit, how = source_commit(src)
    pinned = f"{framework.repository}@{framework.commit}"
    if commit is None:
        return (
            f"cannot tell which {framework.name} commit {src} is ({how}); "
            f"rescue is tested against {pinned}"
        )
    if framework.commit.startswith(commit.lower()):
        return None
    return (
        f"{framework.name} at {src} is commit {commit} (by {how}), not {pinned} that rescue "
        f"is tested against: a failure may come from changes in {framework.name}"
    )


_checked: set[tuple[str, str]] = set()


def warn_unless_pinned(framework: PinnedFramework, src: str) -> None:
    """Warn once per source when it is not known to be at the pinned commit."""
    if (framework.package, src) in _checked:
        return
    _checked.add((framework.package, src))
    message = commit_mismatch(framework, src)
    if message is not None:
        warnings.warn(message, FrameworkCommitWarning, stacklevel=3)


def require_miles() -> str:
    """Miles' checkout on ``sys.path`` (with the sglang stand-ins); skip when unset."""
    if MILES_SRC is None:
        pytest.skip("needs real Miles sources: set MILES_SRC=/path/to/miles to run")
    _require_dependencies("MILES_SRC")
    src = _on_path(MILES_SRC)
    warn_unless_pinned(MILES, src)
    stub_sglang_for_miles()
    return src


def require_slime() -> str:
    """slime's checkout on ``sys.path``; skip when unset."""
    if SLIME_SRC is None:
        pytest.skip("needs real slime sources: set SLIME_SRC=/path/to/slime to run")
    _require_dependencies("SLIME_SRC")
    src = _on_path(SLIME_SRC)
    warn_unless_pinned(SLIME, src)
    return src


def miles_argument_parser():
    """Miles' own argument parser (``get_miles_extra_args_provider``: Miles' flags, not
    Megatron's); skips without ``MILES_SRC``, fails without polars (the integration extra).

    Miles' arguments module imports sglang's ``ServerArgs`` and sglang_router's
    ``RouterArgs`` only to add their flags to the parser. Where those packages are not
    installed, import-only stand-ins add no flag, so SGLang's and the router's flags are left
    over by ``parse_known_args`` like Megatron's; everything Miles defines is parsed by
    Miles' code.
    """
    import argparse

    require_miles()
    if not _module_exists("polars"):
        pytest.fail("Miles' argument parser imports polars: pip install -e '.[integration]'")
    if not _module_exists("sglang.srt.server_args"):
        module = types.ModuleType("sglang.srt.server_args")
        module.ServerArgs = type("ServerArgs", (), {"add_cli_args": staticmethod(lambda p: None)})
        sys.modules[module.__name__] = module
    if not _module_exists("sglang_router.launch_router"):
        package = sys.modules.setdefault("sglang_router", types.ModuleType("sglang_router"))
        package.__path__ = []
        module = types.ModuleType("sglang_router.launch_router")
        module.RouterArgs = type(
            "RouterArgs", (), {"add_cli_args": staticmethod(lambda p, **kw: None)}
        )
        sys.modules[module.__name__] = module
        package.launch_router = module
    from miles.utils.arguments import get_miles_extra_args_provider

    parser = argparse.ArgumentParser(prog="miles")
    get_miles_extra_args_provider()(parser)
    return parser
