"""A stand-in SGLang engine on 127.0.0.1 that plays scripted SWE agents (stdlib HTTP only).

Run: ``python -m rescue.rehearsal.engine --port P --model-path DIR [--tool-call-parser
qwen25] [--reasoning-parser qwen3] [--context-length N] [--record FILE]``.

It answers every request Miles sends an external engine at 31f1ca96 and fails where
SGLang 0.5.x fails:

| request | reply |
|---|---|
| ``GET /health``, ``/health_generate``, ``/flush_cache`` | 200 |
| ``GET /get_server_info``, ``/server_info`` | the server arguments Miles checks (host, port, nnodes, node_rank, gpu_id_step, base_gpu_id, tp/dp/pp/ep size, enable_memory_saver) plus context_length, tool_call_parser, reasoning_parser, weight_version |
| ``GET /model_info``, ``/get_weight_version`` | model path, ``weight_version`` |
| ``POST /update_weight_version`` ``{new_version}`` | the version every later reply reports in ``meta_info.weight_version`` |
| ``POST /generate`` | ``{text, output_ids, meta_info}``; ``finish_reason`` ``length`` at ``max_new_tokens`` |
| ``POST /v1/chat/completions`` | one choice with ``meta_info.output_token_logprobs`` of exactly ``completion_tokens`` entries |
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
import hashlib
import json
import math
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rescue.rehearsal.tasks import FIX, MAKE_PATCH, RUN_TESTS, SUBMIT, WRONG_FIX

#: Behaviour name -> the commands of its turns (the last one repeats).
BEHAVIOURS: dict[str, tuple[str, ...]] = {
    "solve": ("cat calc.py", FIX, RUN_TESTS, MAKE_PATCH, SUBMIT),
    "wrong": ("cat calc.py", WRONG_FIX, RUN_TESTS, MAKE_PATCH, SUBMIT),
    "loop": ("cat calc.py", "ls tests"),
    "overrun": ("cat calc.py",),
    "ramble": ("",),
}
DEFAULT_MIXTURE = ("solve", "wrong", "loop", "overrun")
TOOL_CALL_PARSERS = ("qwen25",)
REASONING_PARSERS = ("qwen3",)
_PLAN = re.compile(r"\[plan (\w+)\]")
_FILLER = "Let me reread every line of the code and the tests once more before I decide. "


class Model:
    """The scripted policy and SGLang's reply shaping (no HTTP here, so tests call it)."""

    def __init__(
        self,
        model_path: Path,
        *,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        context_length: int | None = None,
        mixture: tuple[str, ...] = DEFAULT_MIXTURE,
    ) -> None:
        from tokenizers import Tokenizer

        if tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(
                f"--tool-call-parser={tool_call_parser!r}; allowed: {', '.join(TOOL_CALL_PARSERS)}"
            )
        if reasoning_parser not in (None, *REASONING_PARSERS):
            raise ValueError(
                f"--reasoning-parser={reasoning_parser!r}; allowed: {', '.join(REASONING_PARSERS)}"
            )
        unknown = [b for b in mixture if b not in BEHAVIOURS]
        if unknown or not mixture:
            raise ValueError(f"--mixture={','.join(mixture)!r}; allowed: {', '.join(BEHAVIOURS)}")
        self.model_path = Path(model_path)
        self.tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
        config = json.loads((self.model_path / "config.json").read_text())
        self.context_length = int(context_length or config["max_position_embeddings"])
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self.mixture = tuple(mixture)
        self.weight_version = "default"
        self._eos = self.tokenizer.token_to_id("<|im_end|>")
        self._trials: Counter[str] = Counter()
        self._lock = threading.Lock()

    # ── the policy ──────────────────────────────────────────────────────────────────

    def behaviour_of(self, messages: list[dict[str, Any]]) -> tuple[str, int]:
        """(behaviour, turn) of the trial these messages belong to."""
        assistant = [m for m in messages if m.get("role") == "assistant"]
        for m in assistant:
            found = _PLAN.search(str(m.get("content") or ""))
            if found and found.group(1) in BEHAVIOURS:
                return found.group(1), len(assistant)
        task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        key = hashlib.sha256(task.encode()).hexdigest()
        with self._lock:
            k = self._trials[key]
            self._trials[key] += 1
        return self.mixture[k % len(self.mixture)], len(assistant)

    def raw_reply(self, behaviour: str, turn: int, max_new_tokens: int) -> str:
        """What the model generates (Qwen3 format: think block, text, one tool call)."""
        script = BEHAVIOURS[behaviour]
        command = script[min(turn, len(script) - 1)]
        think = f"Turn {turn + 1}."
        if behaviour == "overrun":
            n = max(1, min(self.context_length // 5, max_new_tokens - 200))
            think += " " + self._filler(n)
        if behaviour == "ramble":
            return f"[plan {behaviour}] {self._filler(max_new_tokens + 50)}"
        call = json.dumps({"name": "bash", "arguments": {"command": command}})
        return (
            f"<think>\n{think}\n</think>\n\nTHOUGHT: [plan {behaviour}] next step.\n\n"
            f"<tool_call>\n{call}\n</tool_call>"
        )

    def _filler(self, n_tokens: int) -> str:
        per = max(1, len(self.tokenizer.encode(_FILLER, add_special_tokens=False).ids))
        return _FILLER * math.ceil(n_tokens / per)

    # ── SGLang's shaping ────────────────────────────────────────────────────────────

    def context_error(self, n_input: int, max_new_tokens: int | None) -> str | None:
        """SGLang's 400 message when the request does not fit the context, else None."""
        if n_input >= self.context_length:
            return (
                f"The input ({n_input} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        if max_new_tokens is not None and n_input + max_new_tokens > self.context_length:
            return (
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens. You requested a total of "
                f"{n_input + max_new_tokens} tokens: {n_input} tokens from the input messages "
                f"and {max_new_tokens} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit."
            )
        return None

    def generate(self, text: str, n_input: int, max_new_tokens: int) -> dict[str, Any]:
        """Output ids, decoded text and ``meta_info`` of one generation of ``text``."""
        ids = [*self.tokenizer.encode(text, add_special_tokens=False).ids, self._eos]
        if len(ids) > max_new_tokens:
            ids = ids[:max_new_tokens]
            finish: dict[str, Any] = {"type": "length", "length": max_new_tokens}
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        else:
            finish = {"type": "stop", "matched": self._eos}
        logprobs = [[-0.5, i, None] for i in ids]
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": n_input,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "output_token_logprobs": logprobs,
            "weight_version": self.weight_version,
            "e2e_latency": 0.0,
        }
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """(status, response, record) of one ``/v1/chat/completions`` request."""
        messages = list(body.get("messages") or [])
        input_ids = body.get("input_ids")
        if input_ids is None:
            rendered = json.dumps(messages)
            input_ids = self.tokenizer.encode(rendered, add_special_tokens=False).ids
        max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        behaviour, turn = self.behaviour_of(messages)
        record = {"behaviour": behaviour, "turn": turn, "prompt_tokens": len(input_ids)}
        error = self.context_error(len(input_ids), max_new)
        if error is not None:
            record.update(status=400, error=error)
            return 400, _error(error, 400), record
        budget = max_new if max_new is not None else self.context_length - len(input_ids)
        out = self.generate(self.raw_reply(behaviour, turn, budget), len(input_ids), budget)
        meta = out["meta_info"]
        text = out["text"]
        if text.endswith("<|im_end|>"):
            text = text[: -len("<|im_end|>")]
        finish = dict(meta["finish_reason"])
        reasoning = None
        if self.reasoning_parser and body.get("separate_reasoning", True):
            reasoning, text = _split_reasoning(text)
        tool_calls = None
        tools = body.get("tools") or []
        if self.tool_call_parser and tools and body.get("tool_choice") != "none":
            tool_calls, text = _parse_tool_calls(text)
            if tool_calls and finish["type"] == "stop":
                finish = {"type": "tool_calls", "matched": None}
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text or "",
                "tool_calls": tool_calls,
                "reasoning_content": reasoning or None,
            },
            "logprobs": _openai_logprobs(self.tokenizer, meta) if body.get("logprobs") else None,
            "finish_reason": finish["type"],
            "matched_stop": finish.get("matched"),
        }
        if body.get("return_meta_info"):
            choice["meta_info"] = meta
        response = {
            "id": meta["id"],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "default"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(input_ids),
                "completion_tokens": meta["completion_tokens"],
                "total_tokens": len(input_ids) + meta["completion_tokens"],
            },
            "metadata": {"weight_version": self.weight_version},
        }
        record.update(status=200, finish_reason=finish["type"], tool_calls=bool(tool_calls))
        return 200, response, record


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """Qwen3 reasoning parser: the ``<think>`` block out of the text (truncated: all of it)."""
    if "<think>" not in text:
        return None, text
    body = text.split("<think>", 1)[1]
    if "</think>" not in body:
        return body, ""
    reasoning, normal = body.split("</think>", 1)
    return reasoning, normal


