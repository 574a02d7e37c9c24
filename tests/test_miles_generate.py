"""``rescue.miles.generate``: Miles' agentic generate function, with a 422 from sample
assembly turned into a no-result sample, against a stand-in of Miles' session server.

The stand-in answers as Miles' session server does (``miles/rollout/session``, commit
31f1ca96): ``POST /sessions`` returns ``{"session_id": ...}`` (``core.py``
``create_session``); ``POST /sessions/{id}/samples`` returns 422 with the assertion's text
as ``text/plain`` when assembly fails (``core.py`` ``collect_samples``, lines 336-339);
``DELETE /sessions/{id}`` returns 204 (``delete_session``). Everything else runs Miles' own
code: ``agentic_tool_call.generate``, ``OpenAIEndpointTracer``, ``http_utils``
(``require_miles``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import sglang_chat_request
from miles_env import require_miles

from rescue.census import no_result
from rescue.miles.generate import ASSEMBLY_REFUSAL, is_assembly_refusal
from rescue.samples import group_records

ASSERTION = "assert prompt_token_ids[:len(prev)] == prev: the history is not append-only"


class SessionServer:
    """Miles' session server as the driver meets it, with a scripted samples answer."""

    def __init__(self, samples_status: int = 422) -> None:
        self.calls: list[tuple[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.calls.append(("POST", self.path))
                if self.path == "/sessions":
                    self._answer(200, json.dumps({"session_id": "s1"}).encode(), "application/json")
                elif self.path == "/sessions/s1/samples":
                    text = ASSERTION if samples_status == 422 else "Internal Server Error"
                    self._answer(samples_status, text.encode(), "text/plain")
                else:
                    self._answer(404, b"not found", "text/plain")

            def do_DELETE(self) -> None:
                stub.calls.append(("DELETE", self.path))
                self._answer(204, b"", "text/plain")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def finished_agent(base_url, prompt, request_kwargs, metadata, **kwargs):
    """An agent function whose trial finished and was graded (it never calls the model)."""
    return {"reward": 1.0, "exit_status": "Submitted", "outcome": "solved"}


def _input(port: int, v2: bool = False):
    from miles.rollout.base_types import GenerateFnInput
    from miles.utils.types import Sample

    args = SimpleNamespace(
        session_server_ip="127.0.0.1",
        session_server_ports=[port],
        session_server_instance_ids=None,
        use_session_server="v2" if v2 else True,
        custom_agent_function_path="fake_agents.finished",
        max_seq_len=4096,
        # what http_utils.init_http_client reads
        rollout_num_gpus=1,
        sglang_server_concurrency=8,
        rollout_num_gpus_per_engine=1,
        eval_num_gpus=0,
        use_distributed_post=False,
    )
    sample = Sample(
        prompt="fix the bug",
        index=3,
        group_index=1,
        metadata={"instance_id": "a__b.1234abcd.x__1"},
    )
    return GenerateFnInput(
        state=SimpleNamespace(args=args), sample=sample, sampling_params={}, evaluation=False
    )


def _run(coro_fn, port: int, v2: bool = False):
    """Run ``coro_fn(input)`` with Miles' HTTP client made on this event loop."""
    from miles.utils import http_utils

    async def go():
        input = _input(port, v2)
        http_utils._http_client = None
        http_utils.init_http_client(input.args)
        try:
            return await coro_fn(input)
        finally:
            await http_utils._http_client.aclose()
            http_utils._http_client = None

    return asyncio.run(go())


@pytest.fixture
def miles(monkeypatch):
    require_miles()
    sglang_chat_request.install()
    monkeypatch.setitem(sys.modules, "fake_agents", types.SimpleNamespace(finished=finished_agent))
    from miles.rollout.generate_hub import agentic_tool_call

    return agentic_tool_call


def test_the_stand_in_fails_miles_generate_as_the_session_server_does(miles):
    """The control: Miles' own generate function lets the 422 escape (it would end the
    fully-async producer loop)."""
    server = SessionServer()
    try:
        with pytest.raises(RuntimeError) as e:
            _run(miles.generate, server.port)
    finally:
        server.close()
    assert is_assembly_refusal(e.value) and ASSERTION in str(e.value)
    assert ("DELETE", "/sessions/s1") in server.calls  # the tracer deleted the session first


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_a_refused_assembly_is_a_no_result_sample_with_its_reason(miles, v2):
    from miles.utils.types import Sample

    from rescue.miles.generate import generate

    server = SessionServer()
    try:
        out = _run(generate, server.port, v2)
    finally:
        server.close()
    samples = out.samples if v2 else [out.samples]
    assert len(samples) == 1 and isinstance(samples[0], Sample)
    (sample,) = samples
    assert sample.status == Sample.Status.ABORTED and sample.reward is None
    assert sample.metadata["outcome"] == "infra_no_result"
    assert sample.metadata["outcome_reason"] == "sample_assembly"
    assert ASSERTION in sample.metadata["error"] and sample.metadata["instance_id"]
    # the buffer drops its group by that reason, as every arm does
    assert no_result(group_records([sample])) == "sample_assembly"


def test_any_other_session_server_error_still_raises(miles):
    from rescue.miles.generate import generate

    server = SessionServer(samples_status=500)
    try:
        with pytest.raises(RuntimeError, match="failed with 500"):
            _run(generate, server.port)
    finally:
        server.close()


def test_the_wrapper_adds_miles_agentic_flags(miles):
    from rescue.miles.generate import generate

    parser = argparse.ArgumentParser()
    generate.add_arguments(parser)
    args = parser.parse_args(["--custom-agent-function-path", "m.f", "--max-seq-len", "9"])
    assert (args.custom_agent_function_path, args.max_seq_len) == ("m.f", 9)


def test_only_the_samples_422_is_a_refusal():
    assert is_assembly_refusal(
        RuntimeError(f"POST http://h:1/sessions/s/samples failed with 422: {ASSERTION}")
    )
    assert not is_assembly_refusal(
        RuntimeError("POST http://h:1/sessions/s/samples failed with 500: x")
    )
    assert not is_assembly_refusal(
        ValueError("POST http://h/sessions/s/samples failed with 422: x")
    )
    assert ASSEMBLY_REFUSAL.pattern.startswith("^POST")
