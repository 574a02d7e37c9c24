"""Test stand-ins for the SWE agent: a tiny task image, the docker shim, a scripted model server.

- ``make_task_image(images)`` writes a SWE-smith-shaped git repository as the image
  ``IMAGE`` (``<images>/<IMAGE as folder>/testbed``): ``main`` holds the correct code and
  both test files; the branch ``INSTANCE_ID`` has the bug commit and then the commit that
  deletes the FAIL_TO_PASS test file, as SWE-smith task branches do.
- ``install_fake_docker(tmp, monkeypatch)`` puts ``tests/fake_docker.py`` behind an
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
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

INSTANCE_ID = "pallets__click.fde47b4b.func_pm_op_swap__tiny0001"
REPO = "swesmith/pallets__click.fde47b4b"
IMAGE = "swebench/swesmith.x86_64.pallets_1776_click.fde47b4b"
F2P = ["tests/test_calc.py::test_add"]
P2P = ["tests/test_other.py::test_mul"]
METADATA = {
    "instance_id": INSTANCE_ID,
    "repo": REPO,
    "image": IMAGE,
    "FAIL_TO_PASS": F2P,
    "PASS_TO_PASS": P2P,
}
PROBLEM = "calc.add(2, 3) returns -1 instead of 5."

FIX = "sed -i 's/return a - b/return a + b/' calc.py"
WRONG_FIX = "sed -i 's/return a - b/return a * b/' calc.py"
RUN_TESTS = "python -m pytest -q tests"
MAKE_PATCH = "git diff -- calc.py > patch.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"
GOLD_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b
+    return a + b


 def mul(a, b):
"""


def _git(cwd: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
    }
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def make_task_image(images: Path, image: str = IMAGE) -> Path:
    """Write the tiny task repository as ``image``; returns its work tree."""
    repo = images / image.replace("/", "_").replace(":", "_") / "testbed"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
    )
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    (repo / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (repo / "tests" / "test_other.py").write_text(
        "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
    )
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "checkout", "-q", "-b", INSTANCE_ID)
    (repo / "calc.py").write_text((repo / "calc.py").read_text().replace("a + b", "a - b"))
    _git(repo, "commit", "-qam", "bug")
    _git(repo, "rm", "-q", "tests/test_calc.py")
    _git(repo, "commit", "-qm", "remove F2P tests")
    _git(repo, "checkout", "-q", "main")
    return repo


def install_fake_docker(tmp: Path, monkeypatch) -> tuple[str, Path]:
    """An executable running ``fake_docker.py``; returns (path, state root with images/)."""
    root = tmp / "docker"
    (root / "images").mkdir(parents=True)
    (root / "containers").mkdir()
    shim = tmp / "bin" / "docker"
    shim.parent.mkdir(exist_ok=True)
    script = Path(__file__).with_name("fake_docker.py")
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("FAKE_DOCKER_ROOT", str(root))
    return str(shim), root


def live_containers(root: Path) -> list[str]:
    """Names of the stand-in's containers that still exist."""
    return [
        (c / "name").read_text() for c in (root / "containers").glob("*") if (c / "name").exists()
    ]


def docker_calls(root: Path) -> list[list[str]]:
    """Every call made to the stand-in, in order."""
    log = root / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


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
