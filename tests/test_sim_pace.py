"""The pace arm in the simulator, and the launch-version view of behaviour."""

from collections import Counter

import numpy as np
import pytest

from rescue.sim import ArmSpec, SimConfig, Simulation, engine

#: Long-tailed episodes (the default agent), K = 1, no lost rollouts.
CFG = SimConfig(
    steps=40, groups_per_step=4, group_size=4, concurrency=8, buffer_capacity=8, max_turns=20,
    infra_rate=0.0,
)  # fmt: skip


def run(arm: str, cfg: SimConfig = CFG, seed: int = 0):
    sim = Simulation(cfg, ArmSpec.parse(arm), seed)
    return sim, sim.run()


def test_pace_bounds_staleness_by_waiting_and_drops_nothing():
    sim, steps = run("pace")
    t = sim.census.totals()
    assert t["dropped_stale"] == 0 and t["trained_stale"] == 0
    assert max(m["rollout/census/staleness_max"] for m in steps) <= CFG.max_staleness
    waits = [m[engine.PACE_WAIT_S] for m in steps]
    assert sum(w > 0 for w in waits) > 0  # it did wait for stragglers
    assert all((m[engine.PACE_WAIT_GROUPS] > 0) == (m[engine.PACE_WAIT_S] > 0) for m in steps)
    # Without pacing the same timing makes stale groups.
    _, never = run("never-drop")
    assert max(m["rollout/census/staleness_max"] for m in never) > CFG.max_staleness


def test_the_clock_includes_the_waits():
    _, steps = run("pace")
    t = [0.0] + [m["sim/time"] for m in steps]
    for prev, now, m in zip(t, t[1:], steps, strict=False):
        assert now - prev >= m[engine.PACE_WAIT_S] + CFG.train_time - 1e-9


def admitted(monkeypatch, cfg: SimConfig, arm: str = "pace") -> list[int]:
    """Generating + buffered + batch groups each time a launch is admitted."""
    seen = []
    real = engine.Simulation._admits

    def spy(self, flow):
        ok = real(self, flow)
        if ok:
            seen.append(flow.in_flight + len(flow.buffer) + len(flow.batch))
        return ok

    monkeypatch.setattr(engine.Simulation, "_admits", spy)
    run(arm, cfg)
    return seen


def test_pace_admits_at_most_k_plus_1_batches(monkeypatch):
    seen = admitted(monkeypatch, CFG)
    assert max(seen) + 1 == (CFG.max_staleness + 1) * CFG.groups_per_step  # reached, not passed
    tight = admitted(monkeypatch, CFG.replace(pace_window=5))
    assert max(tight) + 1 == 5
    others = admitted(monkeypatch, CFG, arm="never-drop")
    assert max(others) + 1 > (CFG.max_staleness + 1) * CFG.groups_per_step


def test_pace_window_changes_the_run():
    _, a = run("pace")
    _, b = run("pace", CFG.replace(pace_window=5))
    assert [m["sim/time"] for m in a] != [m["sim/time"] for m in b]


def test_pace_needs_a_buffer_that_holds_what_it_admits():
    with pytest.raises(ValueError, match=r"--buffer-capacity=4 .*--pace-window"):
        Simulation(CFG.replace(buffer_capacity=4), ArmSpec.parse("pace"), 0)


def test_pace_waits_are_census_keys_of_the_pace_arm_only():
    _, steps = run("drop")
    assert not any(engine.PACE_WAIT_S in m for m in steps)


# ---------------------------------------------------------------- the launch view


def test_the_launch_view_counts_each_rollout_under_the_version_that_launched_it(monkeypatch):
    launched, finished = Counter(), Counter()
    real_launch, real_put = engine.Simulation._launch, engine.Simulation._put

    def launch(self):
        g = real_launch(self)
        launched[g.version] += g.episodes.kind.size
        return g

    def put(self, flow, group):
        finished[group.version] += group.episodes.kind.size
        real_put(self, flow, group)

    monkeypatch.setattr(engine.Simulation, "_launch", launch)
    monkeypatch.setattr(engine.Simulation, "_put", put)
    _, steps = run("zero")
    for v, m in enumerate(steps):
        if launched[v] and launched[v] == finished[v]:
            assert m["sim/launched/rollouts"] == launched[v]
        else:  # a version with groups still generating at the end has no launch view
            assert "sim/launched/rollouts" not in m
    assert sum("sim/launched/rollouts" in m for m in steps) > len(steps) // 2


def test_the_launch_view_is_the_policy_of_its_version():
    # With the policy held still every version's rollouts come from the same policy: the
    # launch view of every version pooled equals the completion view pooled.
    cfg = CFG.replace(lr=0.0, steps=30)
    _, steps = run("zero", cfg)
    rows = [m for m in steps if "sim/launched/rollouts" in m]
    p_launch = sum(m["sim/launched/outcome/solved"] for m in rows) / sum(
        m["sim/launched/rollouts"] for m in rows
    )
    n = sum(m["rollout/census/generated/rollouts"] for m in steps)
    p_gen = sum(m["rollout/census/generated/outcome/solved"] for m in steps) / n
    assert p_launch == pytest.approx(p_gen, abs=4 * np.sqrt(p_gen * (1 - p_gen) / n))


def test_the_simulator_paces_with_the_schedule_miles_runs(monkeypatch):
    import rescue.pace

    sim, _ = run("pace", CFG.replace(steps=10))
    assert type(sim.pace) is rescue.pace.PaceSchedule
    assert engine.PaceSchedule is rescue.pace.PaceSchedule
    log = []
    real_choose, real_take = rescue.pace.PaceSchedule.choose, rescue.pace.PaceSchedule.take

    def choose(self):
        log.append(("choose", key := real_choose(self)))
        return key

    def take(self, key):
        log.append(("take", key))
        return real_take(self, key)

    monkeypatch.setattr(rescue.pace.PaceSchedule, "choose", choose)
    monkeypatch.setattr(rescue.pace.PaceSchedule, "take", take)
    run("pace", CFG.replace(steps=10))
    takes = [i for i, (what, _) in enumerate(log) if what == "take"]
    assert len(takes) == 10 * CFG.groups_per_step
    for i in takes:  # every group taken is the one the schedule chose just before
        assert log[i - 1] == ("choose", log[i][1])
