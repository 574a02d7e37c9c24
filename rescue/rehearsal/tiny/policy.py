"""The tiny policy the stand-in engine serves: a Qwen3 of a few layers, on the CPU.

``write_checkpoint(folder, seed)`` writes a Hugging Face checkpoint of the architecture in
``folder/config.json`` (``rescue.rehearsal.tiny.tokenizer.build_model_dir`` writes it), randomly
initialized from ``seed``: ``model.safetensors``. ``Policy`` loads it with transformers and
answers what SGLang computes for one request:

- ``score(prompt, output, k)``: the log-prob of each output token under the policy (the
  distribution at temperature 1, as SGLang reports it) and the top-``k`` heads of that
  distribution at every output position, in one forward pass;
- ``sample(prompt, max_new, eos, ...)``: tokens drawn from the policy until ``eos`` or
  ``max_new`` (with their log-probs and heads);
- ``load(named)``: weights received by name (Hugging Face names, as Miles' weight update
  sends them), each checked against the parameter's shape; an unknown name is an error, as
  in SGLang's loader. ``digest(named)`` is a SHA-256 of names, dtypes, shapes and bytes in
  name order, which the trainer's side of the rehearsal computes on what it sends.

Weights live in float32 whatever dtype arrives (bfloat16 from a bf16 trainer upcasts exactly);
generation runs under ``torch.inference_mode`` behind a lock that ``load`` also takes, so a
reply is computed with one version of the weights.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Token prefixes whose model cache ``Policy`` keeps (a group's trajectories at once).
PREFIXES = 32


def digest(named: Iterable[tuple[str, Any]]) -> str:
    """SHA-256 of ``(name, tensor)`` pairs in name order: name, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda kv: kv[0]):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(_byte_dtype()).numpy().tobytes())
    return h.hexdigest()


def _byte_dtype() -> Any:
    import torch

    return torch.uint8


def write_checkpoint(folder: Path, seed: int) -> Path:
    """``folder/model.safetensors``: the architecture of ``folder/config.json`` with weights
    drawn from ``seed`` (transformers' own initialization)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    return folder / "model.safetensors"


class Policy:
    """The tiny model behind the stand-in engine."""

    def __init__(self, model_path: Path, *, seed: int = 0, threads: int = 1) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.set_num_threads(threads)
        path = Path(model_path)
        config = AutoConfig.from_pretrained(path)
        if (path / "model.safetensors").exists():
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        else:
            torch.manual_seed(seed)
            self.model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        self.model.eval()
        # transformers 5 names the cache ``cache``, 4 ``past_key_values`` (both in and out)
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        self.vocab = int(config.vocab_size)
        self._params = dict(self.model.named_parameters())
        self._lock = threading.Lock()
        self._generator = torch.Generator().manual_seed(seed)
        #: token ids -> the model's cache after them (most recent last); the weights they
        #: were computed with are the current ones (``load`` empties it)
        self._prefixes: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    # ── weights ──────────────────────────────────────────────────────────────────────

    def load(self, named: Iterable[tuple[str, Any]]) -> list[str]:
        """Copy ``(name, tensor)`` pairs into the parameters; returns the names loaded."""
        import torch

        loaded = []
        with self._lock, torch.no_grad():
            for name, tensor in named:
                target = self._params.get(name)
                if target is None:
                    raise KeyError(f"weight {name!r} is not a parameter of the served model")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"weight {name!r}: shape {tuple(tensor.shape)} sent, the model has "
                        f"{tuple(target.shape)}"
                    )
                target.copy_(tensor.to(target.dtype))
                loaded.append(name)
            self._prefixes.clear()
        return loaded

    def state_digest(self) -> str:
        return digest(self._params.items())

    # ── generation ───────────────────────────────────────────────────────────────────

    def _logprobs(self, ids: list[int], start: int) -> Any:
        """Log-softmax of the next-token logits at positions ``start ..`` of ``ids``.

        SGLang's radix cache, in small: the longest cached prefix of ``ids`` (no longer than
        ``start``) is reused, so a turn of a trajectory runs only its new tokens; the cache
        after ``ids`` is kept for the next turn (``PREFIXES`` entries, least recent dropped).
        """
        import copy

        import torch

        best: tuple[int, ...] = ()
        for key in self._prefixes:
            if len(best) < len(key) <= len(ids) and tuple(ids[: len(key)]) == key:
                best = key
        reuse = min(len(best), start)
        cache = None
        if reuse:
            cache = copy.deepcopy(self._prefixes[best])
            if reuse < len(best):
                cache.crop(reuse - len(best))  # a negative count removes, in every version
        x = torch.tensor([ids[reuse:]], dtype=torch.long)
        out = self.model(input_ids=x, **{self._cache_arg: cache}, use_cache=True)
        self._prefixes[tuple(ids)] = getattr(out, self._cache_arg)
        self._prefixes.move_to_end(tuple(ids))
        while len(self._prefixes) > PREFIXES:
            self._prefixes.popitem(last=False)
        return torch.log_softmax(out.logits[0].float(), dim=-1)[start - reuse :]

    def score(
        self, prompt: list[int], output: list[int], top_k: int = 0
    ) -> tuple[list[float], list[list[tuple[float, int]]]]:
        """Log-prob of each ``output`` token after ``prompt``, and the top-``top_k`` heads."""
        import torch

        if not output:
            return [], []
        with self._lock, torch.inference_mode():
            lp = self._logprobs([*prompt, *output], len(prompt) - 1)[: len(output)]
        chosen = lp.gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1).tolist()
        return chosen, _heads(lp, top_k)

    def sample(
        self,
        prompt: list[int],
        max_new: int,
        *,
        eos: int | None,
        temperature: float = 1.0,
        top_k: int = 0,
    ) -> tuple[list[int], list[float], list[list[tuple[float, int]]]]:
        """Tokens drawn from the policy at ``temperature`` (SGLang's sampler without top-p
        or top-k truncation), their log-probs and heads; stops after ``eos`` or ``max_new``."""
        import torch

        ids, logprobs, rows = list(prompt), [], []
        with self._lock, torch.inference_mode():
            past = None
            step_input = torch.tensor([ids], dtype=torch.long)
            for _ in range(max_new):
                out = self.model(input_ids=step_input, **{self._cache_arg: past}, use_cache=True)
                past = getattr(out, self._cache_arg)
                logits = out.logits[0, -1].float() / max(temperature, 1e-6)
                lp = torch.log_softmax(logits, dim=-1)
                token = int(torch.multinomial(lp.exp(), 1, generator=self._generator))
                ids.append(token)
                logprobs.append(float(lp[token]))
                rows.append(lp)
                step_input = torch.tensor([[token]], dtype=torch.long)
                if token == eos:
                    break
        heads = _heads(torch.stack(rows), top_k) if rows else []
        return ids[len(prompt) :], logprobs, heads


def _heads(lp: Any, k: int) -> list[list[tuple[float, int]]]:
    """Per row of log-probs ``lp`` ``[n, V]``, the ``k`` most likely (log-prob, id), in order."""
    import torch

    if k <= 0:
        return []
    values, ids = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)
    return [
        list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)
    ]
