"""Teach the tiny model a task before a rehearsal trains it: a few hundred supervised steps.

A tiny Qwen3 drawn at random spreads its next-token probability almost evenly over its
vocabulary: its end-of-turn token has probability about 1/V at every position, so it never
ends a reply within a cap, never writes an answer a grader accepts and never names an
admissible action. Trained as drawn, every single-turn response would be truncated and
scored 0 and every text game capped: the arms would train on rewards that are all zero,
with nothing to tell them apart. So the single-turn and text-game rehearsals first teach
the model their task, as a pretrained model arrives knowing its format:

``teach(model_dir, examples, seed=...)`` draws the architecture of ``model_dir/config.json``
from ``seed`` (transformers' own initialization), trains it with AdamW on the reply tokens
of ``examples`` (cross-entropy on the reply and its end of turn, the prompt as context
only), rounds every weight to bfloat16 (the trainer's dtype, so the engine, the
calibration and Miles' trainer hold exactly the same numbers) and writes
``model_dir/model.safetensors``. It returns the teaching's figures (loss before and after,
steps, examples), which the task's module records.

What a task teaches is a distribution, not an answer: the examples are drawn from a seeded
teacher whose replies vary (lengths, right and wrong answers, actions), and the taught
model samples its own replies from what it learned, so each step's groups hold a spread of
outcomes. ``rescue.rehearsal.tiny.singleturn`` and ``rescue.rehearsal.tiny.textgames`` hold the two
teachers. torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Example:
    """One teaching example: prompt ids (context) and reply ids (learned, end of turn last)."""

    prompt: tuple[int, ...]
    reply: tuple[int, ...]


def _batch(examples: Sequence[Example], pad: int) -> tuple[Any, Any, Any]:
    """Right-padded ids, attention mask and labels (-100 off the reply)."""
    import torch

    width = max(len(e.prompt) + len(e.reply) for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for i, e in enumerate(examples):
        row = [*e.prompt, *e.reply]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, len(e.prompt) : len(row)] = torch.tensor(e.reply)
    return ids, mask, labels


def teach(
    model_dir: Path,
    examples: Sequence[Example],
    *,
    seed: int,
    steps: int = 300,
    batch: int = 16,
    lr: float = 3e-3,
    threads: int = 2,
) -> dict[str, Any]:
    """Teach the model of ``model_dir`` the ``examples`` and save it (module docstring)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    if not examples:
        raise ValueError("teach: no example to learn from")
    torch.set_num_threads(threads)
    folder = Path(model_dir)
    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    pad = int(config.bos_token_id if config.bos_token_id is not None else 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    warmup = max(1, steps // 10)
    for step in range(steps):
        for group in optimizer.param_groups:  # warm-up, then cosine to a tenth
            done = max(0.0, (step - warmup) / max(1, steps - warmup))
            group["lr"] = (
                lr * min(1.0, (step + 1) / warmup) * (0.55 + 0.45 * math.cos(math.pi * done))
            )
        ids, mask, labels = _batch(rng.sample(list(examples), min(batch, len(examples))), pad)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    head = sum(losses[: max(1, steps // 20)]) / max(1, steps // 20)
    tail = sum(losses[-max(1, steps // 20) :]) / max(1, steps // 20)
    return {"steps": steps, "examples": len(examples), "loss_first": head, "loss_last": tail}
