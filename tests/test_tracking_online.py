"""``rescue report wandb:ENTITY/PROJECT[/GROUP]``: runs read through wandb's own public API
(``wandb.Api``, ``Runs``, ``Run.scan_history``) from a recorded service (tests/wandb_service.py)
judge to the same report as the same runs' offline folders; each history is scanned once;
the service's failures are one line each."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from synthetic_runs import make_run

pytest.importorskip("wandb")

from wandb_service import record_offline

from rescue import cli
from rescue.errors import InputError
from rescue.tracking.online import PREFIX, parse_project, read_project

PROJECT = "wandb:lab/rescue-test"


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> Path:
    """Six runs logged offline by wandb itself: two arms, three seeds, as the launchers name
    them (group = run name = <family>-<arm>...-seed<S>, tags arm/seed)."""
    import wandb

    root = tmp_path_factory.mktemp("offline")
    for label, name, extra in (("drop", "drop-k2", ["k:2"]), ("never-drop", "never-drop", [])):
        for seed in range(3):
            run = wandb.init(
                mode="offline", dir=str(root), project="rescue-test",
                group=f"swe-{name}-seed{seed}", name=f"swe-{name}-seed{seed}",
                tags=[f"arm:{label}", f"seed:{seed}", *extra], config={"lr": 1e-6},
                reinit="create_new", settings=wandb.Settings(silent=True, console="off"),
            )  # fmt: skip
            turns = 5.0 if label == "drop" else 6.0
            for row in make_run(label, seed, steps=8, turns_solved=turns, family="swe").rows:
                run.log(row)
            run.log({"train/step": 8, "train/rescue/update_norm": float("nan")})
            run.finish()
    return root / "wandb"


@pytest.fixture(scope="module")
def recorded(offline):
    """The project as the server holds those runs (read once; each test takes a copy)."""
    return record_offline([[d] for d in sorted(offline.glob("offline-run-*"))])


def _service(recorded):
    return copy.deepcopy(recorded)


def _report(args: list[str], out: Path, capsys) -> dict:
    assert cli.main(["report", *args, "--out", str(out), "--no-plots", "--no-progress"]) == 0
    capsys.readouterr()
    return json.loads((out / "report.json").read_text())


def _without_sources(report: dict) -> str:
    """The report with where each run was read from left out (a path, or wandb:...)."""
    text = json.dumps(report, sort_keys=True)
    return re.sub(r'"(/[^"]*offline-run-[^"]*|wandb:lab/rescue-test/[a-z0-9]+)"', '"SRC"', text)


def test_a_project_judges_to_the_report_of_its_offline_folders(
    offline, recorded, tmp_path, monkeypatch, capsys
):
    service = _service(recorded)
    service.install(monkeypatch, tmp_path)
    cache = tmp_path / "cache"
    online = _report([PROJECT, "--wandb-cache", str(cache)], tmp_path / "online", capsys)
    folders = _report([str(offline)], tmp_path / "offline", capsys)
    assert online["cohorts"] and _without_sources(online) == _without_sources(folders)
    md_online = (tmp_path / "online" / "report.md").read_text()
    md_folders = (tmp_path / "offline" / "report.md").read_text()
    assert re.sub(r"\S*offline-run-\S*|wandb:lab/rescue-test/\S+", "SRC", md_online) == re.sub(
        r"\S*offline-run-\S*|wandb:lab/rescue-test/\S+", "SRC", md_folders
    )
    assert len(list((cache / "lab" / "rescue-test").glob("*.json"))) == 6


def test_each_history_is_scanned_once_and_refreshed_when_the_run_moved(
    recorded, tmp_path, monkeypatch
):
    service = _service(recorded)
    service.install(monkeypatch, tmp_path)
    cache = tmp_path / "cache"
    first, _ = read_project(PROJECT, cache=cache, progress=False)
    scanned = len(service.scanned_steps)
    assert scanned == sum(len(r.rows) for r in service.runs)
    again, _ = read_project(PROJECT, cache=cache, progress=False)
    assert len(service.scanned_steps) == scanned  # nothing scanned again: the cache held it
    assert json.dumps([log.rows for log in again]) == json.dumps([log.rows for log in first])
    moved = service.runs[0]
    moved.rows.append({**moved.rows[-1], "_step": moved.last_step + 1, "rollout/step": 99})
    third, _ = read_project(PROJECT, cache=cache, progress=False)
    assert service.scanned_steps[scanned:] == [moved.last_step]  # only the new row
    assert third[0].rows[-1]["rollout/step"] == 99 and third[0].last_step == moved.last_step
    moved.rows.pop(0)  # went back (a rewound resume): its whole history again
    moved.rows[:] = [{**r, "_step": i} for i, r in enumerate(moved.rows[:3])]
    fourth, _ = read_project(PROJECT, cache=cache, progress=False)
    assert len(fourth[0].rows) == 3


def test_a_run_still_running_is_judged_on_what_it_logged_with_a_note(
    recorded, tmp_path, monkeypatch
):
    service = _service(recorded)
    service.runs[0].state = "running"
    service.install(monkeypatch, tmp_path)
    logs, notes = read_project(PROJECT, cache=tmp_path / "c", progress=False)
    assert len(logs) == 6 and logs[0].state == "running"
    [note] = notes
    assert "still running" in note and f"{len(logs[0].rows)} rows" in note


def test_a_group_reads_only_its_runs(recorded, tmp_path, monkeypatch):
    service = _service(recorded)
    service.install(monkeypatch, tmp_path)
    logs, _ = read_project(PROJECT + "/swe-drop-k2-seed1", cache=tmp_path / "c", progress=False)
    assert [log.group for log in logs] == ["swe-drop-k2-seed1"]
    with pytest.raises(InputError, match="no run in group 'nothing' of lab/rescue-test"):
        read_project(PROJECT + "/nothing", cache=tmp_path / "c", progress=False)


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (("Runs", "429 Too Many Requests: rate limit exceeded", 429),
         r"wandb:lab/rescue-test: the wandb server is limiting the rate of requests \(HTTP 429"),
        (("Runs", "Post https://api: dial tcp: no such host", 0),
         r"cannot reach the wandb server \(Post https://api: dial tcp: no such host\)"),
        (("auth", "invalid API key", 401),
         r"the wandb credentials could not be verified"),
        (("history", "500 Internal Server Error", 500),
         r"the wandb server failed \(HTTP 500: 500 Internal Server Error\)"),
    ],
)  # fmt: skip
def test_the_services_failures_are_one_line_each(
    recorded, tmp_path, monkeypatch, capsys, failure, message
):
    service = _service(recorded)
    service.fail(*failure)
    service.install(monkeypatch, tmp_path)
    with pytest.raises(InputError, match=message) as e:
        read_project(PROJECT, cache=tmp_path / "c", progress=False)
    assert "\n" not in str(e.value)
    out = tmp_path / "r"
    assert cli.main(["report", PROJECT, "--out", str(out), "--wandb-cache", str(tmp_path / "c"),
                     "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("rescue report: error: wandb:lab/rescue-test: ") and err.count("\n") == 1
    assert not out.exists()


def test_no_such_project_is_one_line(recorded, tmp_path, monkeypatch):
    service = _service(recorded)
    service.project_exists = False  # the server answers project: null
    service.install(monkeypatch, tmp_path)
    with pytest.raises(
        InputError, match="no such project: entity 'lab' has no project 'rescue-test'"
    ):
        read_project(PROJECT, cache=tmp_path / "c", progress=False)


def test_no_credentials_is_one_line(tmp_path, monkeypatch):
    from wandb.sdk import wandb_setup

    monkeypatch.setattr(wandb_setup, "_singleton", None)  # a fresh process' wandb: no key kept
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "cfg"))
    with pytest.raises(
        InputError, match=r"no wandb credentials .*: run `wandb login` or export WANDB_API_KEY"
    ):
        read_project(PROJECT, cache=tmp_path / "c", progress=False)


def test_a_run_whose_keys_are_not_rescues_is_named(recorded, tmp_path, monkeypatch):
    service = _service(recorded)
    service.runs[2].rows = [{"_step": 0, "loss": 1.0}, {"_step": 1, "loss": 0.5}]
    service.install(monkeypatch, tmp_path)
    run_id = service.runs[2].run_id
    with pytest.raises(
        InputError, match=f"wandb:lab/rescue-test/{run_id}: run .* logged no key of rescue's"
    ):
        read_project(PROJECT, cache=tmp_path / "c", progress=False)


def test_the_project_argument_is_checked():
    assert parse_project("wandb:lab/proj/swe-drop-k2-seed1").group == "swe-drop-k2-seed1"
    assert str(parse_project("wandb:lab/proj")) == "wandb:lab/proj"
    for bad in ("wandb:lab", "wandb:/proj", "wandb:lab/", "wandb:la b/proj"):
        with pytest.raises(InputError, match="allowed: wandb:ENTITY/PROJECT"):
            parse_project(bad)
    assert PREFIX == "wandb:"
