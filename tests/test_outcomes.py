"""The one outcome classifier: each rule of rescue.outcomes, in order, and every row of its
reason table (a test per reason: moving a reason to another class fails here)."""

import pytest

from rescue.outcomes import (
    OTHER_EXIT,
    REASONS,
    Outcome,
    because,
    classify,
    classify_exit_status,
    is_capped,
)

SOL, FAIL, BUD, INF = (
    Outcome.SOLVED,
    Outcome.SUBMITTED_FAILURE,
    Outcome.BUDGET_FAILURE,
    Outcome.INFRA_NO_RESULT,
)
SUBMITTED = {"exit_status": "Submitted"}
#: reason -> (its class, the classify() inputs that produce it; None: an agent or adapter
#: gives the reason itself, with its class from the table through ``because``).
ROWS = {
    "resolved": (SOL, {"metadata": {**SUBMITTED, "eval_report": {"resolved": True}}}),
    "unresolved": (FAIL, {"metadata": {**SUBMITTED, "eval_report": {"resolved": False}}}),
    "tests_timeout": (
        FAIL,
        {"metadata": {**SUBMITTED, "eval_report": {"resolved": False, "status": "timeout"}}},
    ),
    "patch_apply_failed": (
        FAIL,
        {"metadata": {**SUBMITTED, "eval_status": "error", "patch_apply_failed": True}},
    ),
    "tests_oom": (
        FAIL,
        {"metadata": {**SUBMITTED, "eval_report": {"resolved": False, "reason": "tests_oom"}}},
    ),
    "sandbox_oom": (FAIL, None),
    "turn_cap": (BUD, {"metadata": {"exit_status": "LimitsExceeded"}}),
    "context_limit": (
        BUD,
        {"status": "completed", "reward": 0.0, "metadata": {"end_reason": "length"}},
    ),
    "truncated": (BUD, {"status": "truncated", "reward": 0.0}),
    "time_budget": (BUD, {"metadata": {"exit_status": "TimeBudgetExceeded"}}),
    "format": (BUD, {"metadata": {"exit_status": "RepeatedFormatError"}}),
    "aborted": (INF, {"status": "aborted", "reward": 1.0}),
    "pending": (INF, {"status": "pending", "reward": 1.0}),
    "no_exit_status": (
        INF,
        {"status": "completed", "reward": 0.0, "metadata": {"instance_id": "a"}},
    ),
    "no_reward": (INF, {"status": "completed", "reward": float("nan")}),
    "not_graded": (INF, {"metadata": SUBMITTED}),
    "grader_error": (INF, {"metadata": {**SUBMITTED, "eval_status": "error"}}),
    "image_pull": (INF, None),
    "container_start": (INF, None),
    "checkout_failed": (INF, None),
    "hide_history_failed": (INF, None),
    "network_cut_failed": (INF, None),
    "container_lost": (INF, None),
    "endpoint_error": (INF, None),
    "trial_timeout": (INF, None),
    "cancelled": (INF, None),
    "sample_assembly": (INF, None),
    "pace_straggler": (INF, None),
    OTHER_EXIT: (INF, {"metadata": {"exit_status": "APIConnectionError"}}),
}


def test_every_reason_of_the_table_has_a_row_here():
    assert set(ROWS) == set(REASONS)


@pytest.mark.parametrize("reason", list(ROWS))
def test_each_reason_lands_in_its_class(reason):
    expected, inputs = ROWS[reason]
    assert REASONS[reason].outcome is expected
    if inputs is None:  # given by the agent or an adapter: the class comes from the table
        c = because(reason)
        assert (c.outcome, c.reason) == (expected, reason)
        # an agent that books the reason in another class is refused, naming both
        wrong = next(o for o in Outcome if o is not expected)
        with pytest.raises(ValueError, match=f"books {reason!r} as {expected.value}"):
            classify(metadata={"outcome": wrong.value, "outcome_reason": reason})
        assert classify(metadata={"outcome": expected.value, "outcome_reason": reason}) == c
        return
    c = classify(**inputs)
    assert c.outcome is expected
    assert c.reason == ("APIConnectionError" if reason == OTHER_EXIT else reason)


