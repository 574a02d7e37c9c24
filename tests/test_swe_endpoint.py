"""The pre-flight probe of a served endpoint, against stub endpoints that answer as SGLang does.

SGLang fills ``message.tool_calls`` only when started with a tool-call parser; without one
Qwen's call stays in ``content`` as ``<tool_call>…</tool_call>`` text, and without a
reasoning parser the ``<think>`` block does too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("minisweagent")

from swe_stubs import ScriptedOpenAI

from swe_smith_tasks import cli as swe_cli
from swe_smith_tasks.endpoint import is_context_limit, probe_tool_calls

QWEN_CALL_AS_TEXT = (
    '<tool_call>\n{"name": "bash", "arguments": {"command": "echo ready"}}\n</tool_call>'
)


def probe(script, **kwargs):
    server = ScriptedOpenAI(script)
    try:
        return probe_tool_calls(server.base_url, "Qwen3-8B", **kwargs), server.requests
    finally:
        server.close()


def test_sglang_without_a_tool_call_parser_fails_naming_the_flag():
    verdict, requests = probe(
        [{"text": QWEN_CALL_AS_TEXT}], tool_call_parser="qwen25", reasoning_parser="qwen3"
    )
    assert not verdict.ok
    assert "--tool-call-parser qwen25" in verdict.message
    assert "--sglang-tool-call-parser qwen25" in verdict.message
    assert len(requests) == 1
    (tool,) = requests[0]["tools"]
    assert tool["function"]["name"] == "bash"  # mini-swe-agent's own tool definition


def test_sglang_without_a_reasoning_parser_fails_naming_the_flag():
    verdict, _ = probe(
        [{"text": "<think>\nI should run it.\n</think>\n\nDone.", "command": "echo ready"}],
        tool_call_parser="qwen25",
        reasoning_parser="qwen3",
    )
    assert not verdict.ok and "--reasoning-parser qwen3" in verdict.message


def test_tool_calls_in_tool_calls_pass():
    verdict, requests = probe(
        [{"command": "echo ready"}], request_kwargs={"chat_template_kwargs": {"x": False}}
    )
    assert verdict.ok and "returns tool calls" in verdict.message
    assert requests[0]["chat_template_kwargs"] == {"x": False}


def test_a_model_that_never_calls_the_tool_fails_after_the_tries():
    verdict, requests = probe([{"text": "ready"}], tries=2)
    assert not verdict.ok and "without calling the bash tool" in verdict.message
    assert len(requests) == 2


def test_an_unreachable_or_failing_endpoint_fails():
    verdict = probe_tool_calls("http://127.0.0.1:9", "m", timeout_s=5)
    assert not verdict.ok and "no chat reply" in verdict.message
    verdict, _ = probe([{"status": 400, "error": "tools are not supported"}])
    assert not verdict.ok and "HTTP 400" in verdict.message


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    swe_cli.configure(parser)
    return swe_cli.main(parser.parse_args(list(argv)))


def test_cli_probe_exit_status_and_message(capsys):
    for script, code in (([{"text": QWEN_CALL_AS_TEXT}], 1), ([{"command": "echo ready"}], 0)):
        server = ScriptedOpenAI(script)
        try:
            argv = ["probe", "--base-url", server.base_url, "--model", "m"]
            argv += ["--tool-call-parser", "qwen25", "--chat-template-kwargs", '{"a": 1}']
            assert _cli(*argv) == code
            assert server.requests[0]["chat_template_kwargs"] == {"a": 1}
        finally:
            server.close()
    out = capsys.readouterr()
    assert "--tool-call-parser qwen25" in out.err and out.out.startswith("ok:")


def test_context_limit_messages_are_recognised_and_others_are_not():
    assert is_context_limit(
        json.dumps({"message": "The input (5 tokens) is longer than the model's context length"})
    )
    assert not is_context_limit("Invalid tool_choice")


def test_the_swe_extra_pins_a_litellm_that_mini_swe_agent_accepts():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the core's tomli dependency
        import tomli as tomllib
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["swe"]]
    (pin,) = [r for r in extra if r.name == "litellm"]
    (pinned,) = [s.version for s in pin.specifier if s.operator == "=="]
    (agent_needs,) = [Requirement(r) for r in requires("mini-swe-agent") if r.startswith("litellm")]
    assert agent_needs.specifier.contains(pinned)  # e.g. not the withdrawn 1.82.7/1.82.8
    assert version("litellm") == pinned  # the version these tests ran against
