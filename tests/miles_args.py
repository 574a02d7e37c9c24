"""Miles' own argument parser, for checking the launchers' flags in the integration tests.

``miles_parser()`` builds an ``argparse`` parser with Miles' ``get_miles_extra_args_provider``
(every Miles flag with its real type, choices and action), ``allow_abbrev=False`` as
Megatron's parser, into which Miles adds its flags, has it. Two modules Miles imports at the
top of ``miles.utils.arguments`` are replaced by import-only stand-ins when they are not
installed (they are GPU-side packages): ``sglang_router.launch_router.RouterArgs`` and
``sglang.srt.server_args.ServerArgs``, whose ``add_cli_args`` then registers nothing (and
``ChatCompletionRequest`` is added to ``miles_env``'s protocol stand-in, for the agentic
generate function that adds its flags) — so
SGLang's own ``--sglang-*`` flags and Megatron's flags (Megatron-LM's parser is not installed
either) are left over by ``parse_known_args``, and the tests check those against Miles' model
scripts and launchers instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types

from miles_env import require_miles


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


def miles_parser(words: list[str]) -> argparse.ArgumentParser:
    """Miles' flags in a parser (module docstring); skips without MILES_SRC. Miles reads the
    command line while it builds the parser (the rollout and generate functions may add
    flags), so ``words`` stand in ``sys.argv`` meanwhile, as in ``train.py WORDS``."""
    require_miles()
    if not _installed("sglang_router"):
        _stand_in(
            "sglang_router.launch_router",
            RouterArgs=type("RouterArgs", (), {"add_cli_args": staticmethod(lambda *a, **k: None)}),
        )
    if not _installed("sglang.srt.server_args"):
        _stand_in(
            "sglang.srt.server_args",
            ServerArgs=type("ServerArgs", (), {"add_cli_args": staticmethod(lambda *a, **k: None)}),
        )
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
    parser = miles_parser(words)
    try:
        return parser.parse_known_args(words)
    except SystemExit as e:  # argparse reports some errors by exiting even without exit_on_error
        raise AssertionError(f"Miles' parser refused the flags (exit {e.code})") from None