def _parse_tool_calls(text: str) -> tuple[list[dict[str, Any]] | None, str]:
    """Qwen2.5/3 tool-call parser: ``<tool_call>\\n{json}\\n</tool_call>`` blocks."""
    start = "<tool_call>\n"
    if start not in text:
        return None, text
    normal = text[: text.find(start)].strip()
    calls = []
    for body in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL):
        try:
            parsed = json.loads(body.strip())
        except json.JSONDecodeError:
            continue
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "index": len(calls),
                "type": "function",
                "function": {
                    "name": parsed.get("name"),
                    "arguments": json.dumps(parsed.get("arguments", {}), ensure_ascii=False),
                },
            }
        )
    return (calls or None), normal


def _openai_logprobs(tokenizer: Any, meta: dict[str, Any]) -> dict[str, Any]:
    content = []
    for logprob, token_id, _ in meta["output_token_logprobs"]:
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        content.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode()),
                "top_logprobs": [],
            }
        )
    return {"content": content}


def _error(message: str, code: int) -> dict[str, Any]:
    kind = "BadRequestError" if code == 400 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


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
    ) -> None:
        self.model = model
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
                    self._send(400, _error(f"invalid JSON: {e}", 400))
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

        self.server = ThreadingHTTPServer((host, port), Handler)
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
        return 404, _error(f"no route {path}", 404)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        m = self.model
        if path in ("/flush_cache", "/abort_request", "/pause_generation", "/continue_generation"):
            return 200, {"success": True}
        if path == "/update_weight_version":
            m.weight_version = str(body["new_version"])
            return 200, {"success": True, "message": f"weight_version {m.weight_version}"}
        if path == "/generate":
            ids = body.get("input_ids")
            if ids is None:
                ids = m.tokenizer.encode(str(body.get("text", "")), add_special_tokens=False).ids
            max_new = (body.get("sampling_params") or {}).get("max_new_tokens")
            if error := m.context_error(len(ids), max_new):
                return 400, _error(error, 400)
            budget = max_new if max_new is not None else m.context_length - len(ids)
            return 200, m.generate(m.raw_reply("solve", 0, budget), len(ids), budget)
        if path in ("/v1/chat/completions", "/chat/completions"):
            status, response, record = m.chat(body)
            self._note(record)
            return status, response
        return 404, _error(f"no route {path}", 404)

    def _note(self, record: dict[str, Any]) -> None:
        if self.record is None:
            return
        record["weight_version"] = self.model.weight_version
        with self._write, self.record.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def start(self) -> Engine:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rescue.rehearsal.engine", description=__doc__)
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
    a = p.parse_args(argv)
    try:
        model = Model(
            Path(a.model_path),
            tool_call_parser=a.tool_call_parser,
            reasoning_parser=a.reasoning_parser,
            context_length=a.context_length,
            mixture=tuple(x for x in a.mixture.split(",") if x),
        )
    except ValueError as e:
        p.error(str(e))
    engine = Engine(
        model, port=a.port, base_gpu_id=a.base_gpu_id, tp_size=a.tp_size, record=a.record
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"engine ready on 127.0.0.1:{engine.port}", flush=True)
    engine.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
