"""The length cap of the single-turn arms: the smallest candidate whose truncation rate at
initialization lies in the window.

Specification
-------------
``calibrate`` samples the initial policy ``n`` times on each of ``prompts`` prompts of the
prepared JSONL (a random sample, seed ``seed``) through an SGLang server's ``/generate``, the
way Miles' rollout does: the prompt rendered with the checkpoint's chat template
(``add_generation_prompt=True``, as ``--apply-chat-template``), encoded without special
tokens, and Miles' default sampling parameters (``temperature``, ``top_p`` 1, ``top_k`` -1,
``no_stop_trim``, ``skip_special_tokens`` false).

One pass at the largest candidate cap ``C`` measures every candidate: the first ``c`` tokens
of a response sampled under cap ``C`` are distributed as a response sampled under cap ``c``,
and under cap ``c`` SGLang reports ``finish_reason`` ``length`` (Miles' ``TRUNCATED``) for a
response of at least ``c`` tokens (it checks the length before the stop token, so a stop
token that is exactly the ``c``-th token reports ``length`` too). So a response of ``k``
output tokens (``meta_info.completion_tokens``) is truncated at ``c`` when ``k >= c``, and one
cut at ``C`` (``length``) is truncated at every candidate. Sharing the samples also makes
the rates non-increasing in the cap.

The rate at each cap is the mean over prompts of their truncated fraction; its 95% interval
is Student's t over prompts (``prompts - 1`` degrees of freedom: the ``n`` responses of one
prompt are not independent). The chosen cap is the smallest candidate whose rate lies in
``[low, high]``; when none does, ``NoCapInWindow`` carries every rate and nothing is written.

A request SGLang refuses (an HTTP error), an ``abort`` finish reason, or an unreadable reply
is an ``EngineError`` naming the prompt: a fault of the server is never counted as a length.
A connection that fails (refused, reset) is tried again ``CONNECT_ATTEMPTS`` times in all.
"""

from __future__ import annotations

import json
import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rescue.errors import InputError


class EngineError(RuntimeError):
    """The engine failed a request (HTTP error, abort, or a reply without a finish reason)."""


@dataclass(frozen=True)
class CapRate:
    """The truncation rate at one cap, with its 95% interval over prompts."""

    cap: int
    rate: float
    low: float
    high: float


class NoCapInWindow(InputError):
    """No candidate cap's truncation rate lies in the window; ``rates`` has them all."""

    def __init__(self, rates: Sequence[CapRate], window: tuple[float, float]) -> None:
        self.rates = list(rates)
        self.window = window
        super().__init__(
            f"no candidate cap has a truncation rate in [{window[0]}, {window[1]}]:\n"
            + render_rates(self.rates, window)
            + "\nset CAL_CAPS to caps between the last one above the window and the first "
            "one below it"
        )


def render_rates(rates: Sequence[CapRate], window: tuple[float, float]) -> str:
    """One line per cap: rate, interval, and where it stands against the window."""
    lines = []
    for r in rates:
        where = (
            "in window"
            if window[0] <= r.rate <= window[1]
            else ("above" if r.rate > window[1] else "below")
        )
        lines.append(
            f"  cap {r.cap:>6}: truncated {r.rate:6.1%}  (95% CI {r.low:6.1%} .. {r.high:6.1%})  {where}"
        )
    return "\n".join(lines)


def truncation_rates(
    lengths: Sequence[Sequence[tuple[int, bool]]], caps: Sequence[int]
) -> list[CapRate]:
    """Rates at each cap from ``lengths[prompt] = [(completion_tokens, cut), ...]``.

    ``cut`` is SGLang's ``length`` finish at the largest cap (module docstring).
    """
    from scipy import stats

    per_prompt = []
    for cap in caps:
        fractions = [
            sum(1 for k, cut in responses if cut or k >= cap) / len(responses)
            for responses in lengths
        ]
        per_prompt.append(fractions)
    rates = []
    p = len(lengths)
    for cap, fractions in zip(caps, per_prompt, strict=True):
        mean = sum(fractions) / p
        if p > 1:
            sd = math.sqrt(sum((f - mean) ** 2 for f in fractions) / (p - 1))
            half = float(stats.t.ppf(0.975, p - 1)) * sd / math.sqrt(p)
        else:
            half = math.inf
        rates.append(CapRate(cap, mean, max(0.0, mean - half), min(1.0, mean + half)))
    return rates


def choose_cap(rates: Sequence[CapRate], window: tuple[float, float]) -> CapRate:
    """The smallest cap whose rate lies in ``window``; ``NoCapInWindow`` otherwise."""
    for r in sorted(rates, key=lambda r: r.cap):
        if window[0] <= r.rate <= window[1]:
            return r
    raise NoCapInWindow(rates, window)


def parse_caps(text: str) -> list[int]:
    """``"512 768 1024"`` (spaces or commas) → sorted distinct positive integers."""
    caps = []
    for word in text.replace(",", " ").split():
        if not word.isdigit() or int(word) <= 0:
            raise InputError(
                f"--caps: {word!r} is not a positive integer; e.g. --caps '512 1024 2048'"
            )
        caps.append(int(word))
    if not caps:
        raise InputError("--caps is empty; e.g. --caps '512 1024 2048'")
    return sorted(set(caps))


