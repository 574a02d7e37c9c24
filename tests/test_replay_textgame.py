"""P1 on text-game dumps: real cooking episodes played through Miles' rollout with two
outcomes (won, or the cap: what ALFWorld has), masked by the mask filter, dumped with Miles'
own ``save_debug_rollout_data``, then ``rescue replay gradients`` (the two-outcome check per
prompt: the masked gradient is (1 − J̄) times the reference's solved part, the survivor
variant zero) and the judge's P1 on its report; and the gradient share of the same batch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import test_miles_textgame as tg
from conftest_games import cooking_games as cooking_games  # a fixture
from test_miles_textgame import miles_args as miles_args  # a fixture

ROOT = Path(__file__).resolve().parents[1]
#: Two-outcome groups: 2 of 8 win (J = 1/4), 6 of 8 win (J = 3/4); the rest loop to the cap.
TWO_OUTCOMES = {0: ("win",) * 2 + ("cap",) * 6, 1: ("win",) * 6 + ("cap",) * 2}


@pytest.fixture
def dump(miles_args, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from miles.ray.rollout import debug_data

    from filters import mask_truncated_zero_reward

    monkeypatch.setattr(
        tg.ScriptedSource,
        "__call__",
        lambda self, n: _two_outcome_groups(self.source.get_samples(n)),
    )
    # both groups on the level-1 game (a 5-step walkthrough) with a 6-step cap: the fewest
    # step samples to replay, one backward pass each per arm
    rows = json.loads(Path(miles_args.prompt_data).read_text().splitlines()[0])
    assert rows["metadata"]["difficulty"] == 1
    one = tmp_path / "level1.jsonl"
    one.write_text((json.dumps(rows) + "\n") * 2)
    miles_args.prompt_data, miles_args.agent_cap = str(one), 6
    groups, _, _ = tg.run_rollout(miles_args)
    mask_truncated_zero_reward(miles_args, groups)  # the mask arm's filter, as Miles calls it
    flat = [s for g in groups for t in g for s in (t if isinstance(t, list) else [t])]
    template = str(tmp_path / "dumps" / "{rollout_id}.pt")
    ns = argparse.Namespace(save_debug_rollout_data=template, save_debug_trajectory_data=None)
    debug_data.save_debug_rollout_data(ns, flat, rollout_id=0, evaluation=False)
    return tmp_path / "dumps" / "0.pt", flat


def _two_outcome_groups(groups):
    for group in groups:
        scripts = TWO_OUTCOMES[group[0].group_index % 2]
        for k, (sample, script) in enumerate(zip(group, scripts, strict=True)):
            sample.routing_key = f"{script}|{sample.metadata['game']}|{k}"
    return groups


@pytest.mark.timeout(1800)  # a backward pass per step sample and arm (minutes on a loaded CPU)
def test_p1_holds_on_the_dumped_episodes_and_the_judge_says_so(dump):
    from rescue.judge.offline import Report, p1
    from rescue.judge.stats import AS_PREDICTED

    path, _ = dump
    census = subprocess.run(
        [sys.executable, "-m", "rescue", "replay", "census", str(path), "--json"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert census.returncode == 0, census.stderr
    total = json.loads(census.stdout)["total"]["metrics"]
    assert total["outcome/solved"] == 8 and total["outcome/budget_failure"] == 8
    assert total["outcome/submitted_failure"] == total["outcome/infra_no_result"] == 0
    assert total["reason/solved/won"] == 8 and total["reason/budget_failure/turn_cap"] == 8
    # the check alone: per prompt (b) == (1 - J) c g_J, (c) == 0 (the survivor variant has
    # no gradient) and (a) == c[(1 - J) g_J - J g_C], each by its own backward pass
    done = subprocess.run(
        [sys.executable, "-m", "rescue", "replay", "gradients", str(path), "--model", "tiny-llama",
         "--check-only", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["prompts"] == 2 and report["max_residual"] <= report["rtol"] == 1e-4
    [check] = p1([Report("check", report, str(path))])
    assert check.verdict == AS_PREDICTED


def test_the_logged_share_of_the_dumped_batch_moves_toward_the_hard_prompt(dump, monkeypatch):
    from rescue.miles.log import PREFIX, gradient_share

    monkeypatch.setenv("RESCUE_TRUNCATED_REWARD", "zero")
    _, flat = dump
    args = argparse.Namespace(
        advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
        normalize_advantages=False, reward_key=None, n_samples_per_prompt=8, rollout_batch_size=2,
    )  # fmt: skip
    masked = gradient_share(args, flat)
    for s in flat:
        s.remove_sample = False
    unmasked = gradient_share(args, flat)
    assert unmasked[PREFIX + "grad_share/j_low"] == pytest.approx(0.5)
    assert masked[PREFIX + "grad_share/j_low"] == pytest.approx(0.75)
