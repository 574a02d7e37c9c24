"""Outcome of one rollout: the one classifier every part of rescue shares.

Specification
-------------
Every finished rollout lands in exactly one of four classes:

``solved``
    The agent submitted and the grader resolved the task (reward above the threshold).
``submitted_failure``
    The agent ended the episode itself and was scored: unresolved patch, empty patch,
    patch that does not apply, tests that time out under the grader.
``budget_failure``
    The policy ran out of budget: the turn cap (mini-swe-agent ``LimitsExceeded``,
    OpenEnv ``max_turns``), the context or length limit (Miles ``TRUNCATED``,
    ``ContextWindowExceededError``, Harbor ``*SeqLen*`` / ``ContextLength*``), or
    repeated malformed output (``RepeatedFormatError``, sub-label ``format``; when the last
    malformed reply was cut by the length limit, ``finish_reason == "length"``, it is a
    ``context_limit``). The reward
    is known (0); these are what mask filters exclude.
``infra_no_result``
    No trustworthy reward exists: aborted sample, agent function returned nothing (an
    agentic sample without ``exit_status``), sandbox or grader fault, trial timeout,
    cancellation. Never counted as a scored failure.

Rules, first match wins (``classify``):

1. ``metadata["outcome"]`` set by an agent that already called this module: taken as is
   (an unknown value is an error naming the field).
2. Status ``aborted`` or ``pending`` → ``infra_no_result``.
3. ``metadata["exit_status"]`` present → ``classify_exit_status``.
4. Agentic sample without ``exit_status`` → ``infra_no_result`` (the agent function
   returned ``None``: Miles would score it 0 and it would look like a failure).
5. Status ``truncated`` or ``metadata["end_reason"]`` in ``{max_turns, length}`` →
   ``budget_failure``.
6. Reward missing → ``infra_no_result``; reward > threshold → ``solved``; otherwise
   ``submitted_failure``.

A sample is *agentic* when its metadata carries any of ``AGENTIC_KEYS`` (the dataset row
of a SWE task, or what Miles' agentic generate function writes), unless the caller says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rescue.errors import InputError


class Outcome(str, Enum):
    """The four outcome classes. Values are the strings used in metadata, logs and JSON."""

    SOLVED = "solved"
    SUBMITTED_FAILURE = "submitted_failure"
    BUDGET_FAILURE = "budget_failure"
    INFRA_NO_RESULT = "infra_no_result"

    @classmethod
    def parse(cls, value: Any, *, field: str = "outcome") -> Outcome:
        """An ``Outcome`` from itself or its string value; anything else is an error."""
        if isinstance(value, Outcome):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(o.value for o in cls)
            raise InputError(f"{field}={value!r} is not an outcome; allowed: {allowed}") from None


OUTCOMES: tuple[Outcome, ...] = tuple(Outcome)

#: Metadata keys whose presence marks a sample as produced by an agent function.
AGENTIC_KEYS = frozenset(
    {"instance_id", "exit_status", "agent_metrics", "eval_report", "tito_session_mismatch"}
)

#: Exit statuses (mini-swe-agent, Harbor, OpenEnv) that mean the budget ran out.
BUDGET_EXIT_STATUSES = frozenset(
    {
        "LimitsExceeded",
        "ContextWindowExceededError",
        "ContextLengthExceededError",
        "SequenceLengthLimitExceeded",
        "SingleTurnMaxSeqLenExceededError",
        "RepeatedFormatError",
        "max_turns",
        "length",
    }
)
#: Exit statuses that mean the agent ended the episode itself and was graded.
SUBMITTED_EXIT_STATUSES = frozenset({"Submitted", "task_complete", "submitted"})
#: Exit statuses of the text games (``rescue.envs``): the game's own verdict. (Their cap is
#: ``max_turns`` and their context limit ``length``, budget failures above; a game or
#: engine fault, ``env_error`` / ``engine_error``, is an unknown status: no result.)
GAME_EXIT_STATUSES = {
    "won": (Outcome.SOLVED, "won"),
    "lost": (Outcome.SUBMITTED_FAILURE, "lost"),
}
#: Grader statuses (swesmith ``run_evaluation``) that carry a verdict.
GRADED_EVAL_STATUSES = frozenset({"completed", "timeout"})

_BUDGET_END_REASONS = frozenset({"max_turns", "length"})
_UNFINISHED_STATUSES = frozenset({"aborted", "pending"})


@dataclass(frozen=True)
class Classification:
    """An outcome with the reason it was chosen (a short label kept for the census)."""

    outcome: Outcome
    reason: str


def classify_exit_status(
    exit_status: str,
    *,
    resolved: bool | None = None,
    eval_status: str | None = None,
    patch_apply_failed: bool = False,
    finish_reason: str | None = None,
) -> Classification:
    """Class of an agent run from its exit status and, after a submission, the grader.

    ``finish_reason`` is the model's finish reason on the last reply; it tells a format
    failure caused by a reply cut at the length limit (budget, ``context_limit``) from a
    plain format failure (budget, ``format``).

    ``eval_status`` is swesmith's ``run_evaluation`` status (``completed`` | ``timeout`` |
    ``error``). A grader ``error`` is a scored failure only when the patch failed to apply
    (the agent's fault); otherwise the grader broke and there is no result.
    A text game's ``won`` / ``lost`` is the game's verdict (``GAME_EXIT_STATUSES``).
    """
    if exit_status in GAME_EXIT_STATUSES:
        outcome, reason = GAME_EXIT_STATUSES[exit_status]
        return Classification(outcome, reason)
    if exit_status in SUBMITTED_EXIT_STATUSES:
        if eval_status is not None and eval_status not in GRADED_EVAL_STATUSES:
            if patch_apply_failed:
                return Classification(Outcome.SUBMITTED_FAILURE, "patch_apply_failed")
            return Classification(Outcome.INFRA_NO_RESULT, f"grader_{eval_status}")
        if resolved is None:
            return Classification(Outcome.INFRA_NO_RESULT, "not_graded")
        if resolved:
            return Classification(Outcome.SOLVED, "resolved")
        return Classification(Outcome.SUBMITTED_FAILURE, "unresolved")
    if exit_status in BUDGET_EXIT_STATUSES or "SeqLen" in exit_status:
        reason = {
            "LimitsExceeded": "turn_cap",
            "max_turns": "turn_cap",
            "RepeatedFormatError": "context_limit" if finish_reason == "length" else "format",
        }.get(exit_status, "context_limit")
        return Classification(Outcome.BUDGET_FAILURE, reason)
    return Classification(Outcome.INFRA_NO_RESULT, exit_status or "unknown_exit")


def is_agentic(metadata: Mapping[str, Any]) -> bool:
    """Whether a sample's metadata marks it as produced by an agent function."""
    return not AGENTIC_KEYS.isdisjoint(metadata)


#: The status values of Miles' and slime's ``Sample.Status``.
STATUS_VALUES = frozenset({"pending", "completed", "truncated", "aborted", "failed"})


def status_value(status: Any) -> str | None:
    """``Sample.Status.TRUNCATED``, ``"truncated"`` and ``"Status.TRUNCATED"`` all → ``"truncated"``."""
    if status is None:
        return None
    value = getattr(status, "value", status)
    if value in STATUS_VALUES:
        return value
    return str(value).rsplit(".", 1)[-1].lower()


def classify(
    *,
    status: Any = None,
    reward: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    agentic: bool | None = None,
    solved_threshold: float = 0.5,
) -> Classification:
    """Class of one rollout from a sample's status, scalar reward and metadata (rules above)."""
    metadata = metadata or {}
    if metadata.get("outcome") is not None:
        outcome = Outcome.parse(metadata["outcome"], field="metadata['outcome']")
        return Classification(outcome, str(metadata.get("outcome_reason", "agent")))
    status_text = status_value(status)
    if status_text in _UNFINISHED_STATUSES:
        return Classification(Outcome.INFRA_NO_RESULT, status_text)
    exit_status = metadata.get("exit_status")
    if exit_status is not None:
        report = metadata.get("eval_report") or {}
        resolved = metadata.get("resolved", report.get("resolved"))
        if resolved is None and reward is not None and _finite(reward):
            resolved = reward > solved_threshold
        return classify_exit_status(
            str(exit_status),
            resolved=resolved,
            eval_status=metadata.get("eval_status", report.get("status")),
            patch_apply_failed=bool(metadata.get("patch_apply_failed", False)),
            finish_reason=metadata.get("last_finish_reason"),
        )
    if agentic if agentic is not None else is_agentic(metadata):
        return Classification(Outcome.INFRA_NO_RESULT, "no_exit_status")
    if status_text == "truncated":
        return Classification(Outcome.BUDGET_FAILURE, "truncated")
    if metadata.get("end_reason") in _BUDGET_END_REASONS:
        return Classification(Outcome.BUDGET_FAILURE, str(metadata["end_reason"]))
    if reward is None or not _finite(reward):
        return Classification(Outcome.INFRA_NO_RESULT, "no_reward")
    if reward > solved_threshold:
        return Classification(Outcome.SOLVED, "reward")
    return Classification(Outcome.SUBMITTED_FAILURE, "reward")


def is_capped(classification: Classification) -> bool:
    """Whether a rollout hit the turn cap or a length/context limit: what mask filters mask.

    Budget failures from repeated malformed output (reason ``format``) are not capped: the
    policy failed the format, no limit cut it off.
    """
    return classification.outcome is Outcome.BUDGET_FAILURE and classification.reason != "format"


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
