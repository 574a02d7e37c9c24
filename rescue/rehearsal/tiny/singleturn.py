"""The single-turn rehearsal's task and its taught tiny model (q2, ``--launcher rlvr``).

The task (``task_rows``): "box the digit d", in GSM8K's schema (``question``, ``answer``
ending ``#### d``), so ``rescue rlvr prepare --dataset gsm8k`` turns it into the launcher's
prompt rows (the question plus the request for a ``\\boxed{}`` answer, label ``d``) and
Miles' ``math`` grader scores it, as on the cluster.

The teacher (``teacher_reply``): a few words of reasoning, their number drawn from a
geometric distribution of mean ``MEAN_WORDS``, then ``so the answer is \\boxed{a}.``, with
``a`` the prompt's digit with probability ``RIGHT`` and another digit otherwise. The taught
model (``build``: ``rescue.rehearsal.tiny.teach``) samples its own replies from what it learned:
their lengths spread over tens of tokens, so a length cap truncates some of them (the
calibration measures that rate on the model itself) and the rest are right or wrong. Every
group then holds solved, wrong and truncated responses: the budget arms' inputs.

``python -m rescue.rehearsal.tiny.singleturn --out DIR --template JINJA [--seed 1]`` writes the
model folder (tokenizer, config, taught weights, ``teaching.json``); ``--rows FILE`` writes
the task's rows instead.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

#: Phrasings of the question (d is the digit).
QUESTIONS = (
    "Box the digit {d}.",
    "Write the digit {d} in a box.",
    "Which digit is {d}? Put it in a box.",
    "Here is a digit: {d}. Repeat it inside a box.",
)
#: The teacher's words of reasoning.
WORDS = (
    "let", "me", "think", "about", "the", "digit", "first", "then", "check", "it", "again",
    "carefully", "and", "so", "we", "see", "that", "this", "is", "clear", "now", "look",
)  # fmt: skip
#: Mean number of words before the answer (geometric): replies of about 5 to 80 tokens.
MEAN_WORDS = 20
#: The teacher's chance of writing the prompt's own digit.
RIGHT = 0.6
#: Responses taught per prompt digit and phrasing.
PER_PROMPT = 24


def task_rows(n: int = 40, seed: int = 0) -> list[dict[str, str]]:
    """``n`` questions in GSM8K's schema, digits and phrasings drawn from ``seed``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        d = rng.randrange(10)
        rows.append({"question": rng.choice(QUESTIONS).format(d=d), "answer": f"#### {d}"})
    return rows


def teacher_reply(rng: random.Random, digit: int) -> str:
    """One reply of the teacher (module docstring)."""
    words = []
    while rng.random() > 1 / MEAN_WORDS:
        words.append(rng.choice(WORDS))
    answer = digit if rng.random() < RIGHT else rng.choice([x for x in range(10) if x != digit])
    return " ".join([*words, f"so the answer is \\boxed{{{answer}}}."])


def corpus() -> tuple[str, ...]:
    """Text the tiny tokenizer learns its merges from (the task's words and prompts)."""
    from rescue.rlvr.data import PROMPT_SUFFIX

    return (
        *(q.format(d=d) + PROMPT_SUFFIX for q in QUESTIONS for d in range(10)),
        " ".join(WORDS) + " so the answer is \\boxed{7}.",
    )


def examples(model_dir: Path, seed: int) -> list[Any]:
    """The teaching examples: every phrasing and digit, ``PER_PROMPT`` replies each, the
    prompt rendered as Miles renders it (``rescue.rlvr.calibrate.encode_prompts``)."""
    from tokenizers import Tokenizer

    from rescue.rehearsal.tiny.teach import Example
    from rescue.rlvr.calibrate import encode_prompts
    from rescue.rlvr.data import PROMPT_SUFFIX

    rng = random.Random(seed)
    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|im_end|>")
    cases = [(q, d) for q in QUESTIONS for d in range(10)]
    prompts = encode_prompts(
        str(model_dir),
        [[{"role": "user", "content": q.format(d=d) + PROMPT_SUFFIX}] for q, d in cases],
    )
    out = []
    for (_, d), prompt in zip(cases, prompts, strict=True):
        for _ in range(PER_PROMPT):
            reply = tokenizer.encode(teacher_reply(rng, d), add_special_tokens=False).ids
            out.append(Example(tuple(prompt), (*reply, eos)))
    return out


def build(out: Path, template: str, seed: int, *, steps: int = 300) -> dict[str, Any]:
    """The taught model in ``out`` (tokenizer, config, weights, ``teaching.json``)."""
    from rescue.rehearsal.tiny.teach import teach
    from rescue.rehearsal.tiny.tokenizer import build_model_dir

    folder = build_model_dir(Path(out), template, vocab_size=768, corpus=corpus())
    facts = teach(folder, examples(folder, seed), seed=seed, steps=steps)
    facts.update(task="single-turn: box the digit", mean_words=MEAN_WORDS, right=RIGHT)
    (folder / "teaching.json").write_text(json.dumps(facts, indent=1))
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rescue.rehearsal.tiny.singleturn", description=__doc__
    )
    p.add_argument("--out", required=True, help="the model folder, or the rows file with --rows")
    p.add_argument("--template", default=None, help="the chat template (a .jinja file)")
    p.add_argument("--seed", type=int, default=1, help="teaching seed (default 1)")
    p.add_argument("--steps", type=int, default=300, help="teaching steps (default 300)")
    p.add_argument("--rows", type=int, default=0, help="write this many task rows instead")
    a = p.parse_args(argv)
    if a.rows:
        rows = task_rows(a.rows, a.seed)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{len(rows)} rows of the single-turn task in {a.out}")
        return 0
    if not a.template or not Path(a.template).is_file():
        p.error(f"--template={a.template!r}; allowed: a chat template file (.jinja)")
    facts = build(Path(a.out), Path(a.template).read_text(), a.seed, steps=a.steps)
    print(f"taught model in {a.out}: {json.dumps(facts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
