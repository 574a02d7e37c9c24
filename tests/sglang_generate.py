"""A stand-in SGLang ``/generate`` server on 127.0.0.1 and a tiny chat tokenizer for it.

``GenerateServer`` answers as SGLang's HTTP server does (``http_server.py``,
``tokenizer_manager.py``, ``schedule_batch.py``):

- ``GET /health`` 200;
- ``POST /generate`` with ``input_ids`` and ``sampling_params``: ``{"text", "output_ids",
  "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
  "cached_tokens", "weight_version", "e2e_latency"}}``. The finish reason is checked as
  ``Req.check_finished`` does, the length first: once ``max_new_tokens`` tokens are out it is
  ``{"type": "length", "length": max_new_tokens}`` (even when the last one is the stop token),
  else ``{"type": "stop", "matched": EOS}`` with the stop token counted in
  ``completion_tokens``;
- a request that does not fit the context (``prompt + max_new_tokens > context_length``) is
  an HTTP 400 ``{"error": {"message": ...}}`` with SGLang's message.

The model: the ``k``-th request for a given prompt (counted per prompt, so the order of
concurrent requests does not matter) has a natural length ``lengths(prompt_ids, k)``
(stop token included). ``fail_after`` makes every request after that many an HTTP 400;
``delay_s`` holds every answer that long; ``most_in_flight`` counts the most requests
served at once.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

EOS = 2


class _Server(ThreadingHTTPServer):
    request_queue_size = 2048  # uvicorn's backlog: concurrent clients are queued, not reset


class GenerateServer:
    def __init__(
        self,
        lengths: Callable[[Sequence[int], int], int],
        *,
        context_length: int = 40960,
        fail_after: int | None = None,
    ) -> None:
        self.lengths = lengths
        self.context_length = context_length
        self.fail_after = fail_after
        self.seen: Counter[tuple[int, ...]] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.delay_s = 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200 if self.path == "/health" else 404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/generate":
                    self._send(404, {"detail": "Not Found"})
                    return
                with server.lock:
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    if server.delay_s:
                        threading.Event().wait(server.delay_s)
                    answer = server.generate(body)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                with contextlib.suppress(OSError):  # the client gave up (its timeout)
                    self._send(*answer)

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def generate(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        ids = list(body["input_ids"])
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128))
        with self.lock:
            self.requests.append(body)
            if self.fail_after is not None and len(self.requests) > self.fail_after:
                return 400, {"error": {"message": "The engine is shutting down"}}
            k = self.seen[tuple(ids)]
            self.seen[tuple(ids)] += 1
        total = len(ids) + max_new
        if total > self.context_length:
            return 400, {
                "error": {
                    "message": "Requested token count exceeds the model's maximum context length "
                    f"of {self.context_length} tokens. You requested a total of {total} tokens: "
                    f"{len(ids)} tokens from the input messages and {max_new} tokens for the "
                    "completion. Please reduce the number of tokens in the input messages or "
                    "the completion to fit within the limit."
                }
            }
        natural = self.lengths(ids, k)
        if natural >= max_new:
            out = [7] * max_new
            finish: dict[str, Any] = {"type": "length", "length": max_new}
        else:
            out = [7] * (natural - 1) + [EOS]
            finish = {"type": "stop", "matched": EOS}
        return 200, {
            "text": " ".join("w" for _ in out if _ != EOS),
            "output_ids": out,
            "meta_info": {
                "id": f"req-{len(self.requests)}",
                "finish_reason": finish,
                "prompt_tokens": len(ids),
                "weight_version": "default",
                "completion_tokens": len(out),
                "cached_tokens": 0,
                "e2e_latency": 0.01,
            },
        }

    def __enter__(self) -> GenerateServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(folder: Path, words: Sequence[str]) -> Path:
    """A word-level Hugging Face tokenizer with a ChatML template, saved to ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": EOS}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return folder
