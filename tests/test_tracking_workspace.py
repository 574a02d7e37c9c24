"""The census' wandb workspace: every panel's key is logged by the Miles adapter, the slime
adapter or the simulator; the workspace is wandb's own object, serializes and round-trips;
``--dry-run`` prints it; saving goes through wandb's API (a recorded service) and prints
the URL; the keys are declared against their steps where they are logged."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_sample import Sample
from test_miles_log import fake_miles_tracking  # noqa: F401  (a fixture)

from rescue import cli
from rescue.tracking.history import read_offline
from rescue.tracking.metrics import B_AXIS, DECLARATIONS, STEP, TRAIN_STEP, declare, step_of
from rescue.tracking.workspace import SECTIONS, Panel, Section, describe, unlogged

wandb = pytest.importorskip("wandb")


@pytest.fixture(scope="module")
def sim_wandb(tmp_path_factory) -> Path:
    """Offline wandb runs of the simulator: every stale-handling and budget arm, 4 steps."""
    out = tmp_path_factory.mktemp("sim")
    argv = ["sim", "--arms", "drop,never-drop,protect:0.5,pace,zero,mask", "--steps", "4",
            "--group-size", "4", "--max-turns", "6", "--seeds", "1", "--no-plots",
            "--no-progress", "--out", str(out / "sim")]  # fmt: skip
    assert cli.main(argv) == 0
    return out / "sim" / "wandb"


@pytest.fixture(scope="module")
def sim_runs(sim_wandb) -> list:
    folders = sorted(sim_wandb.glob("offline-run-*"))
    assert len(folders) == 6
    return [read_offline([d]) for d in folders]


@pytest.fixture
def fake_miles(request):
    """The Miles stand-ins of tests/test_miles_log.py: what they record of the metrics logged."""
    return request.getfixturevalue("fake_miles_tracking")


def _logged(fake_miles) -> set[str]:
    return {k for metrics, _ in fake_miles for k in metrics}


def _done(**fields) -> Sample:
    return Sample(**{"status": Sample.Status.COMPLETED, "weight_versions": ["1"], **fields})


def miles_rollout_keys(fake_miles) -> set[str]:
    """What the Miles log function logs for a batch with every outcome and a protect weight."""
    from rescue.miles.log import log_rollout
    from rescue.samples import WEIGHT_KEY

    batch = [
        _done(group_index=1, index=10, reward=1.0, metadata={"exit_status": "Submitted"}),
        _done(group_index=1, index=11, status=Sample.Status.TRUNCATED, remove_sample=True),
        _done(group_index=2, index=20, reward=0.0, metadata={WEIGHT_KEY: 2.0}),
        _done(group_index=2, index=21, reward=1.0, metadata={WEIGHT_KEY: 2.0}),
    ]
    log_rollout(0, SimpleNamespace(reward_key=None), batch, None, 0.0)
    return _logged(fake_miles)


def miles_train_keys(fake_miles, monkeypatch) -> set[str]:
    """What the Miles train log logs for a step under score centering: its own layers (the
    update norm on a torch optimizer, Megatron's parameter walk stood in), the advantage
    moments and the score-centering figures recorded as the loss records them."""
    torch = pytest.importorskip("torch")
    from rescue.miles import step as step_module
    from rescue.miles import train_step
    from rescue.miles.sc_flags import SC_LOSS_PATH
    from rescue.miles.sc_stats import SC_STATS

    monkeypatch.setattr(train_step, "_parallel", lambda: ([], True))
    monkeypatch.setattr(
        step_module, "main_parameters", lambda child: child.param_groups[0]["params"]
    )
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    optimizer.get_grad_stats_parallel_group = lambda: None
    args = SimpleNamespace(loss_type="custom_loss", custom_loss_function_path=SC_LOSS_PATH,
                           rollout_batch_size=1, n_samples_per_prompt=1, global_batch_size=1)  # fmt: skip
    ctx = step_module.StepContext(args=args)
    adv, mask = [torch.tensor([1.0, -1.0, 2.0])], [torch.tensor([1, 1, 1])]
    train_step.MOMENTS.reset()
    train_step.MOMENTS.record(adv, adv, mask)
    SC_STATS.reset()
    SC_STATS.record(adv, torch.tensor([3.0, 2.4, 2.7, 0.3, 0.6], dtype=torch.float64))

    def step():
        param.grad = torch.ones(3)
        optimizer.step()

    train_step.TrainLog()(ctx, optimizer, lambda: step_module.UpdateNorm()(ctx, optimizer, step))
    return _logged(fake_miles)


def test_every_panel_key_is_logged_by_the_miles_adapter_the_slime_adapter_or_the_simulator(
    sim_runs, fake_miles, monkeypatch
):
    simulator = {k for log in sim_runs for row in log.rows for k in row}
    miles = miles_rollout_keys(fake_miles) | miles_train_keys(fake_miles, monkeypatch)
    # The census is one code (rescue.census) under the same prefix in the simulator, the
    # Miles buffer and the slime drain; the Miles-only keys come from its log function and
    # its train log, run above.
    logged = simulator | miles
    missing = unlogged(logged)
    assert not missing, f"panels on keys nothing logs: {missing}"
    assert {"train/rescue/update_norm", "train/rescue/sc/correction_l1"} <= miles
    assert "rollout/census/samples/weight_mean" in miles - simulator
    assert B_AXIS in simulator  # the x axis of the panels keyed by b


def test_a_panel_that_names_a_key_nothing_logs_is_caught(sim_runs):
    simulator = {k for log in sim_runs for row in log.rows for k in row}
    typo = Panel("typo", ("rollout/census/outcome/solved_rat",), "nothing")
    planted = (*SECTIONS, Section("planted", "?", (typo,)))
    assert "rollout/census/outcome/solved_rat" in unlogged(simulator, planted)
    assert "rollout/census/outcome/solved_rate" not in unlogged(simulator, planted)


def test_every_panel_plots_against_the_step_its_keys_are_declared_at():
    for section in SECTIONS:
        for panel in section.panels:
            if panel.x == B_AXIS:
                assert all(step_of(k) == STEP for k in panel.keys), panel.title
                continue
            for key in panel.keys:
                declared = step_of(key) or STEP  # the simulator's own sim/* keys: its step
                assert panel.x == declared, (panel.title, key)


def test_the_workspace_answers_the_issues_questions():
    names = [s.name for s in SECTIONS]
    assert names == [
        "Where every group went", "The four outcomes", "Turns by outcome", "Against b",
        "Staleness and protect", "Pace", "The off-policy correction", "The trainer",
    ]  # fmt: skip
    against_b = next(s for s in SECTIONS if s.name == "Against b")
    plotted = {k: p.x for p in against_b.panels for k in p.keys}
    assert plotted["rollout/census/generated/cap_hit_rate"] == B_AXIS == "rollout/census/b_prior"
    assert plotted["rollout/census/generated/outcome/submitted_failure_rate"] == B_AXIS
    assert all(p.answers and p.keys for s in SECTIONS for p in s.panels)


def test_the_workspace_is_wandbs_own_and_round_trips():
    pytest.importorskip("wandb_workspaces")
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces.workspaces import internal

    from rescue.tracking.workspace import build

    workspace = build("lab", "rescue-swe", group="swe-(drop|protect)-.*")
    assert isinstance(workspace, ws.Workspace)
    spec = workspace._to_model().model_dump_json(by_alias=True, exclude_none=True)
    back = ws.Workspace._from_model(internal.View.model_validate(json.loads(spec)))
    assert [s.name for s in back.sections] == [s.name for s in SECTIONS]
    for section, ours in zip(back.sections, SECTIONS, strict=True):
        assert [p.title for p in section.panels] == [p.title for p in ours.panels]
        for panel, mine in zip(section.panels, ours.panels, strict=True):
            assert [m.name for m in panel.y] == list(mine.keys)
            assert panel.x.name == mine.x
    assert [g.name for g in back.runset_settings.groupby] == ["Group"]
    assert (
        back.runset_settings.query == "swe-(drop|protect)-.*" and back.runset_settings.regex_query
    )


def test_dry_run_prints_every_section_and_panel(capsys):
    assert cli.main(["wandb", "workspace", "lab/rescue-swe", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out == describe("lab", "rescue-swe") + "\n"
    for section in SECTIONS:
        assert f"{section.name}: {section.question}" in out
        for panel in section.panels:
            assert f"  - {panel.title}" in out and f"y: {', '.join(panel.keys)}" in out
    assert "x: rollout/census/b_prior" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lab/rescue-swe/grp", "--dry-run"], "ENTITY/PROJECT 'lab/rescue-swe/grp'; allowed"),
        (["lab", "--dry-run"], "allowed: wandb:ENTITY/PROJECT"),
        (["lab/p", "--group", "(", "--dry-run"], "--group '(': not a regular expression"),
    ],
)
def test_bad_workspace_arguments_are_one_line(argv, message, capsys):
    assert cli.main(["wandb", "workspace", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_saving_goes_through_wandbs_api_and_prints_the_url(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb_workspaces")
    from wandb_service import RecordedService

    service = RecordedService()
    service.install(monkeypatch, tmp_path)
    assert cli.main(["wandb", "workspace", "lab/rescue-swe"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("workspace saved: https://") and "/lab/rescue-swe?nw=" in out
    [(variables)] = service.saved_views
    assert (variables["entityName"], variables["projectName"]) == ("lab", "rescue-swe")
    spec = json.loads(variables["spec"])
    assert "rollout/census/b_prior" in json.dumps(spec)
    service.fail("UpsertView2", "429 Too Many Requests", 429)
    assert cli.main(["wandb", "workspace", "lab/rescue-swe"]) == 2
    assert "limiting the rate of requests (HTTP 429" in capsys.readouterr().err


def test_the_simulators_runs_declare_the_census_against_the_rollout_step(sim_runs):
    axes = sim_runs[0].axes
    for glob, step in DECLARATIONS:
        assert axes[glob] == (step or STEP)  # it trains once per rollout step
    assert axes["*"] == STEP


def test_the_miles_log_function_declares_rescues_axes_on_its_wandb_run(tmp_path, fake_miles):
    from rescue.miles.log import log_rollout

    # as Miles starts it: wandb.init, the process' run (wandb.run)
    run = wandb.init(mode="offline", dir=str(tmp_path), project="rescue-test",
                     settings=wandb.Settings(silent=True, console="off"))  # fmt: skip
    try:
        log_rollout(
            0, SimpleNamespace(reward_key=None), [_done(group_index=1, reward=1.0)], None, 0
        )
        log_rollout(
            1, SimpleNamespace(reward_key=None), [_done(group_index=1, reward=1.0)], None, 0
        )
    finally:
        run.finish()
    [folder] = sorted((tmp_path / "wandb").glob("offline-run-*"))
    axes = read_offline([folder]).axes
    assert axes["rollout/census/*"] == STEP and axes["train/rescue/*"] == TRAIN_STEP
    assert axes["rollout/rescue/*"] == STEP


def test_declare_names_each_step_key_then_each_glob():
    calls = []
    declare(lambda name, **kw: calls.append((name, kw.get("step_metric"))))
    assert calls[:2] == [(STEP, None), (TRAIN_STEP, None)]
    assert ("rollout/census/*", STEP) in calls and ("train/rescue/*", TRAIN_STEP) in calls
    calls.clear()
    declare(lambda name, **kw: calls.append((name, kw.get("step_metric"))), train_step=STEP)
    assert calls[0] == (STEP, None) and ("train/rescue/*", STEP) in calls  # the simulator


def test_preview_draws_the_panels_and_keeps_an_earlier_picture_on_bad_input(
    sim_wandb, sim_runs, tmp_path, capsys
):
    pytest.importorskip("matplotlib")
    from rescue.tracking.preview import series

    out = tmp_path / "pics" / "workspace.png"
    assert cli.main(["wandb", "preview", str(sim_wandb), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "preview of 6 runs" in capsys.readouterr().out
    before = out.read_bytes()
    for argv, message in (
        ([str(tmp_path / "absent")], "does not exist"),
        ([str(tmp_path / "pics")], "no offline-run-* folder under"),
        ([str(sim_wandb), "--out", str(tmp_path / "w.svg")], "allowed: a .png file"),
    ):
        args = argv if "--out" in argv else [*argv, "--out", str(out)]
        assert cli.main(["wandb", "preview", *args]) == 2
        assert message in capsys.readouterr().err
    assert out.read_bytes() == before
    # a group's seeds averaged per step; the shares of a pct-area panel sum to 1 per row
    shares = next(p for s in SECTIONS for p in s.panels if p.style == "pct-area")
    totals: dict = {}
    for key in shares.keys:
        for group, points in series(sim_runs, shares, key).items():
            for x, y in points:
                totals[(group, x)] = totals.get((group, x), 0.0) + y
    assert totals and all(abs(t - 1.0) < 1e-9 for t in totals.values())
