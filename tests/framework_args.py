"""Miles' and slime's own argument parsers, for checking the launchers' flags and for tests
that need a framework's defaults.

``miles_parser(words)`` builds an ``argparse`` parser with Miles'
``get_miles_extra_args_provider``, ``slime_parser()`` one with slime's
``get_slime_extra_args_provider`` (every flag with its real type, choices, action and
default; ``allow_abbrev=False`` as Megatron's parser, into which both add their flags, has
it). Both frameworks import sglang's ``ServerArgs`` and sglang_router's ``RouterArgs`` at the
top of their argument modules only to add those flags; where those GPU-side packages are not
installed, import-only stand-ins add none (``ChatCompletionRequest`` is added to
``miles_env``'s protocol stand-in, for Miles' agentic generate function that adds its flags),
so SGLang's own ``--sglang-*`` flags and Megatron's flags (Megatron-LM's parser is not
installed either) are left over by ``parse_known_args``, and the tests check those against
Miles' model scripts and the launchers instead. slime's module also imports ``yaml`` and
``wandb`` (``slime.observability.logging_utils``), which the test environment has.

``parse_with_miles(words)`` / ``parse_with_slime(words)`` return ``(namespace, words the
framework does not define)``; ``slime_defaults(**overrides)`` is slime's namespace for its
one required flag (with the flags slime pre-parses apart, as its ``parse_args`` merges
them), with overrides.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from typing import Any

from miles_env import require_miles, require_slime


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


def _sglang_stand_ins() -> None:
    """Import-only ``RouterArgs`` and ``ServerArgs`` that add no flag, where the packages (or
    an earlier stand-in's name) are missing."""
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


def _parse(parser: argparse.ArgumentParser, words: list[str], who: str) -> tuple:
    try:
        return parser.parse_known_args(words)
    except SystemExit as e:  # argparse reports some errors by exiting even without exit_on_error
        raise AssertionError(f"{who}'s parser refused the flags (exit {e.code})") from None


def miles_parser(words: list[str]) -> argparse.ArgumentParser:
    """Miles' flags in a parser (module docstring); skips without MILES_SRC. Miles reads the
    command line while it builds the parser (the rollout and generate functions may add
    flags), so ``words`` stand in ``sys.argv`` meanwhile, as in ``train.py WORDS``."""
    require_miles()
    _sglang_stand_ins()
    protocol = sys.modules.get("sglang.srt.entrypoints.openai.protocol")
    if protocol is not None and getattr(protocol, "__file__", None) is None:
        # the SWE arms' generate function (agentic_tool_call) imports this name; it adds its
        # own flags to the parser and never builds a request here
        from pydantic import BaseModel

        if not hasattr(protocol, "ChatCompletionRequest"):
            protocol.ChatCompletionRequest = type("ChatCompletionRequest", (BaseModel,), {})
    from miles.utils.arguments import get_miles_extra_args_provider

    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    argv = sys.argv
    sys.argv = ["train.py", *words]
    try:
        get_miles_extra_args_provider()(parser)
    finally:
        sys.argv = argv
    return parser


def parse_with_miles(words: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``(namespace, words Miles' parser does not define)``; a bad value raises."""
    return _parse(miles_parser(words), words, "Miles")


def slime_parser() -> argparse.ArgumentParser:
    """slime's flags in a parser (module docstring); skips without SLIME_SRC."""
    require_slime()
    _sglang_stand_ins()
    from slime.utils.arguments import get_slime_extra_args_provider

    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    get_slime_extra_args_provider()(parser)
    return parser


def parse_with_slime(words: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``(namespace, words slime's parser does not define)``; a bad value raises."""
    return _parse(slime_parser(), words, "slime")


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
