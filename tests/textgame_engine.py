"""A stand-in SGLang engine whose replies come from a scripted player of real text games,
and a byte-level chat tokenizer for it.

``PolicyServer`` answers as SGLang's HTTP server does (``http_server.py``,
``tokenizer_manager.py``, ``schedule_batch.py``; the fields Miles reads in
``update_sample_from_response`` and ``Sample.update_from_meta_info``):

- ``POST /generate`` with ``input_ids`` and ``sampling_params``: ``{"text", "output_ids",
  "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
  "output_token_logprobs", "weight_version", ...}}``, ``output_token_logprobs`` a list of
  ``[logprob, token_id, None]`` (``return_logprob``). The reply's tokens end with the stop
  token, counted in ``completion_tokens``, unless ``max_new_tokens`` runs out first: then
  ``{"type": "length", "length": max_new_tokens}`` (the length is checked first, as
  ``Req.check_finished`` does). ``text`` is the reply without the stop token.
- a request that does not fit the context (``prompt + max_new_tokens > context_length``)
  is an HTTP 400 with SGLang's message;
- as the router in front of it: ``GET /workers`` lists this one engine
  (``{"workers": [{"url"}]}``, what Miles' ``get_worker_urls`` reads from sglang-router
  0.3), ``POST /abort_request`` answers 200 (Miles aborts what is left at the end of a
  step), ``GET /health`` 200.

The player: Miles sends each rollout's routing key as ``X-SMG-Routing-Key``
(``compute_routing_headers``); a test sets it to ``"<script>|<game file>|<n>"``, so the
server knows what to play. It reads the step number and the admissible actions from the
prompt (decoded from ``input_ids``), the game's walkthrough from the game's ``.json``
(``tw-make``'s metadata), and replies ``<think>...</think><action>...</action>``:

- ``win``: the walkthrough;
- ``lose``: the walkthrough, until an ``eat <ingredient>`` other than the meal is
  admissible, which it eats (TextWorld's cooking games fail on an eaten ingredient);
- ``cap``: ``look``, for ever;
- ``invalid``: two invalid replies first (no tags at all, then an action tag without the
  think tags), then the walkthrough;
- ``abort``: SGLang's abort (``finish_reason`` ``abort``, what Miles' weight update does to
  requests in flight) at the second step;
- ``fail``: HTTP 500 from the second step on (an engine that died).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

IM_START, EOS = 1, 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_STEP = re.compile(r"You are now at step (\d+) ")
_ADMISSIBLE = re.compile(r"admissible actions of the current situation are: \[(.*?)\]\.\n", re.S)


def write_tokenizer(folder: Path) -> Path:
    """A byte-level Hugging Face tokenizer (one token per byte, so any text round-trips)
    with a ChatML template, saved to ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"[UNK]": 0, "<|im_start|>": IM_START, "<|im_end|>": EOS}
    for ch in sorted(alphabet):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return folder


def walkthrough(game: str) -> list[str]:
    """The walkthrough tw-make stored with a cooking game."""
    return json.loads(Path(game).with_suffix(".json").read_text())["metadata"]["walkthrough"]


def admissible_of(prompt: str) -> list[str]:
    """The admissible actions a step's prompt lists."""
    found = _ADMISSIBLE.search(prompt)
    return re.findall(r"'([^']*)'", found.group(1)) if found else []


def reply(script: str, game: str, prompt: str) -> str | None:
    """The player's reply to a step's prompt (``None``: the engine fails or aborts)."""
    m = _STEP.search(prompt)
    step = int(m.group(1)) if m else 1
    admissible = admissible_of(prompt)
    plan = walkthrough(game)
    if script in ("abort", "fail") and step >= 2:
        return None
    if script == "cap":
        action = "look"
    elif script == "invalid" and step <= 2:
        return "I will look around first." if step == 1 else "<action>look</action>"
    else:
        done = step - 1 - (2 if script == "invalid" else 0)
        action = plan[min(done, len(plan) - 1)]
        if script == "lose":
            eat = [a for a in admissible if a.startswith("eat ") and a != "eat meal"]
            action = eat[0] if eat else action
    return f"<think>step {step}: {action} is next.</think>\n<action>{action}</action>"


class PolicyServer:
    """SGLang's ``/generate`` on 127.0.0.1 with the scripted player (module docstring)."""

    def __init__(self, tokenizer: Any, *, context_length: int = 1 << 20) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.requests: list[dict[str, Any]] = []
        self.aborts = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/workers":
                    self._send(200, {"workers": [{"url": f"http://127.0.0.1:{server.port}"}]})
                else:
                    self._send(200 if self.path == "/health" else 404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/abort_request":
                    server.aborts += 1
                    self._send(200, {})
                    return
                key = self.headers.get("X-SMG-Routing-Key") or ""
                self._send(*server.generate(body, key))

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        class _Server(ThreadingHTTPServer):
            request_queue_size = 1024

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]

    def generate(self, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
        ids = list(body["input_ids"])
        max_new = int((body.get("sampling_params") or {}).get("max_new_tokens", 128))
        with self.lock:
            self.requests.append({"key": key, "prompt_tokens": len(ids), "max_new": max_new})
            n = len(self.requests)
        if len(ids) + max_new > self.context_length:
            return 400, {
                "error": {
                    "message": "Requested token count exceeds the model's maximum context length "
                    f"of {self.context_length} tokens."
                }
            }
        script, game, _ = key.split("|")
        text = reply(script, game, self.tokenizer.decode(ids))
        meta: dict[str, Any] = {"id": f"req-{n}", "prompt_tokens": len(ids), "weight_version": "0"}
        if text is None and script == "fail":
            return 500, {"error": {"message": "engine died"}}
        if text is None:  # abort: no token generated
            meta.update(
                finish_reason={"type": "abort"}, completion_tokens=0, output_token_logprobs=[]
            )
            return 200, {"text": "", "output_ids": [], "meta_info": meta}
        out = [*self.tokenizer.encode(text, add_special_tokens=False), EOS]
        if len(out) > max_new:
            out = out[:max_new]
            finish: dict[str, Any] = {"type": "length", "length": max_new}
        else:
            finish = {"type": "stop", "matched": EOS}
        meta.update(
            finish_reason=finish,
            completion_tokens=len(out),
            cached_tokens=0,
            output_token_logprobs=[[-0.5, t, None] for t in out],
        )
        shown = out[:-1] if finish["type"] == "stop" else out
        return 200, {
            "text": self.tokenizer.decode(shown),
            "output_ids": out,
            "meta_info": meta,
        }

    def __enter__(self) -> PolicyServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
