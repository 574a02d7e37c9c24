"""A stand-in SGLang engine (and the router in front of it) that pauses as slime pauses it.

What it mirrors, and where:

- slime's weight update (``slime/backends/megatron_utils/update_weight/
  update_weight_from_distributed.py`` L111-134): ``pause_generation`` on every engine,
  the weights with their ``weight_version``, ``continue_generation``. slime's
  ``SGLangEngine.pause_generation`` posts ``json={}`` (``sglang_engine.py`` L423-428), so
  SGLang's default mode applies: ``PauseGenerationReqInput.mode = "abort"``
  (``sglang/srt/managers/io_struct.py``);
- SGLang's ``TokenizerManager.pause_generation`` in ``abort`` mode
  (``sglang/srt/managers/tokenizer_manager.py``): ``is_pause = True``, then
  ``abort_request(abort_all=True)`` until no request holds the model-update lock, and only
  then the answer. Every request in flight returns at once with ``finish_reason
  {"type": "abort"}``, the tokens it produced so far (with their log-probs) and the
  ``weight_version`` it ran under (``meta_info["weight_version"]`` is the server's
  ``weight_version`` argument, set by the update); a request that arrives while paused
  waits in ``generate_request`` on ``is_pause_cond`` until ``continue_generation``;
- ``/update_weights_from_distributed`` sets the server's ``weight_version`` from its payload
  (slime sends it with every update); ``/get_weight_version`` answers with it as slime's
  SGLang patch makes it (``docker/patch/*/sglang.patch``, ``http_server.py``), or with a 404
  as upstream SGLang does (``patched=False``); ``/model_info`` carries it in upstream SGLang;
- the router's ``GET /workers`` (``{"workers": [{"id", "url"}]}``), which slime's ``abort``
  and rescue's version reader ask.

The model: request ``s`` (arrival order) produces tokens ``TOKEN0 * (s + 1) + j`` (``j =
0, 1, ...``: a token names the request that produced it) with log-prob ``-0.5``, until
``length`` tokens (``"stop"``) or ``max_new_tokens`` (``"length"``). While ``holding`` a
request stops after ``hold(s)`` tokens and waits (for a pause, or for ``release()``).
``log`` keeps, per request, ``(serial, version, tokens produced, finish type)``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN0 = 1000


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


class PausingEngine:
    def __init__(self, *, length: int = 6, patched: bool = True) -> None:
        self.length = length
        self.patched = patched
        self.version = "0"
        self.paused = False
        self.holding = False
        self.hold: Callable[[int], int] = lambda s: 0
        self.log: list[tuple[int, str, int, str]] = []
        self.cond = threading.Condition()
        self.in_flight = 0
        self._serial = 0
        self._abort_epoch = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                host, port = self.server.server_address
                if self.path == "/workers":
                    self._send(200, {"workers": [{"id": "w0", "url": f"http://{host}:{port}"}]})
                elif self.path == "/get_weight_version" and engine.patched:
                    self._send(200, {"weight_version": engine.version})
                elif self.path == "/get_weight_version":
                    self._send(404, {"detail": "Endpoint '/get_weight_version' is deprecated"})
                elif self.path == "/model_info":
                    self._send(200, {"model_path": "stand-in", "weight_version": engine.version})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"{}")
                if self.path == "/generate":
                    self._send(200, engine._generate(body))
                elif self.path == "/pause_generation":
                    engine._pause(body.get("mode", "abort"))
                    self._send(200, {})
                elif self.path == "/continue_generation":
                    engine._continue()
                    self._send(200, {})
                elif self.path == "/update_weights_from_distributed":
                    with engine.cond:
                        if body.get("weight_version") is not None:
                            engine.version = str(body["weight_version"])
                    self._send(200, {"success": True, "message": ""})
                else:
                    self._send(404, {"detail": "Not Found"})

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ── the server ───────────────────────────────────────────────────────────

    @property
    def url(self) -> str:
        host, port = self.server.server_address
        return f"http://{host}:{port}"

    def __enter__(self) -> PausingEngine:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.cond:
            self.holding = False
            self.paused = False
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # ── SGLang's behaviour ───────────────────────────────────────────────────

    def _generate(self, body: dict) -> dict:
        with self.cond:
            self.cond.wait_for(lambda: not self.paused)  # is_pause_cond
            serial, self._serial = self._serial, self._serial + 1
            version, epoch = self.version, self._abort_epoch
            self.in_flight += 1
            self.cond.notify_all()
            limit = int(body["sampling_params"]["max_new_tokens"])
            tokens: list[int] = []
            finish = None
            while finish is None:
                if self._abort_epoch != epoch:
                    finish = "abort"
                elif len(tokens) >= limit:
                    finish = "length"
                elif len(tokens) >= self.length:
                    finish = "stop"
                elif self.holding and len(tokens) >= self.hold(serial):
                    self.cond.wait()
                else:
                    tokens.append(TOKEN0 * (serial + 1) + len(tokens))
            self.in_flight -= 1
            self.log.append((serial, version, len(tokens), finish))
            self.cond.notify_all()
        return {
            "text": " ".join(map(str, tokens)),
            "meta_info": {
                "id": f"r{serial}",
                "finish_reason": {"type": finish},
                "prompt_tokens": len(body.get("input_ids") or ()),
                "completion_tokens": len(tokens),
                "cached_tokens": 0,
                "weight_version": version,
                "output_token_logprobs": [[-0.5, t, None] for t in tokens],
            },
        }

    def _pause(self, mode: str) -> None:
        if mode != "abort":
            raise ValueError(f"the stand-in pauses in SGLang's default mode only, not {mode}")
        with self.cond:
            self.paused = True
            self._abort_epoch += 1  # abort_request(abort_all=True)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.in_flight == 0)  # until the lock is free

    def _continue(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    # ── what a test does ─────────────────────────────────────────────────────

    def wait_in_flight(self, n: int, timeout_s: float = 60.0) -> None:
        """Until ``n`` requests are in flight and every one of them waits at its hold."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.in_flight >= n, timeout=timeout_s):
                raise TimeoutError(f"{self.in_flight} requests in flight, not {n}")

    def release(self) -> None:
        with self.cond:
            self.holding = False
            self.cond.notify_all()

    def update_weights(self, version: str, post: Callable[[str, dict], Any]) -> None:
        """slime's update: pause, the weights with their version, continue (``post(path,
        body)`` sends one request to this engine, as slime's ``SGLangEngine`` does)."""
        post("/pause_generation", {})
        post("/update_weights_from_distributed", {"weight_version": version})
        self.release()
        post("/continue_generation", {})

    @staticmethod
    def request_of(token: int) -> int:
        """The serial of the request that produced ``token``."""
        return token // TOKEN0 - 1
