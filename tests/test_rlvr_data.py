"""GSM8K / MATH rows to Miles prompt JSONL: labels, report buckets, sources, and Miles' grader."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from rescue.cli import main as rescue_main
from rescue.errors import InputError
from rescue.rlvr.data import PROMPT_SUFFIX, gsm8k_label, last_boxed, prepare, prompt_line

FIXTURES = Path(__file__).parent / "fixtures"
GSM8K = FIXTURES / "gsm8k_rows.jsonl"
MATH = FIXTURES / "math_rows.jsonl"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gsm8k_rows_become_chat_prompts_with_the_final_answer_as_label(tmp_path):
    report = prepare("gsm8k", tmp_path / "out.jsonl", source=str(GSM8K))
    out = lines(tmp_path / "out.jsonl")
    assert [row["label"] for row in out] == ["72", "48000", "-2.5"]
    assert (report.rows, report.written, report.empty_prompt, report.no_label) == (5, 3, 1, 1)
    first = out[0]
    assert first["prompt"] == [
        {
            "role": "user",
            "content": "Natalia sold clips to 48 of her friends in April, and then she sold half "
            "as many clips in May. How many clips did Natalia sell altogether in April and May?"
            + PROMPT_SUFFIX,
        }
    ]
    assert first["metadata"] == {"dataset": "gsm8k", "source": f"{GSM8K} line 1"}
    assert "\\boxed{}" in PROMPT_SUFFIX


def test_math_labels_are_the_last_boxed_answer_with_braces_matched(tmp_path):
    report = prepare("math", tmp_path / "out.jsonl", source=str(MATH))
    out = lines(tmp_path / "out.jsonl")
    assert [row["label"] for row in out] == ["\\frac{5}{6}", "5", "(-2, 2)"]
    assert (report.rows, report.written, report.empty_prompt, report.no_label) == (5, 3, 1, 1)
    assert all(row["metadata"]["dataset"] == "math" for row in out)


def test_math_500_answer_field_wins_over_the_solution():
    line = prompt_line("math", "r", {"problem": "p", "solution": "\\boxed{1}", "answer": " 2 "})
    assert line["label"] == "2"


def test_parquet_rows_read_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = lines(GSM8K)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "rows.parquet")
    prepare("gsm8k", tmp_path / "a.jsonl", source=str(tmp_path / "rows.parquet"))
    prepare("gsm8k", tmp_path / "b.jsonl", source=str(GSM8K))
    labels = [r["label"] for r in lines(tmp_path / "a.jsonl")]
    assert labels == [r["label"] for r in lines(tmp_path / "b.jsonl")]


def test_a_dataset_name_is_loaded_with_its_default_config_and_split(tmp_path, monkeypatch):
    calls = []

    def load_dataset(name, *config, split):
        calls.append((name, config, split))
        return [dict(r) for r in lines(GSM8K)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    report = prepare("gsm8k", tmp_path / "out.jsonl", split="test")
    assert calls == [("openai/gsm8k", ("main",), "test")]
    assert report.source == "openai/gsm8k" and report.written == 3
    prepare("gsm8k", tmp_path / "out.jsonl", source="someone/gsm8k-mirror")
    assert calls[-1] == ("someone/gsm8k-mirror", (), "train")
    prepare("gsm8k", tmp_path / "out.jsonl", source="someone/gsm8k-mirror", config="socratic")
    assert calls[-1] == ("someone/gsm8k-mirror", ("socratic",), "train")


def test_no_gradeable_row_is_an_error_and_writes_nothing(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(InputError, match="no prompt written"):
        prepare("gsm8k", tmp_path / "out.jsonl", source=str(src))
    assert not (tmp_path / "out.jsonl").exists()


def test_a_field_of_the_wrong_type_names_the_row(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"question": 3, "answer": "#### 3"}) + "\n")
    with pytest.raises(InputError, match=r"line 1: field 'question' is a int"):
        prepare("gsm8k", tmp_path / "out.jsonl", source=str(src))


def test_an_unknown_dataset_is_refused(tmp_path):
    with pytest.raises(InputError, match="allowed: gsm8k, math"):
        prepare("aime", tmp_path / "out.jsonl", source=str(GSM8K))


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("so \\boxed{3} then \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{unclosed", None),
        ("none", None),
    ],
)
def test_last_boxed(text, label):
    assert last_boxed(text) == label


@pytest.mark.parametrize(
    ("answer", "label"),
    [("a\n#### 1,234", "1234"), ("#### 5\n", "5"), ("####  ", None), ("no", None)],
)
def test_gsm8k_label(answer, label):
    assert gsm8k_label(answer) == label


def test_the_cli_writes_and_reports(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    code = rescue_main(
        [
            "rlvr",
            "prepare",
            "--dataset",
            "math",
            "--source",
            str(MATH),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 0
    assert "5 rows -> 3 prompts written" in capsys.readouterr().out
    assert (
        rescue_main(
            ["rlvr", "prepare", "--dataset", "math", "--source", "/nope.jsonl", "--out", str(bad)]
        )
        == 2
    )
    assert "input file '/nope.jsonl' does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [tmp_path / "o"]  # nothing half written is left


# ── against the real Miles sources ───────────────────────────────────────────────────────


def test_miles_math_grader_scores_the_prepared_labels(tmp_path):
    """Miles' ``--rm-type math`` grader (rm_hub.math_utils.grade_answer_verl) gives 1 to a
    response that boxes the label and 0 to one that boxes another answer."""
    from miles_env import require_miles

    require_miles()
    from miles.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
    from miles.rollout.rm_hub.math_utils import grade_answer_verl

    prepare("gsm8k", tmp_path / "g.jsonl", source=str(GSM8K))
    prepare("math", tmp_path / "m.jsonl", source=str(MATH))
    rows = lines(tmp_path / "g.jsonl") + lines(tmp_path / "m.jsonl")
    assert len(rows) == 6
    for row in rows:
        label = row["label"]
        right = f"Working it out step by step.\n\nThe answer is \\boxed{{{label}}}."
        wrong = "Working it out step by step.\n\nThe answer is \\boxed{987654}."
        assert grade_answer_verl(right, label), label
        assert not grade_answer_verl(wrong, label), label
        assert get_deepscaler_rule_based_reward("<think>x</think>" + right, label) == 1, label


def test_miles_dataset_reads_the_prepared_prompts(tmp_path):
    """Miles' own loader (``miles.utils.data.Dataset`` with ``--input-key prompt --label-key
    label --metadata-key metadata``) reads every prepared row."""
    from miles_env import require_miles

    require_miles()
    from miles.utils.data import Dataset

    prepare("gsm8k", tmp_path / "g.jsonl", source=str(GSM8K))
    ds = Dataset(
        str(tmp_path / "g.jsonl"),
        tokenizer=None,
        processor=None,
        max_length=None,
        prompt_key="prompt",
        label_key="label",
        metadata_key="metadata",
    )
    samples = ds.origin_samples
    assert [s.label for s in samples] == ["72", "48000", "-2.5"]
    assert samples[0].prompt[0]["role"] == "user" and samples[0].metadata["dataset"] == "gsm8k"
