"""`swe_smith_tasks.prepare`: SWE-smith rows -> Miles prompt JSONL (fixtures in the dataset's schema)."""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import pytest

from swe_smith_tasks import cli as swe_cli
from swe_smith_tasks.prepare import normalize_image, prepare, read_subset

FIXTURE = Path(__file__).parent / "fixtures" / "swe_smith_rows.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
OAUTH, TLD, FLASK_EMPTY, FLASK = (r["instance_id"] for r in ROWS)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fixture_rows_have_the_dataset_schema():
    fields = {
        "instance_id",
        "patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "image_name",
        "repo",
        "problem_statement",
    }
    for row in ROWS:
        assert set(row) == fields
        assert isinstance(row["FAIL_TO_PASS"], list) and isinstance(row["PASS_TO_PASS"], list)
    assert any(r["image_name"].startswith("jyangballin/") for r in ROWS)
    assert any(r["problem_statement"] == "" for r in ROWS)


def test_prepare_counts_every_row_and_skips_empty_problem_statements(tmp_path):
    out = tmp_path / "tasks.jsonl"
    report = prepare(str(FIXTURE), out)
    assert (report.rows, report.written, report.empty_problem) == (4, 3, 1)
    assert report.no_fail_to_pass == report.not_in_subset == 0
    assert report.written + report.empty_problem == report.rows
    lines = _read(out)
    assert [line["metadata"]["instance_id"] for line in lines] == [OAUTH, TLD, FLASK]
    assert "1 empty problem statement" in report.render()


def test_prompt_line_layout_is_prompt_and_metadata(tmp_path):
    out = tmp_path / "tasks.jsonl"
    prepare(str(FIXTURE), out)
    first = _read(out)[0]
    assert set(first) == {"prompt", "metadata"}
    assert first["prompt"] == ROWS[0]["problem_statement"]
    assert first["metadata"] == {
        "instance_id": OAUTH,
        "repo": "swesmith/oauthlib__oauthlib.1fd52536",
        "image": "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
        "FAIL_TO_PASS": ROWS[0]["FAIL_TO_PASS"],
        "PASS_TO_PASS": ROWS[0]["PASS_TO_PASS"],
    }


def test_reference_solutions_are_kept_beside_the_prompts_never_in_them(tmp_path):
    from swe_smith_tasks.validate import load_references, reference_path

    out = tmp_path / "all.jsonl"
    report = prepare(str(FIXTURE), out, subset=[OAUTH, FLASK])
    assert reference_path(out) == tmp_path / "all.reference.jsonl"
    refs = load_references(reference_path(out))
    by_id = {r["instance_id"]: r for r in ROWS}
    assert refs == {OAUTH: by_id[OAUTH]["patch"], FLASK: by_id[FLASK]["patch"]}
    assert report.references == 2 and "reference solutions: 2" in report.render()
    assert all("patch" not in line["metadata"] for line in _read(out))
    # a row without a patch writes a task without a reference
    rows = [{**r, "patch": ""} if r["instance_id"] == OAUTH else r for r in ROWS]
    prepare(str(_write_rows(tmp_path / "rows.jsonl", rows)), out)
    assert OAUTH not in load_references(reference_path(out))


def test_old_jyangballin_image_is_rewritten_to_swebench(tmp_path):
    out = tmp_path / "tasks.jsonl"
    report = prepare(str(FIXTURE), out)
    images = {line["metadata"]["instance_id"]: line["metadata"]["image"] for line in _read(out)}
    assert images[TLD] == "swebench/swesmith.x86_64.john-kurkowski_1776_tldextract.3d1bf184"
    assert report.images_renamed == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
            "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
        ),
        (
            "docker.io/jyangballin/swesmith.x86_64.Pallets_1776_Flask.bc098406:latest",
            "swebench/swesmith.x86_64.pallets_1776_flask.bc098406:latest",
        ),
        (
            "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
            "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
        ),
        ("my.registry:5000/team/custom-image:v1", "my.registry:5000/team/custom-image:v1"),
        ("jyangballin/not-a-swesmith-image", "jyangballin/not-a-swesmith-image"),
    ],
)
def test_normalize_image(name, expected):
    assert normalize_image(name) == expected


def test_image_namespace_setting_points_at_a_mirror(tmp_path):
    out = tmp_path / "tasks.jsonl"
    prepare(str(FIXTURE), out, image_namespace="registry.local:5000/swebench")
    assert all(
        line["metadata"]["image"].startswith("registry.local:5000/swebench/swesmith.x86_64.")
        for line in _read(out)
    )


def test_normalized_image_matches_swesmith_profile():
    registry = pytest.importorskip("swesmith.profiles").registry
    for row in ROWS:
        profile = registry.get_from_inst(row)
        assert normalize_image(row["image_name"]) == profile.image_name


