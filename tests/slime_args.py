"""slime's own argument parser, for the launcher's dry runs and for tests that need slime's
defaults.

``slime_parser()`` builds an ``argparse`` parser with slime's
``get_slime_extra_args_provider`` (every slime flag with its real type, choices, action and
default; ``allow_abbrev=False`` as Megatron's parser, into which slime adds its flags, has
it). ``slime.utils.arguments`` imports sglang's ``ServerArgs`` and sglang_router's
``RouterArgs`` (``slime/backends/sglang_utils/arguments.py``) only to add their flags; where
those GPU-side packages are not installed, import-only stand-ins add none, so SGLang's own
``--sglang-*`` flags and Megatron's flags are left over by ``parse_known_args`` (the tests
check those against the launcher's lists instead). It also imports ``yaml`` and ``wandb``
(``slime.observability.logging_utils``), which the test environment has.

``parse_with_slime(words)`` returns ``(namespace, words slime does not define)``;
``slime_defaults(**overrides)`` is slime's namespace for its one required flag (with the
flags slime pre-parses apart, as its ``parse_args`` merges them), with overrides.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from typing import Any

from miles_env import require_slime


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _stand_in(name: str, **attrs: object) -> None:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            module = types.ModuleType(sub)
            module.__path__ = []
            sys.modules[sub] = module
            if i > 1:
                setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], module)
    for key, value in attrs.items():
        setattr(sys.modules[name], key, value)


def _no_flags(*args: Any, **kwargs: Any) -> None:
    return None


def slime_parser() -> argparse.ArgumentParser:
    """slime's flags in a parser (module docstring); skips without SLIME_SRC."""
    require_slime()
    router = sys.modules.get("sglang_router.launch_router")
    if not _installed("sglang_router") or (
        router is not None and not hasattr(router, "RouterArgs")
    ):
        _stand_in(
            "sglang_router.launch_router",
            RouterArgs=type("RouterArgs", (), {"add_cli_args": staticmethod(_no_flags)}),
        )
    if not _installed("sglang.srt.server_args"):
        _stand_in(
            "sglang.srt.server_args",
            ServerArgs=type("ServerArgs", (), {"add_cli_args": staticmethod(_no_flags)}),
        )
    from slime.utils.arguments import get_slime_extra_args_provider

    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    get_slime_extra_args_provider()(parser)
    return parser


def parse_with_slime(words: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``(namespace, words slime's parser does not define)``; a bad value raises."""
    parser = slime_parser()
    try:
        return parser.parse_known_args(words)
    except SystemExit as e:  # argparse reports some errors by exiting even without exit_on_error
        raise AssertionError(f"slime's parser refused the flags (exit {e.code})") from None


def slime_defaults(**overrides: Any) -> argparse.Namespace:
    """slime's defaults for every flag it defines, with ``overrides`` set (slime requires
    ``--rollout-batch-size``: 1 unless overridden)."""
    words = ["--rollout-batch-size", str(overrides.get("rollout_batch_size", 1))]
    args, _ = parse_with_slime(words)
    # the flags slime pre-parses apart (_pre_parse_mode: --train-backend, --debug-*-only,
    # --load-debug-rollout-data), merged as slime's parse_args merges them
    from slime.utils.arguments import _pre_parse_mode

    argv, sys.argv = sys.argv, ["train.py", *words]
    try:
        for key, value in vars(_pre_parse_mode()).items():
            setattr(args, key, value)
    finally:
        sys.argv = argv
    for key, value in overrides.items():
        setattr(args, key, value)
    return args