@pytest.mark.parametrize(
    ("exit_status", "kwargs", "expected", "reason"),
    [
        ("Submitted", {"resolved": True}, Outcome.SOLVED, "resolved"),
        ("Submitted", {"resolved": False}, Outcome.SUBMITTED_FAILURE, "unresolved"),
        (
            "Submitted",
            {"resolved": False, "eval_status": "timeout"},
            Outcome.SUBMITTED_FAILURE,
            "tests_timeout",
        ),
        (
            "Submitted",
            {"eval_status": "error", "patch_apply_failed": True},
            Outcome.SUBMITTED_FAILURE,
            "patch_apply_failed",
        ),
        ("Submitted", {"eval_status": "error"}, Outcome.INFRA_NO_RESULT, "grader_error"),
        ("Submitted", {}, Outcome.INFRA_NO_RESULT, "not_graded"),
        ("LimitsExceeded", {}, Outcome.BUDGET_FAILURE, "turn_cap"),
        ("max_turns", {}, Outcome.BUDGET_FAILURE, "turn_cap"),
        ("TimeBudgetExceeded", {}, Outcome.BUDGET_FAILURE, "time_budget"),
        ("ContextWindowExceededError", {}, Outcome.BUDGET_FAILURE, "context_limit"),
        ("SingleTurnMaxSeqLenExceededError", {}, Outcome.BUDGET_FAILURE, "context_limit"),
        ("RepeatedFormatError", {}, Outcome.BUDGET_FAILURE, "format"),
        (
            "RepeatedFormatError",
            {"finish_reason": "length"},
            Outcome.BUDGET_FAILURE,
            "context_limit",
        ),
        ("TimeExceeded", {}, Outcome.INFRA_NO_RESULT, "TimeExceeded"),
        ("AgentTimeoutError", {}, Outcome.INFRA_NO_RESULT, "AgentTimeoutError"),
        ("CancelledError", {}, Outcome.INFRA_NO_RESULT, "CancelledError"),
        # the text games (rescue.envs): the game's verdict, the cap, the context, faults
        ("won", {}, Outcome.SOLVED, "won"),
        ("won", {"resolved": False}, Outcome.SOLVED, "won"),
        ("lost", {}, Outcome.SUBMITTED_FAILURE, "lost"),
        ("max_turns", {}, Outcome.BUDGET_FAILURE, "turn_cap"),
        ("length", {}, Outcome.BUDGET_FAILURE, "context_limit"),
        ("env_error", {}, Outcome.INFRA_NO_RESULT, "env_error"),
        ("engine_error", {}, Outcome.INFRA_NO_RESULT, "engine_error"),
    ],
)
def test_exit_status_mapping(exit_status, kwargs, expected, reason):
    c = classify_exit_status(exit_status, **kwargs)
    assert (c.outcome, c.reason) == (expected, reason)


def test_agent_label_wins_and_bad_label_names_the_field():
    c = classify(status="truncated", reward=1.0, metadata={"outcome": "infra_no_result"})
    assert c.outcome is Outcome.INFRA_NO_RESULT
    with pytest.raises(ValueError, match=r"metadata\['outcome'\].*allowed: solved"):
        classify(metadata={"outcome": "win"})


@pytest.mark.parametrize("status", ["aborted", "pending", "Status.ABORTED"])
def test_unfinished_sample_is_infra(status):
    assert classify(status=status, reward=1.0).outcome is Outcome.INFRA_NO_RESULT


def test_agentic_sample_without_exit_status_is_infra_never_a_failure():
    # Miles scores a None-returning agent function 0.0 with status COMPLETED.
    c = classify(status="completed", reward=0.0, metadata={"instance_id": "x__y.1234abcd.f__0"})
    assert (c.outcome, c.reason) == (Outcome.INFRA_NO_RESULT, "no_exit_status")
    # The caller may override the detection.
    assert (
        classify(status="completed", reward=0.0, metadata={}, agentic=True).outcome
        is Outcome.INFRA_NO_RESULT
    )


def test_exit_status_with_reward_uses_reward_as_verdict():
    assert classify(reward=1.0, metadata={"exit_status": "Submitted"}).outcome is Outcome.SOLVED
    assert (
        classify(reward=0.0, metadata={"exit_status": "Submitted"}).outcome
        is Outcome.SUBMITTED_FAILURE
    )
    report = {"exit_status": "Submitted", "eval_report": {"resolved": True, "status": "completed"}}
    assert classify(reward=0.0, metadata=report).outcome is Outcome.SOLVED


def test_plain_samples_by_status_and_reward():
    assert classify(status="truncated", reward=0.0).outcome is Outcome.BUDGET_FAILURE
    assert (
        classify(status="completed", reward=0.0, metadata={"end_reason": "max_turns"}).outcome
        is Outcome.BUDGET_FAILURE
    )
    assert classify(status="completed", reward=1.0).outcome is Outcome.SOLVED
    assert classify(status="completed", reward=0.0).outcome is Outcome.SUBMITTED_FAILURE
    assert classify(status="completed", reward=None).outcome is Outcome.INFRA_NO_RESULT
    assert classify(status="completed", reward=float("nan")).outcome is Outcome.INFRA_NO_RESULT


def test_capped_means_turn_cap_or_context_not_format():
    assert is_capped(classify_exit_status("LimitsExceeded"))
    assert is_capped(classify(status="truncated", reward=0.0))
    assert not is_capped(classify_exit_status("RepeatedFormatError"))
    assert is_capped(
        classify(metadata={"exit_status": "RepeatedFormatError", "last_finish_reason": "length"})
    )
    assert not is_capped(classify_exit_status("TimeExceeded"))  # wall time: not the agent's
    assert is_capped(classify_exit_status("TimeBudgetExceeded"))
    assert not is_capped(classify(status="completed", reward=0.0))


def test_outcome_parse_errors_list_allowed_values():
    assert Outcome.parse("solved") is Outcome.SOLVED
    with pytest.raises(
        ValueError, match="allowed: solved, submitted_failure, budget_failure, infra_no_result"
    ):
        Outcome.parse("lost")


def test_the_docs_table_of_reasons_is_the_reason_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "census.md").read_text()
    section = readme[readme.index("**Outcome reasons.**") :]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.split("\n\n")[1].splitlines()[2:]
    ]
    assert {r[0].strip("`"): (r[1], r[2]) for r in rows} == {
        name: (row.outcome.value, row.meaning) for name, row in REASONS.items()
    }
