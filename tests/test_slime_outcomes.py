"""The classifier on what slime's own generators write: the coding-agent example
(``examples/coding_agent_rl/generate.py`` at the pinned commit) and ``Status.FAILED``."""

from __future__ import annotations

import pytest
from fake_sample import Sample

from rescue.census import no_result
from rescue.outcomes import Outcome, classify, classify_agent_exit_code
from rescue.samples import group_records

S = Sample.Status


def coding_agent_sample(reward, exit_code, *, index=0):
    """One sample as the example's ``generate`` returns it: the adapter's trajectory
    (``TrajectoryManager.get_trajectory``: status COMPLETED, the whole reward on every
    sample) with ``{"grading_solved": reward == 1.0, "instance_id": ...}`` and then
    ``agent_exit_code`` merged into its metadata; no ``exit_status``, no weight version."""
    return Sample(
        group_index=0,
        index=index,
        rollout_id=index,
        status=S.COMPLETED,
        reward=float(reward),
        response_length=4,
        loss_mask=[1, 1, 0, 1],
        metadata={
            "grading_solved": float(reward) == 1.0,
            "instance_id": "repo__task-1",
            "agent_exit_code": exit_code,
        },
    )


@pytest.mark.parametrize(
    ("reward", "code", "outcome", "reason"),
    [
        (1.0, 0, Outcome.SOLVED, "resolved"),
        (0.0, 0, Outcome.SUBMITTED_FAILURE, "unresolved"),
        (0.0, -1, Outcome.BUDGET_FAILURE, "time_limit"),  # EXIT_TIME_BUDGET_EXCEEDED
        (1.0, -1, Outcome.SOLVED, "resolved"),  # the diff it left is graded all the same
        (0.0, 1, Outcome.INFRA_NO_RESULT, "agent_cli_error"),
        (1.0, 2, Outcome.INFRA_NO_RESULT, "agent_cli_error"),  # whatever the grader said
    ],
)
def test_the_coding_agent_example_is_classified_by_exit_code_and_grade(
    reward, code, outcome, reason
):
    (record,) = group_records([coding_agent_sample(reward, code)])
    assert (record.outcome, record.reason) == (outcome, reason)


def test_a_group_of_the_example_with_a_solved_rollout_has_a_result():
    """Before, ``instance_id`` without ``exit_status`` made every sample a no-result: every
    group was discarded and slime's drain never filled a batch."""
    group = [coding_agent_sample(r, 0, index=k) for k, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    assert no_result(group_records(group)) is None
    broken = [*group[:3], coding_agent_sample(0.0, 1, index=3)]
    assert no_result(group_records(broken)) == "agent_cli_error"


def test_the_examples_fan_out_is_one_rollout():
    """Sub-agents and compaction fan one run out into samples sharing ``rollout_id``."""
    a, b = coding_agent_sample(1.0, 0), coding_agent_sample(1.0, 0)
    (record,) = group_records([[a, b]])
    assert record.outcome is Outcome.SOLVED


def test_the_examples_own_aborts_stay_no_result():
    """``_abort_result`` marks the sample ABORTED with an ``abort_reason`` (slime's worker
    requeues such a group)."""
    s = coding_agent_sample(0.0, 0)
    s.status = S.ABORTED
    s.metadata = {"abort_reason": "wall_clock_timeout", "instance_id": "x"}
    assert classify(status=s.status, reward=0.0, metadata=s.metadata).outcome is (
        Outcome.INFRA_NO_RESULT
    )


def test_exit_codes_without_a_grade_or_not_integers():
    assert classify_agent_exit_code(0, resolved=None).reason == "no_reward"
    assert classify_agent_exit_code("x", resolved=True).reason == "unknown_exit"
    assert classify(status="completed", reward=None, metadata={"agent_exit_code": 0}).outcome is (
        Outcome.INFRA_NO_RESULT
    )


def test_failed_is_no_result_unless_the_agent_says_more():
    """slime's ``Status.FAILED``: "a recoverable or non-critical failure during generation
    (e.g., tool call failure, external API error, parsing error)" that "can be retried"
    (``slime/utils/types.py``): a generator that marks an API error FAILED with reward 0 has
    no verdict on the policy."""
    c = classify(status=S.FAILED, reward=0.0, metadata={})
    assert (c.outcome, c.reason) == (Outcome.INFRA_NO_RESULT, "failed")
    assert classify(status="failed", reward=1.0).outcome is Outcome.INFRA_NO_RESULT
    # an agent that classified the run, or wrote its exit status, is believed
    assert classify(
        status="failed", reward=0.0, metadata={"outcome": "submitted_failure"}
    ).outcome is (Outcome.SUBMITTED_FAILURE)
    assert (
        classify(status="failed", reward=0.0, metadata={"exit_status": "LimitsExceeded"}).outcome
        is Outcome.BUDGET_FAILURE
    )
    assert no_result(group_records([Sample(status=S.FAILED, reward=0.0)])) == "failed"
