"""A stand-in SGLang engine on 127.0.0.1 that plays scripted SWE agents (stdlib HTTP only).

Run: ``python -m rescue.rehearsal.standins.engine --port P --model-path DIR [--tool-call-parser
qwen25] [--reasoning-parser qwen3] [--context-length N] [--record FILE]``.

It answers every request Miles sends an external engine at 31f1ca96 and fails where
SGLang 0.5.x fails:

| request | reply |
|---|---|
| ``GET /health``, ``/health_generate``, ``/flush_cache`` | 200 |
| ``GET /get_server_info``, ``/server_info`` | the server arguments Miles checks (host, port, nnodes, node_rank, gpu_id_step, base_gpu_id, tp/dp/pp/ep size, enable_memory_saver) plus context_length, tool_call_parser, reasoning_parser, weight_version |
| ``GET /model_info``, ``/get_weight_version`` | model path, ``weight_version`` |
| ``POST /update_weight_version`` ``{new_version}`` | the version every later reply reports in ``meta_info.weight_version`` |
| ``POST /generate`` | ``{text, output_ids, meta_info}``; ``finish_reason`` ``length`` at ``max_new_tokens``; with ``return_logprob`` and ``top_logprobs_num`` K, ``meta_info.output_top_logprobs`` (K entries per position) |
| ``POST /v1/chat/completions`` | one choice with ``meta_info.output_token_logprobs`` of exactly ``completion_tokens`` entries; with ``logprobs`` and ``top_logprobs`` K, ``meta_info.output_top_logprobs`` too |
| ``POST /abort_request``, ``/pause_generation``, ``/continue_generation`` | 200 |

As SGLang does (``serving_chat.py``, ``tokenizer_manager.py``, ``qwen25_detector.py``,
``reasoning_parser.py`` in 0.5.23):

- without ``--tool-call-parser`` a tool call stays in ``message.content`` as
  ``<tool_call>\\n{json}\\n</tool_call>`` text and ``tool_calls`` is null; with ``qwen25``
  it moves to ``message.tool_calls`` (id ``call_<24 hex>``), ``content`` keeps the text
  before it, and ``finish_reason`` ``stop`` becomes ``tool_calls``;
- without ``--reasoning-parser`` the ``<think>`` block stays in ``content``; with
  ``qwen3`` it moves to ``reasoning_content``;
- a prompt of ``n`` tokens with ``n >= context`` or ``n + max_tokens > context`` is a 400
  ``BadRequestError`` with SGLang's message; the context is ``--context-length`` or the
  checkpoint's ``max_position_embeddings``;
- a reply cut at ``max_tokens`` has ``finish_reason`` ``length``.

It dies as SGLang dies (a process killed by the kernel's OOM killer, a crash, a node gone):
on SIGUSR1 (``Engine.die``) every open connection is reset (``SO_LINGER`` 0 before the
process exits: the client's read fails with a connection reset, no reply), the process exits
at once with status 137, and the port refuses every later connection. A request in flight
gets no answer; nothing is flushed or said. (SIGTERM is a clean stop.)

The model: the first user message names the task; each new trial of a task (a request
with no assistant turn yet) takes the next behaviour of ``--mixture`` (round robin per
task, so a group of ``len(mixture)`` trials plays each once) and writes ``[plan NAME]`` in
the text of every reply, which later requests carry back. Behaviours (``BEHAVIOURS``): ``solve``
(fix, run tests, submit), ``wrong`` (a patch that does not resolve the task), ``loop``
(reads files until the turn cap), ``overrun`` (long replies until the context is full),
``ramble`` (replies cut by the length limit, no tool call).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rescue.rehearsal.standins.model import BEHAVIOURS, DEFAULT_MIXTURE, Model, error_body

__all__ = ["BEHAVIOURS", "DEFAULT_MIXTURE", "Engine", "Model", "main"]

#: Miles' weight update by broadcast (``rescue.rehearsal.standins.weights``).
WEIGHT_ROUTES = (
    "/init_weights_update_group",
    "/destroy_weights_update_group",
    "/update_weights_from_distributed",
)


class Engine:
    """The HTTP server around a ``Model``; ``record`` appends one JSON line per chat turn."""

    def __init__(
        self,
        model: Model,
        *,
        port: int,
        host: str = "127.0.0.1",
        base_gpu_id: int = 0,
        tp_size: int = 1,
        record: Path | None = None,
        weights_record: Path | None = None,
    ) -> None:
        from rescue.rehearsal.standins.weights import Receiver

        self.model = model
        self.receiver = Receiver()
        self.weights_record = Path(weights_record) if weights_record else None
        self._pending: dict[str, Any] = {}
        self._running = threading.Event()
        self._running.set()
        self.server_info = {
            "host": host,
            "port": port,
            "nnodes": 1,
            "node_rank": 0,
            "gpu_id_step": 1,
            "base_gpu_id": base_gpu_id,
            "tp_size": tp_size,
            "dp_size": 1,
            "pp_size": 1,
            "ep_size": 1,
            "enable_memory_saver": False,
            "model_path": str(model.model_path),
            "tokenizer_path": str(model.model_path),
            "context_length": model.context_length,
            "tool_call_parser": model.tool_call_parser,
            "reasoning_parser": model.reasoning_parser,
        }
        self.record = Path(record) if record else None
        self.requests: Counter[str] = Counter()
        self._write = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                engine.requests[self.path] += 1
                status, payload = engine.get(self.path.split("?")[0])
                self._send(status, payload)

            def do_POST(self) -> None:
                engine.requests[self.path] += 1
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except json.JSONDecodeError as e:
                    self._send(400, error_body(f"invalid JSON: {e}", 400))
                    return
                status, payload = engine.post(self.path.split("?")[0], body)
                self._send(status, payload)

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

        self._open: set[socket.socket] = set()  # the connections being served (``die``)

        class Server(ThreadingHTTPServer):
            def process_request(self, request: Any, client_address: Any) -> None:
                engine._open.add(request)
                super().process_request(request, client_address)

            def shutdown_request(self, request: Any) -> None:
                engine._open.discard(request)
                super().shutdown_request(request)

        self.server = Server((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.server_info["port"] = self.port

    def get(self, path: str) -> tuple[int, Any]:
        m = self.model
        if path in ("/health", "/health_generate", "/flush_cache"):
            return 200, {}
        if path in ("/get_server_info", "/server_info"):
            return 200, {**self.server_info, "weight_version": m.weight_version}
        if path in ("/model_info", "/get_model_info", "/get_weight_version"):
            return 200, {
                "model_path": str(m.model_path),
                "tokenizer_path": str(m.model_path),
                "is_generation": True,
                "weight_version": m.weight_version,
            }
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": str(m.model_path), "object": "model"}]}
        return 404, error_body(f"no route {path}", 404)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        m = self.model
        if path in ("/flush_cache", "/abort_request", "/begin_weight_update"):
            return 200, {"success": True}
        if path == "/pause_generation":
            self._running.clear()
            return 200, {"success": True}
        if path == "/continue_generation":
            self._running.set()
            return 200, {"success": True}
        if path in WEIGHT_ROUTES:
            return self._weights(path, body)
        if path == "/update_weight_version":
            m.weight_version = str(body["new_version"])
            self._record_weights()
            return 200, {"success": True, "message": f"weight_version {m.weight_version}"}
        if path == "/end_weight_update":
            self._record_weights()
            return 200, {"success": True}
        if path == "/generate":
            self._running.wait()
            ids = body.get("input_ids")
            if ids is None:
                ids = m.tokenizer.encode(str(body.get("text", "")), add_special_tokens=False).ids
            params = body.get("sampling_params") or {}
            max_new = params.get("max_new_tokens")
            if error := m.context_error(len(ids), max_new):
                return 400, error_body(error, 400)
            budget = max_new if max_new is not None else m.context_length - len(ids)
            top = int(body.get("top_logprobs_num") or 0) if body.get("return_logprob") else 0
            with_text = bool(body.get("return_text_in_logprobs"))
            if m.policy is not None:
                temperature = float(params.get("temperature", 1.0))
                return 200, m.sample(ids, budget, temperature, top, with_text=with_text)
            return 200, m.generate(m.raw_reply("solve", 0, budget), ids, budget, top, with_text)
        if path in ("/v1/chat/completions", "/chat/completions"):
            self._running.wait()
            start = time.monotonic()
            status, response, record = m.chat(body)
            record["s"] = round(time.monotonic() - start, 4)
            self._note(record)
            return status, response
        return 404, error_body(f"no route {path}", 404)

    def _weights(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """Miles' weight update by broadcast (``rescue.rehearsal.standins.weights``); a refusal is
        ``success: false`` with the reason, as SGLang answers."""
        from rescue.rehearsal.standins.weights import WeightUpdateError

        try:
            if path == "/init_weights_update_group":
                self.receiver.join(
                    master_address=body["master_address"], master_port=int(body["master_port"]),
                    rank_offset=int(body["rank_offset"]), world_size=int(body["world_size"]),
                    group_name=body["group_name"], backend=body.get("backend", "nccl"),
                )  # fmt: skip
            elif path == "/destroy_weights_update_group":
                self.receiver.leave(body["group_name"])
            else:
                if self.model.policy is None:
                    raise WeightUpdateError("this engine serves no policy to load weights into")
                named = self.receiver.receive(
                    body["group_name"], body["names"], body["dtypes"], body["shapes"]
                )
                self.model.policy.load(named)
                self._pending.update(named)
                if body.get("weight_version") is not None:
                    self.model.weight_version = str(body["weight_version"])
        except (WeightUpdateError, KeyError, ValueError) as e:
            return 200, {"success": False, "message": str(e)}
        return 200, {"success": True, "message": "ok"}

    def _record_weights(self) -> None:
        """One line per update (the tensors received since the last line): the version and
        the digest of what arrived, and of the whole model after loading it."""
        if not self._pending:
            return
        from rescue.rehearsal.tiny.policy import digest

        row = {
            "version": self.model.weight_version,
            "digest": digest(self._pending.items()),
            "tensors": len(self._pending),
            "model_digest": self.model.policy.state_digest(),
        }
        self._pending = {}
        if self.weights_record is not None:
            with self._write, self.weights_record.open("a") as f:
                f.write(json.dumps(row) + "\n")

    def _note(self, record: dict[str, Any]) -> None:
        if self.record is None:
            return
        record["weight_version"] = self.model.weight_version
        with self._write, self.record.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def die(self, status: int = 137) -> None:
        """Die as SGLang dies (module docstring): every open connection reset, no reply, the
        process gone at once."""
        reset = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends RST, not FIN
        for sock in [*list(self._open), self.server.socket]:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        os._exit(status)

    def start(self) -> Engine:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rescue.rehearsal.standins.engine", description=__doc__
    )
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: any free)")
    p.add_argument("--model-path", required=True, help="folder with tokenizer.json, config.json")
    p.add_argument("--tool-call-parser", default=None, help="qwen25 or unset (default unset)")
    p.add_argument("--reasoning-parser", default=None, help="qwen3 or unset (default unset)")
    p.add_argument(
        "--context-length", type=int, default=None, help="default: max_position_embeddings"
    )
    p.add_argument("--base-gpu-id", type=int, default=0, help="reported base_gpu_id (default 0)")
    p.add_argument("--tp-size", type=int, default=1, help="reported tp_size (default 1)")
    p.add_argument(
        "--mixture",
        default=",".join(DEFAULT_MIXTURE),
        help=f"behaviours per task, round robin (default {','.join(DEFAULT_MIXTURE)})",
    )
    p.add_argument("--record", default=None, help="append one JSON line per chat turn here")
    p.add_argument(
        "--policy",
        action="store_true",
        help="serve the tiny model of --model-path (rescue.rehearsal.tiny.policy): log-probs and "
        "heads from it, /generate sampled from it, weights updated by Miles (default off: "
        "fixed log-probs, no weight update)",
    )
    p.add_argument("--seed", type=int, default=0, help="the policy's sampling seed (default 0)")
    p.add_argument(
        "--weights-record", default=None, help="append one JSON line per weight update here"
    )
    a = p.parse_args(argv)
    policy = None
    if a.policy:
        from rescue.rehearsal.tiny.policy import Policy

        policy = Policy(Path(a.model_path), seed=a.seed)
    try:
        model = Model(
            Path(a.model_path),
            tool_call_parser=a.tool_call_parser,
            reasoning_parser=a.reasoning_parser,
            context_length=a.context_length,
            mixture=tuple(x for x in a.mixture.split(",") if x),
            policy=policy,
        )
    except ValueError as e:
        p.error(str(e))
    engine = Engine(
        model, port=a.port, base_gpu_id=a.base_gpu_id, tp_size=a.tp_size, record=a.record,
        weights_record=a.weights_record,
    )  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: engine.die())
    print(f"engine ready on 127.0.0.1:{engine.port}", flush=True)
    engine.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