def read_prompts(path: str | Path, count: int, seed: int) -> list[list[dict[str, Any]]]:
    """``count`` prompts (message lists) drawn without replacement from the prepared JSONL."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--data {str(p)!r} does not exist: run make rlvr-prepare first")
    prompts = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompt = json.loads(line)["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(f"{p} line {lineno}: expected an object with a prompt") from None
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        prompts.append(prompt)
    if len(prompts) < count:
        raise InputError(f"--prompts {count}: {p} has only {len(prompts)} prompts")
    return random.Random(seed).sample(prompts, count)


def sampling_params(temperature: float, max_new_tokens: int) -> dict[str, Any]:
    """Miles' default rollout sampling parameters (``compute_sampling_params``)."""
    return {
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": max_new_tokens,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


#: Attempts of one request whose connection fails (refused, reset): the request is sent again
#: after 1, 2, ... s. An HTTP error answer is never retried.
CONNECT_ATTEMPTS = 4


def post_generate(base_url: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """POST ``/generate``; the reply, or ``EngineError`` with SGLang's message."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/generate",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            raise EngineError(f"/generate answered HTTP {e.code}: {body[:500]}") from None
        except json.JSONDecodeError as e:
            raise EngineError(f"/generate at {base_url}: a reply that is not JSON ({e})") from None
        except (urllib.error.URLError, OSError) as e:
            if attempt == CONNECT_ATTEMPTS:
                raise EngineError(
                    f"/generate at {base_url} failed {attempt} times: {type(e).__name__}: {e}"
                ) from None
            time.sleep(attempt)
    raise AssertionError("unreachable")


def response_length(reply: dict[str, Any], max_new_tokens: int) -> tuple[int, bool]:
    """``(completion_tokens, cut at max_new_tokens)`` of one ``/generate`` reply."""
    try:
        meta = reply["meta_info"]
        finish = meta["finish_reason"]["type"]
        tokens = int(meta["completion_tokens"])
    except (KeyError, TypeError, ValueError):
        raise EngineError(
            f"/generate reply without meta_info.finish_reason.type or completion_tokens: "
            f"{json.dumps(reply)[:300]}"
        ) from None
    if finish == "abort":
        message = (meta.get("finish_reason") or {}).get("message")
        raise EngineError(f"/generate aborted the request: {message}")
    if finish not in ("length", "stop"):
        raise EngineError(f"/generate finish_reason {finish!r}; expected length or stop")
    return tokens, finish == "length" or tokens >= max_new_tokens


def sample_lengths(
    prompt_ids: Sequence[Sequence[int]],
    *,
    n: int,
    max_cap: int,
    temperature: float,
    base_url: str,
    concurrency: int = 64,
    timeout: float = 3600.0,
    post: Callable[[str, dict[str, Any], float], dict[str, Any]] = post_generate,
    progress: bool = True,
) -> list[list[tuple[int, bool]]]:
    """``n`` responses per prompt at cap ``max_cap``: their lengths and whether they were cut."""

    def one(job: tuple[int, int]) -> tuple[int, tuple[int, bool]]:
        i, _ = job
        payload = {
            "input_ids": list(prompt_ids[i]),
            "sampling_params": sampling_params(temperature, max_cap),
        }
        try:
            return i, response_length(post(base_url, payload, timeout), max_cap)
        except EngineError as e:
            raise EngineError(f"prompt {i}: {e}") from None

    jobs = [(i, k) for i in range(len(prompt_ids)) for k in range(n)]
    lengths: list[list[tuple[int, bool]]] = [[] for _ in prompt_ids]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="calibration responses", unit="resp")
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for i, length in pool.map(one, jobs):
            lengths[i].append(length)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return lengths


def encode_prompts(tokenizer_path: str, prompts: Sequence[list[dict[str, Any]]]) -> list[list[int]]:
    """Prompt token ids as Miles builds them from ``--apply-chat-template`` data."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise InputError("calibration needs transformers: pip install 'rescue[rlvr]'") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=True)
    except Exception as e:
        raise InputError(
            f"--model {tokenizer_path!r}: no tokenizer ({type(e).__name__}: {e})"
        ) from None
    ids = []
    for messages in prompts:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids.append(tokenizer.encode(text, add_special_tokens=False))
    return ids


def write_cap_file(
    path: str | Path, chosen: CapRate, rates: Sequence[CapRate], **context: Any
) -> None:
    """The cap file ``rlvr-arm`` reads: the cap, every rate, and what they were measured on."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "cap": chosen.cap,
        "rate": chosen.rate,
        "rates": [vars(r) for r in rates],
        **context,
    }
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(p)


def read_cap(path: str | Path, *, model: str | None = None, data: str | None = None) -> int:
    """The cap of a cap file; refused when it was calibrated for another model or data."""
    p = Path(path)
    if not p.is_file():
        raise InputError(
            f"no cap file {p}: run make rlvr-calibrate (writes CAP_FILE), or set CAP=N"
        )
    try:
        record = json.loads(p.read_text())
        cap = int(record["cap"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise InputError(f"cap file {p}: expected a JSON object with an integer cap") from None
    for key, want in (("model", model), ("data", data)):
        have = record.get(key)
        if want is not None and have is not None and str(have) != str(want):
            raise InputError(
                f"cap file {p} was calibrated with {key} {have}, not {want}: run make "
                "rlvr-calibrate again, or set CAP=N"
            )
    if cap <= 0:
        raise InputError(f"cap file {p}: cap {cap} is not positive")
    return cap
