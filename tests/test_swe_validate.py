"""`rescue swe validate`: every subset task's reference solution graded in the training
sandbox, under the training concurrency, through the stand-in docker."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("swesmith")

from swe_stubs import (
    BUG_PATCH,
    IMAGE,
    METADATA,
    PROBLEM,
    docker_calls,
    install_fake_docker,
    live_containers,
    make_task_image,
)

from swe_smith_tasks import cli as swe_cli
from swe_smith_tasks import validate
from swe_smith_tasks.agent_settings import AgentSettings

#: A "reference" whose reverse applies cleanly and breaks ``mul`` without fixing ``add``.
BAD_REFERENCE = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -4,3 +4,3 @@\n \n"
    " def mul(a, b):\n-    return a / b\n+    return a * b\n"
)
OTHER_IMAGE = IMAGE + "-other"
OTHER_ID = METADATA["instance_id"].replace("tiny0001", "tiny0002")


@pytest.fixture
def docker(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    shim, root = install_fake_docker(tmp_path, monkeypatch)
    make_task_image(root / "images")
    make_task_image(root / "images", OTHER_IMAGE, OTHER_ID)
    monkeypatch.setenv("MSWEA_DOCKER_EXECUTABLE", shim)
    return root


def _tasks():
    good = (METADATA["instance_id"], dict(METADATA))
    other = (OTHER_ID, {**METADATA, "instance_id": OTHER_ID, "image": OTHER_IMAGE})
    return [good, other]


def test_a_reference_that_resolves_is_kept_and_one_that_does_not_is_excluded(docker, tmp_path):
    references = {METADATA["instance_id"]: BUG_PATCH, OTHER_ID: BAD_REFERENCE}
    settings = AgentSettings(max_concurrency=2)
    results = validate.validate(_tasks(), references, settings=settings, progress=False)
    assert [(r.instance_id, r.resolved) for r in results] == [
        (METADATA["instance_id"], True),
        (OTHER_ID, False),
    ]
    # graded in the training sandbox: the fixed limits on every container
    runs = [c for c in docker_calls(docker) if c[0] == "run"]
    assert len(runs) == 2
    for run in runs:
        assert run[run.index("--cpus") + 1] == "2" and run[run.index("--memory") + 1] == "10g"
        assert run[run.index("--pids-limit") + 1] == "4096"
    assert live_containers(docker) == []
    paths = validate.write_outputs(tmp_path / "v", results, concurrency=2)
    kept = paths["subset"].read_text().splitlines()
    assert kept[0].startswith("# validated subset: 1 of 2 tasks") and kept[1:] == [
        METADATA["instance_id"]
    ]
    summary = paths["summary"].read_text()
    assert "Reference solutions resolved: 1 of 2 (50.0%), graded 2 at once" in summary
    assert f"| {OTHER_ID} |" in summary


def test_a_task_without_a_reference_or_an_image_is_excluded_with_its_reason(docker):
    missing_image = (OTHER_ID, {**METADATA, "instance_id": OTHER_ID, "image": "swebench/absent"})
    results = validate.validate(
        [(METADATA["instance_id"], dict(METADATA)), missing_image],
        {OTHER_ID: BUG_PATCH},
        settings=AgentSettings(),
        concurrency=1,
        progress=False,
    )
    assert [(r.resolved, r.status, r.reason) for r in results] == [
        (False, "error", "no_reference"),
        (False, "error", "image_pull"),
    ]
    assert "pull access denied" in results[1].error


def _rows_file(tmp_path: Path) -> Path:
    """Two SWE-smith rows of the stand-in images, with their bug patches."""
    rows = []
    for iid, image, patch in (
        (METADATA["instance_id"], IMAGE, BUG_PATCH),
        (OTHER_ID, OTHER_IMAGE, BAD_REFERENCE),
    ):
        rows.append(
            {
                "instance_id": iid,
                "repo": METADATA["repo"],
                "image_name": image,
                "problem_statement": PROBLEM,
                "FAIL_TO_PASS": METADATA["FAIL_TO_PASS"],
                "PASS_TO_PASS": METADATA["PASS_TO_PASS"],
                "patch": patch,
            }
        )
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    swe_cli.configure(parser)
    return parser.parse_args(list(argv))


def test_cli_validates_the_subset_with_the_training_concurrency(
    docker, tmp_path, monkeypatch, capsys
):
    tasks = tmp_path / "tasks.jsonl"
    assert (
        swe_cli.main(_parse("prepare", "--source", str(_rows_file(tmp_path)), "--out", str(tasks)))
        == 0
    )
    assert validate.reference_path(tasks).is_file()
    subset = tmp_path / "subset.txt"
    subset.write_text(f"# pilot\n{METADATA['instance_id']}\n{OTHER_ID}\n")
    monkeypatch.setenv("RESCUE_SWE_MAX_CONCURRENCY", "2")
    out = tmp_path / "validate"
    argv = ["validate", "--tasks", str(tasks), "--subset", str(subset), "--out", str(out)]
    assert swe_cli.main(_parse(*argv, "--no-progress")) == 0
    printed = capsys.readouterr().out
    assert "1 of 2 reference solutions resolved (50.0%)" in printed
    assert f"excluded {OTHER_ID}: completed unresolved" in printed
    assert out.joinpath("subset.txt").read_text().splitlines()[1:] == [METADATA["instance_id"]]
    assert "graded 2 at once" in out.joinpath("summary.md").read_text()
    # nothing resolves (no Docker images at all): a failure, not an empty subset
    for folder in (docker / "images").iterdir():
        folder.rename(docker / folder.name)
    assert swe_cli.main(_parse(*argv, "--no-progress")) == 1
    assert "no reference solution resolved (most common: image_pull)" in (capsys.readouterr().err)


def test_cli_refuses_subset_ids_that_are_not_tasks_and_a_missing_reference_file(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    swe_cli.main(_parse("prepare", "--source", str(_rows_file(tmp_path)), "--out", str(tasks)))
    subset = tmp_path / "subset.txt"
    subset.write_text("nobody__nothing.1234abcd.x__1\n")
    with pytest.raises(ValueError, match="1 id\\(s\\) not in --tasks"):
        swe_cli.main(_parse("validate", "--tasks", str(tasks), "--subset", str(subset)))
    validate.reference_path(tasks).unlink()
    with pytest.raises(ValueError, match=r"no reference file .*rerun `rescue swe prepare`"):
        swe_cli.main(_parse("validate", "--tasks", str(tasks)))