def test_subset_keeps_listed_tasks_and_reports_ids_not_found(tmp_path):
    subset = tmp_path / "subset.txt"
    subset.write_text(f"# pilot subset\n{FLASK}\n\nnot__a.task.id  # gone\n{FLASK_EMPTY}\n")
    assert read_subset(subset) == [FLASK, "not__a.task.id", FLASK_EMPTY]
    out = tmp_path / "tasks.jsonl"
    report = prepare(str(FIXTURE), out, subset=subset)
    assert [line["metadata"]["instance_id"] for line in _read(out)] == [FLASK]
    assert (report.written, report.not_in_subset, report.empty_problem) == (1, 2, 1)
    assert report.missing_subset_ids == sorted(["not__a.task.id", FLASK_EMPTY])
    assert "not__a.task.id" in report.render()


def test_test_lists_as_json_strings_are_accepted(tmp_path):
    row = dict(ROWS[0], FAIL_TO_PASS=json.dumps(ROWS[0]["FAIL_TO_PASS"]), PASS_TO_PASS="[]")
    out = tmp_path / "tasks.jsonl"
    prepare(str(_write_rows(tmp_path / "rows.jsonl", [row])), out)
    meta = _read(out)[0]["metadata"]
    assert meta["FAIL_TO_PASS"] == ROWS[0]["FAIL_TO_PASS"]
    assert meta["PASS_TO_PASS"] == []


def test_row_without_fail_to_pass_is_counted_not_written(tmp_path):
    rows = [ROWS[0], dict(ROWS[1], FAIL_TO_PASS=[])]
    report = prepare(str(_write_rows(tmp_path / "rows.jsonl", rows)), tmp_path / "t.jsonl")
    assert (report.rows, report.written, report.no_fail_to_pass) == (2, 1, 1)


def test_extra_fields_are_ignored(tmp_path):
    row = dict(ROWS[0], created_at="2025-04-01T00:00:00", base_commit="1fd52536")
    report = prepare(str(_write_rows(tmp_path / "rows.jsonl", [row])), tmp_path / "t.jsonl")
    assert report.written == 1


def test_parquet_input_gives_the_same_output(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "rows.parquet")
    prepare(str(tmp_path / "rows.parquet"), tmp_path / "a.jsonl")
    prepare(str(FIXTURE), tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()


def test_dataset_name_is_loaded_with_datasets(tmp_path, monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        return ROWS

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    report = prepare("SWE-bench/SWE-smith", tmp_path / "t.jsonl", split="train")
    assert calls == [("SWE-bench/SWE-smith", "train")]
    assert report.written == 3


def test_dataset_load_failure_is_a_clear_error(tmp_path, monkeypatch):
    def load_dataset(name, split):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(
        ValueError, match="could not load Hugging Face dataset 'SWE-bench/SWE-smith'"
    ):
        prepare("SWE-bench/SWE-smith", tmp_path / "t.jsonl")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        prepare(str(tmp_path / "nope.jsonl"), tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match=r"subset file .* does not exist"):
        prepare(str(FIXTURE), tmp_path / "t.jsonl", subset=tmp_path / "nope.txt")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image_name": None}, r"line 2 \(instance_id=.*tldextract.*\): field 'image_name'"),
        ({"FAIL_TO_PASS": 3}, r"line 2 .*field 'FAIL_TO_PASS' must be a list"),
        ({"PASS_TO_PASS": "not json"}, r"line 2 .*field 'PASS_TO_PASS' is a string but not"),
        ({"problem_statement": 7}, r"line 2 .*field 'problem_statement' must be a string"),
        ({"instance_id": ""}, r"line 2: field 'instance_id' must be a non-empty string"),
    ],
)
def test_bad_schema_names_the_row_and_field(tmp_path, change, message):
    rows = [ROWS[0], dict(ROWS[1], **change)]
    with pytest.raises(ValueError, match=message):
        prepare(str(_write_rows(tmp_path / "rows.jsonl", rows)), tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()  # never half written


def test_missing_field_and_bad_json_and_duplicates_are_errors(tmp_path):
    row = {k: v for k, v in ROWS[1].items() if k != "repo"}
    src = _write_rows(tmp_path / "rows.jsonl", [ROWS[0], row])
    with pytest.raises(ValueError, match=r"line 2 .*missing field 'repo'"):
        prepare(str(src), tmp_path / "t.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        prepare(str(tmp_path / "bad.jsonl"), tmp_path / "t.jsonl")
    src = _write_rows(tmp_path / "dup.jsonl", [ROWS[0], ROWS[1], ROWS[0]])
    with pytest.raises(
        ValueError, match=r"line 3: duplicate instance_id .* \(first at .* line 1\)"
    ):
        prepare(str(src), tmp_path / "t.jsonl")


def test_cli_prepare(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    swe_cli.configure(parser)
    out = tmp_path / "tasks.jsonl"
    args = parser.parse_args(["prepare", "--source", str(FIXTURE), "--out", str(out)])
    assert swe_cli.main(args) == 0
    assert len(_read(out)) == 3
    assert "4 rows -> 3 tasks" in capsys.readouterr().out


def test_swe_is_a_rescue_subcommand():
    from rescue.cli import COMMANDS

    assert COMMANDS["swe"][0] == "swe_smith_tasks.cli"
