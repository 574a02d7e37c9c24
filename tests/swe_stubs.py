"""Test stand-ins for the SWE agent: the tiny task image and the docker stand-in (shipped in
``rescue.rehearsal``, which the rehearsal also runs), and a scripted model server.

- ``make_task_image(images)``: see ``rescue.rehearsal.standins.tasks``.
- ``install_fake_docker(tmp, monkeypatch)`` puts ``rescue/rehearsal/standins/docker.py`` behind an
  executable and points ``FAKE_DOCKER_ROOT`` at a fresh state folder.
- ``ScriptedOpenAI`` is an OpenAI-compatible chat endpoint on 127.0.0.1 answering from a
  script: ``{"command": c}`` (one bash tool call), ``{"text": t}`` (no tool call: a format
  error; ``<tool_call>…</tool_call>`` text is what SGLang without a tool-call parser
  returns), ``{"sleep": s}`` (stall), ``{"status": 400, "error": m}`` (SGLang's error body
  with message ``m``); the last item repeats. ``on_request(n)``, when given, runs before
  request ``n`` (0-based) is answered.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rescue.rehearsal.standins.tasks import (  # noqa: F401  (re-exported for the tests)
    BUG_PATCH,
    F2P,
    FIX,
    GOLD_PATCH,
    IMAGE,
    INSTANCE_ID,
    MAKE_PATCH,
    METADATA,
    P2P,
    PROBLEM,
    REPO,
    RUN_TESTS,
    SUBMIT,
    WRONG_FIX,
    docker_calls,
    docker_state,
    live_containers,
    make_task_image,
    write_docker_shim,
)


def install_fake_docker(tmp: Path, monkeypatch) -> tuple[str, Path]:
    """The stand-in ``docker`` as an executable; returns (path, state root with images/)."""
    root = docker_state(tmp / "docker")
    shim = write_docker_shim(tmp / "bin")
    monkeypatch.setenv("FAKE_DOCKER_ROOT", str(root))
    return str(shim), root


class ScriptedOpenAI:
    """OpenAI-compatible ``/v1/chat/completions`` on loopback, answering from a script."""

    def __init__(self, script: list[dict], on_request=None) -> None:
        self.script = list(script)
        self.on_request = on_request
        self.requests: list[dict] = []
        self.first_request = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.first_request.set()
                n = len(stub.requests) - 1
                item = stub.script[min(n, len(stub.script) - 1)]
                if stub.on_request is not None:
                    stub.on_request(n)
                if "sleep" in item:
                    time.sleep(item["sleep"])
                status = item.get("status", 200)
                reply = stub.response(item, n) if status == 200 else stub.error(item)
                payload = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @staticmethod
    def response(item: dict, n: int) -> dict:
        message: dict = {"role": "assistant", "content": item.get("text", "Running a command.")}
        finish = "stop"
        if "command" in item:
            message["tool_calls"] = [
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": json.dumps({"command": item["command"]}),
                    },
                }
            ]
            finish = "tool_calls"
        finish = item.get("finish_reason", finish)
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 0,
            "model": "model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    @staticmethod
    def error(item: dict) -> dict:
        """SGLang's OpenAI-style error body (``ErrorResponse``)."""
        status = item["status"]
        kind = "BadRequestError" if status == 400 else "InternalServerError"
        return {
            "object": "error",
            "message": item["error"],
            "type": kind,
            "param": None,
            "code": status,
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
