"""What a slime run is refused at start, each in one line naming the setting, and which
source of weight versions it says it uses."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from sglang_pause import PausingEngine

from rescue.gate import Gate
from rescue.slime.checks import REWARD_PATH, check_slime_run, start_warnings
from rescue.slime.generate import GENERATE_PATH
from rescue.slime.versions import FALLBACK, EngineVersions

ADVANTAGE_PATH = "rescue.slime.advantages.turn_advantages"


def args(**overrides):
    base = dict(
        rollout_batch_size=4,
        advantage_estimator="grpo",
        rewards_normalization=True,
        normalize_advantages=False,
        use_opd=False,
        custom_reward_post_process_path=REWARD_PATH,
        custom_advantage_function_path=ADVANTAGE_PATH,
        custom_generate_function_path=GENERATE_PATH,
        custom_convert_samples_to_train_data_path=None,
    )
    return SimpleNamespace(**{**base, **overrides})


GOOD = {
    "drop": Gate(arm="drop", max_staleness=2),
    "never-drop": Gate(arm="never-drop"),
    "protect": Gate(arm="protect", a=0.5, max_staleness=2),
    "pace": Gate(arm="pace", max_staleness=2),
}


@pytest.mark.parametrize("arm", sorted(GOOD))
@pytest.mark.parametrize("estimator", ["group", "turn"])
def test_every_arm_with_either_estimator_starts(arm, estimator):
    pace = check_slime_run(args(), GOOD[arm], {"RESCUE_ESTIMATOR": estimator})
    assert (pace is not None) == (arm == "pace")
    if pace is not None:
        assert (pace.max_staleness, pace.batch, pace.window) == (2, 4, 12)


def refused(gate, match, env=None, **overrides):
    with pytest.raises(ValueError, match=match) as e:
        check_slime_run(args(**overrides), gate, env or {})
    assert "\n" not in str(e.value)


def test_an_arm_that_needs_a_staleness_limit_without_one():
    refused(Gate(arm="drop"), r"^RESCUE_ARM=drop needs RESCUE_MAX_STALENESS=K.*never-drop")
    refused(Gate(arm="protect", a=0.5), r"^RESCUE_ARM=protect needs RESCUE_MAX_STALENESS=K")
    refused(Gate(arm="pace"), r"^RESCUE_ARM=pace needs RESCUE_MAX_STALENESS=K")
    refused(GOOD["pace"], r"RESCUE_PACE_WINDOW=99; allowed", {"RESCUE_PACE_WINDOW": "99"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RESCUE_ESTIMATOR", "turns"),
        ("RESCUE_BASELINE", "some"),
        ("RESCUE_KAPPA", "-1"),
        ("RESCUE_TURN_TOKENS", "0"),
        ("RESCUE_GENERATE_FUNCTION", GENERATE_PATH),
    ],
)
def test_an_unknown_setting_of_the_reward_hook_or_the_wrapper(name, value):
    refused(GOOD["drop"], f"^{name}=", {name: value})


def test_protect_or_turn_without_the_reward_hook():
    refused(
        GOOD["protect"],
        f"^RESCUE_ARM=protect needs --custom-reward-post-process-path {REWARD_PATH} "
        r"\(got None\): without it every protected group trains with weight 1",
        custom_reward_post_process_path=None,
    )
    refused(
        GOOD["never-drop"],
        "^RESCUE_ESTIMATOR=turn needs --custom-reward-post-process-path",
        {"RESCUE_ESTIMATOR": "turn"},
        custom_reward_post_process_path="my.hook",
    )
    check_slime_run(args(custom_reward_post_process_path=None), GOOD["drop"], {})


def test_normalize_advantages_or_another_estimator_with_weights_or_turn():
    refused(
        GOOD["protect"],
        "^RESCUE_ARM=protect with --normalize-advantages",
        normalize_advantages=True,
    )
    refused(
        GOOD["drop"],
        "^RESCUE_ESTIMATOR=turn with --normalize-advantages",
        {"RESCUE_ESTIMATOR": "turn"},
        normalize_advantages=True,
    )
    refused(
        GOOD["protect"], "--advantage-estimator ppo; allowed: grpo, gspo", advantage_estimator="ppo"
    )
    check_slime_run(args(normalize_advantages=True), GOOD["drop"], {})


def test_turn_without_its_advantage_hook_with_opd_or_a_custom_converter():
    turn = {"RESCUE_ESTIMATOR": "turn"}
    refused(
        GOOD["drop"],
        f"--custom-advantage-function-path {ADVANTAGE_PATH}",
        turn,
        custom_advantage_function_path=None,
    )
    refused(GOOD["drop"], "--use-opd", turn, use_opd=True)
    refused(
        GOOD["drop"],
        "^RESCUE_ESTIMATOR=turn with --custom-convert-samples-to-train-data-path my.convert: "
        "the per-token advantages ride teacher_log_probs",
        turn,
        custom_convert_samples_to_train_data_path="my.convert",
    )
    check_slime_run(args(custom_convert_samples_to_train_data_path="my.convert"), GOOD["drop"], {})


def test_turn_without_the_generate_wrapper_and_a_warning_for_the_other_arms():
    refused(
        GOOD["never-drop"],
        f"^RESCUE_ESTIMATOR=turn needs --custom-generate-function-path {GENERATE_PATH}",
        {"RESCUE_ESTIMATOR": "turn"},
        custom_generate_function_path=None,
    )
    without = args(custom_generate_function_path="my.generate")
    check_slime_run(without, GOOD["drop"], {})
    (line,) = start_warnings(without)
    assert "one version staler than its tokens" in line and "RESCUE_GENERATE_FUNCTION" in line
    assert start_warnings(args()) == []


# ── which source of versions is in use ──────────────────────────────────────────────


def versions_of(engine):
    host, port = engine.server.server_address
    return EngineVersions(SimpleNamespace(sglang_router_ip=host, sglang_router_port=port))


def test_the_source_of_versions_is_said_at_start(caplog):
    with PausingEngine(patched=True) as engine, caplog.at_level(logging.INFO):
        engine.version = "7"
        v = versions_of(engine)
        assert v.probe() == "engines (/get_weight_version)" and v() == 7
    with PausingEngine(patched=False) as engine, caplog.at_level(logging.INFO):
        engine.version = "3"
        v = versions_of(engine)  # upstream SGLang: 404, then /model_info
        assert v.probe() == "engines (/model_info)" and v() == 3
    v = EngineVersions(SimpleNamespace())
    with caplog.at_level(logging.INFO):
        assert v.probe() == FALLBACK and v() is None
    said = [r.getMessage() for r in caplog.records if "weight versions from" in r.getMessage()]
    assert said[0] == "rescue: weight versions from the engines (/get_weight_version)"
    assert said[1] == "rescue: weight versions from the engines (/model_info)"
    assert said[2].startswith(f"rescue: weight versions from {FALLBACK}")
    assert "version_fallback = 1" in said[2]


def test_an_engine_that_stops_answering_falls_back_and_comes_back():
    with PausingEngine() as engine:
        v = versions_of(engine)
        engine.version = "2"
        assert v() == 2
        engine.version = "default"  # SGLang's version before the first update
        assert v() is None and "no numeric version" in v.last_error
        engine.version = "4"
        assert v() == 4
    assert v() is None and v.source == FALLBACK
