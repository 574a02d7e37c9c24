"""The stand-in engine's model: a scripted SWE policy and SGLang 0.5.x's reply shaping.

``Model.chat(body)`` answers one ``/v1/chat/completions`` request the way SGLang does
(``serving_chat.py``, ``tokenizer_manager.py``, ``qwen25_detector.py``,
``reasoning_parser.py`` in 0.5.23); ``rescue.rehearsal.standins.engine`` serves it over HTTP. See
the engine's docstring for the behaviours and the failure modes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from rescue.rehearsal.standins.tasks import FIX, MAKE_PATCH, RUN_TESTS, SUBMIT, WRONG_FIX

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
#: The log-prob the model gives each token it emits.
SAMPLED_LOGPROB = -0.5


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
        policy: Any = None,
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
        #: ``rescue.rehearsal.tiny.policy.Policy``: log-probs and heads from the tiny model (and
        #: ``/generate`` sampled from it); None: the fixed ``SAMPLED_LOGPROB`` (shaping tests)
        self.policy = policy
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

    def generate(
        self, text: str, prompt: list[int], max_new_tokens: int, top_logprobs_num: int = 0,
        with_text: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Output ids, decoded text and ``meta_info`` of one generation of ``text`` after the
        ``prompt`` ids.

        The ids are ``text`` tokenized, then end of turn, cut at ``max_new_tokens``. Their
        log-probs are the policy's (``policy.score``: one forward pass of the tiny model over
        prompt and output), or ``SAMPLED_LOGPROB`` without a policy. With
        ``top_logprobs_num`` > 0, ``meta_info.output_top_logprobs`` holds, per output position,
        the ``top_logprobs_num`` most likely ``[logprob, id, text]`` in decreasing order of the
        same distribution (SGLang's ``detokenize_top_logprobs_tokens``; ``text`` None unless
        ``with_text``, as chat asks).
        """
        ids = [*self.tokenizer.encode(text, add_special_tokens=False).ids, self._eos]
        if len(ids) > max_new_tokens:
            ids = ids[:max_new_tokens]
            finish: dict[str, Any] = {"type": "length", "length": max_new_tokens}
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        else:
            finish = {"type": "stop", "matched": self._eos}
        if self.policy is not None:
            chosen, heads = self.policy.score(list(prompt), ids, top_logprobs_num)
        else:
            chosen = [SAMPLED_LOGPROB] * len(ids)
            heads = [self._head(i, top_logprobs_num) for i in ids] if top_logprobs_num else []
        return self._output(text, ids, chosen, heads, finish, len(prompt), with_text)

    def sample(
        self, prompt: list[int], max_new_tokens: int, temperature: float,
        top_logprobs_num: int = 0, with_text: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """One ``/generate`` drawn from the policy (needs one): tokens until end of turn or
        ``max_new_tokens`` (``finish_reason`` ``length``)."""
        ids, chosen, heads = self.policy.sample(
            list(prompt), max_new_tokens, eos=self._eos, temperature=temperature,
            top_k=top_logprobs_num,
        )  # fmt: skip
        if ids and ids[-1] == self._eos:
            finish: dict[str, Any] = {"type": "stop", "matched": self._eos}
        else:
            finish = {"type": "length", "length": max_new_tokens}
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return self._output(text, ids, chosen, heads, finish, len(prompt), with_text)

    def _output(
        self, text: str, ids: list[int], chosen: list[float], heads: list, finish: dict,
        n_input: int, with_text: bool,
    ) -> dict[str, Any]:  # fmt: skip
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": n_input,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "output_token_logprobs": [[lp, i, None] for lp, i in zip(chosen, ids, strict=True)],
            "weight_version": self.weight_version,
            "e2e_latency": 0.0,
        }
        if heads:
            meta["output_top_logprobs"] = [
                [
                    [
                        lp,
                        t,
                        self.tokenizer.decode([t], skip_special_tokens=False)
                        if with_text
                        else None,
                    ]
                    for lp, t in row
                ]
                for row in heads
            ]
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def _head(self, token: int, k: int) -> list[tuple[float, int]]:
        """Without a policy: the top ``k`` of a distribution giving ``token`` the sampled
        log-prob and the rest of the head equal shares of half the remaining mass (so the
        tail holds mass)."""
        vocab = self.tokenizer.get_vocab_size()
        others = [(token + j) % vocab for j in range(1, min(k, vocab))]
        rest = math.log((1 - math.exp(SAMPLED_LOGPROB)) / 2 / max(1, len(others)))
        return [(SAMPLED_LOGPROB, token)] + [(rest, t) for t in others]

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
            return 400, error_body(error, 400), record
        budget = max_new if max_new is not None else self.context_length - len(input_ids)
        # SGLang's chat: top_logprobs_num=request.top_logprobs, return_text_in_logprobs=True;
        # nothing of it without logprobs (return_logprob=request.logprobs)
        top = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
        out = self.generate(
            self.raw_reply(behaviour, turn, budget), input_ids, budget, top, with_text=True
        )
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
    """``choices[0].logprobs``: token strings, not ids (``_build_token_logprobs_from_raw``)."""

    def entry(logprob: float, token_id: int) -> dict[str, Any]:
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    tops = meta.get("output_top_logprobs") or [None] * len(meta["output_token_logprobs"])
    content = []
    for (logprob, token_id, _), top in zip(meta["output_token_logprobs"], tops, strict=True):
        heads = [entry(lp, t) for lp, t, *_ in top] if top else []
        content.append({**entry(logprob, token_id), "top_logprobs": heads})
    return {"content": content}


def error_body(message: str, code: int) -> dict[str, Any]:
    kind = "BadRequestError" if code == 400 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}
