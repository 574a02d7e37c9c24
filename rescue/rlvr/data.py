"""GSM8K or MATH rows → Miles prompt JSONL for the single-turn arms.

Specification
-------------
Input is a Hugging Face dataset by name or a local ``.jsonl`` / ``.json`` / ``.parquet`` file
of its rows (``rescue.rows``), in one of two schemas (``DATASETS``):

``gsm8k`` (``openai/gsm8k``, config ``main``)
    ``question`` and ``answer``; the label is what follows the last ``####`` of the answer,
    with thousands separators and surrounding spaces removed (``#### 1,200`` → ``1200``).
``math`` (Hendrycks MATH, default mirror ``DigitalLearningGmbH/MATH-lighteval``)
    ``problem`` and either ``answer`` (MATH-500's layout) or ``solution``; the label is the
    ``answer`` when present, else the content of the solution's last ``\\boxed{...}`` (braces
    matched, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``).

Every input row lands in exactly one place of the ``PrepareReport``: ``written`` (one output
line), ``empty_prompt`` (no question or problem text) or ``no_label`` (no ``####`` answer, no
``answer`` and no ``\\boxed{}`` in the solution: nothing could grade it). A row that is not an
object, or a field of the wrong type, is an ``InputError`` naming the row and the field.

Each output line is ``{"prompt": [{"role": "user", "content": text + PROMPT_SUFFIX}],
"label": label, "metadata": {"dataset": name, "source": where}}`` — the layout of
``--input-key prompt --label-key label --metadata-key metadata --apply-chat-template``. The
suffix asks for the answer in ``\\boxed{}``, which is what Miles' ``math`` grader
(``--rm-type math``: ``rm_hub.math_utils.grade_answer_verl``, the grader of Miles' GSM8K
recipes) reads; the launchers pass that grader (``RM_TYPE`` in ``launch/rlvr_config.sh``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rescue.errors import InputError

#: Appended to every question: where the graders look for the answer.
PROMPT_SUFFIX = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class DatasetSchema:
    """A dataset the prepare step reads: its default source and the fields it needs."""

    name: str
    default_source: str
    default_config: str | None
    prompt_field: str


DATASETS: dict[str, DatasetSchema] = {
    "gsm8k": DatasetSchema("gsm8k", "openai/gsm8k", "main", "question"),
    "math": DatasetSchema("math", "DigitalLearningGmbH/MATH-lighteval", "default", "problem"),
}


@dataclass
class PrepareReport:
    """Where every input row went (see the module specification)."""

    source: str
    output: str
    rows: int = 0
    written: int = 0
    empty_prompt: int = 0
    no_label: int = 0

    def render(self) -> str:
        """A few lines for the terminal."""
        return (
            f"{self.source}: {self.rows} rows -> {self.written} prompts written to {self.output}\n"
            f"  skipped: {self.empty_prompt} without question text, "
            f"{self.no_label} without a gradeable answer"
        )


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text`` (braces matched), or ``None``."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def gsm8k_label(answer: str) -> str | None:
    """The final answer after GSM8K's last ``####``, without thousands separators."""
    if "####" not in answer:
        return None
    tail = answer[answer.rfind("####") :]
    m = _GSM8K_ANSWER.match(tail)
    if m is None:
        return None
    label = m.group(1).replace(",", "").strip()
    return label or None


def _text(where: str, row: Mapping[str, Any], key: str) -> str | None:
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{where}: field {key!r} is a {type(value).__name__}; expected a string")
    return value


def label_of(dataset: str, where: str, row: Mapping[str, Any]) -> str | None:
    """The row's label under ``dataset``'s schema (module docstring), or ``None``."""
    if dataset == "gsm8k":
        answer = _text(where, row, "answer")
        return gsm8k_label(answer) if answer is not None else None
    answer = _text(where, row, "answer")
    if answer is not None and answer.strip():
        return answer.strip()
    solution = _text(where, row, "solution")
    if solution is None:
        return None
    boxed = last_boxed(solution)
    return boxed.strip() if boxed is not None and boxed.strip() else None


def prompt_line(dataset: str, where: str, row: Any) -> dict[str, Any] | str | None:
    """The output line of one row, or the report bucket (``empty_prompt``, ``no_label``)."""
    if dataset not in DATASETS:
        raise InputError(f"dataset {dataset!r}; allowed: {', '.join(DATASETS)}")
    if not isinstance(row, Mapping):
        raise InputError(f"{where}: a row is a {type(row).__name__}; expected an object")
    question = _text(where, row, DATASETS[dataset].prompt_field)
    if question is None or not question.strip():
        return "empty_prompt"
    label = label_of(dataset, where, row)
    if label is None:
        return "no_label"
    return {
        "prompt": [{"role": "user", "content": question.strip() + PROMPT_SUFFIX}],
        "label": label,
        "metadata": {"dataset": dataset, "source": where},
    }


def prepare(
    dataset: str,
    out: str | Path,
    *,
    source: str | None = None,
    split: str = "train",
    config: str | None = None,
    rows: Iterable[tuple[str, Any]] | None = None,
) -> PrepareReport:
    """Write the prompt JSONL of ``dataset`` to ``out``; ``rows`` overrides reading ``source``.

    ``source`` defaults to the dataset's Hugging Face name, read with its default config
    unless ``config`` says otherwise; a local file ignores ``config``.
    """
    from rescue.rows import read_rows

    if dataset not in DATASETS:
        raise InputError(f"--dataset {dataset!r}; allowed: {', '.join(DATASETS)}")
    schema = DATASETS[dataset]
    source = schema.default_source if source is None else source
    if config is None and source == schema.default_source:
        config = schema.default_config
    report = PrepareReport(source=source, output=str(out))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with tmp.open("w") as f:
            rows = read_rows(source, split=split, config=config) if rows is None else rows
            for where, row in rows:
                report.rows += 1
                line = prompt_line(dataset, where, row)
                if isinstance(line, str):
                    setattr(report, line, getattr(report, line) + 1)
                    continue
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
                report.written += 1
        if report.written == 0:
            raise InputError(
                f"{source}: no prompt written ({report.rows} rows read)\n{report.render()}"
            )
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return report
