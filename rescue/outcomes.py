"""Outcome of one rollout: the one classifier every part of rescue shares, and its reason table.

Specification
-------------
Every finished rollout lands in exactly one of four classes:

``solved``
    The agent submitted and the grader resolved the task (reward above the threshold).
``submitted_failure``
    The agent ended the episode itself and was scored: unresolved patch, empty patch,
    patch that does not apply, tests that time out under the grader. An agent that breaks
    its own sandbox (its processes exhaust the container's fixed memory, so the container
    dies) failed too: the sandbox limits are the same for every trial, so that is the
    agent's doing, never the infrastructure's.
``budget_failure``
    The policy ran out of budget: the turn cap (mini-swe-agent ``LimitsExceeded``,
    OpenEnv ``max_turns``), the context or length limit (Miles ``TRUNCATED``,
    ``ContextWindowExceededError``, Harbor ``*SeqLen*`` / ``ContextLength*``), the agent's
    own time (``TimeBudgetExceeded``: seconds in its model calls and its commands), or
    repeated malformed output (``RepeatedFormatError``, reason ``format``; when the last
    malformed reply was cut by the length limit, ``finish_reason == "length"``, it is a
    ``context_limit``). The reward is known (0); these are what mask filters exclude.
``infra_no_result``
    No trustworthy reward exists: aborted sample, agent function returned nothing (an
    agentic sample without ``exit_status``), container start or pull, checkout, a lost
    container, the grader, the model endpoint, the trial timeout (the agent's own time is
    its budget; what exceeds the trial timeout beyond it went to the infrastructure),
    cancellation. Never counted as a scored failure.

The rule is written once: ``REASONS`` maps every reason label the classifier (or an agent
that calls ``because``) gives to its class, with what it means; the docs' table of
reasons (``docs/census.md``) is this table. A reason outside it is an exit status the
table does not name (an exception raised out of the agent, e.g. ``APIConnectionError``):
``OTHER_EXIT`` says it is ``infra_no_result``.

Rules, first match wins (``classify``):

1. ``metadata["outcome"]`` set by an agent that already called this module: taken as is
   (an unknown value is an error naming the field; a reason of the table that belongs to
   another class is an error too).
2. Status ``aborted`` or ``pending`` → ``infra_no_result``.
3. ``metadata["exit_status"]`` present → ``classify_exit_status``.
4. ``metadata["agent_exit_code"]`` present (slime's coding-agent example,
   ``examples/coding_agent_rl/generate.py``, which writes no ``exit_status``) →
   ``classify_agent_exit_code``: the agent CLI's exit code and the graded reward.
5. Status ``failed`` → ``infra_no_result`` (slime's ``Status.FAILED``: "a recoverable or
   non-critical failure during generation (e.g., tool call failure, external API error,
   parsing error)" that "can be retried": no verdict on the policy, whatever reward the
   generator wrote; an agent that knows better says so with rules 1, 3 or 4).
6. Agentic sample without ``exit_status`` → ``infra_no_result`` (the agent function
   returned ``None``: Miles would score it 0 and it would look like a failure).
7. Status ``truncated`` or ``metadata["end_reason"]`` in ``{max_turns, length}`` →
   ``budget_failure``.
8. Reward missing → ``infra_no_result``; reward > threshold → ``solved``; otherwise
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


@dataclass(frozen=True)
class Reason:
    """One row of the reason table: a label, its class, and what happened."""

    name: str
    outcome: Outcome
    meaning: str


_S, _F, _B, _I = (
    Outcome.SOLVED,
    Outcome.SUBMITTED_FAILURE,
    Outcome.BUDGET_FAILURE,
    Outcome.INFRA_NO_RESULT,
)
#: Label of every exit status the table does not name (an exception out of the agent).
OTHER_EXIT = "<other exit status>"

#: Every reason label and its class: the one place a reason's bucket is decided.
# fmt: off
REASONS: dict[str, Reason] = {
    r.name: r
    for r in (
        Reason("resolved", _S, "submitted, and the grader resolved the task (or reward > threshold)"),
        Reason("unresolved", _F, "submitted, graded unresolved (an empty patch too), or reward <= threshold"),
        Reason("tests_timeout", _F, "submitted; the tests ran past the grader's timeout"),
        Reason(
            "patch_apply_failed",
            _F,
            "submitted a patch that does not apply, or applies only in reverse (already applied)",
        ),
        Reason("tests_oom", _F, "submitted; the tests under the patch exhausted the grader container's memory"),
        Reason("sandbox_oom", _F, "the agent's processes exhausted its container's memory and killed it"),
        Reason("turn_cap", _B, "the turn cap: LimitsExceeded, OpenEnv max_turns"),
        Reason("context_limit", _B, "the context or length limit: the endpoint refused the context, Harbor *SeqLen*, end_reason length, a format error cut by the length limit"),
        Reason("truncated", _B, "Miles/slime status TRUNCATED (the length or --max-seq-len cut the rollout)"),
        Reason("time_budget", _B, "the agent's own time (its model calls and commands) ran past RESCUE_SWE_TIME_BUDGET"),
        Reason("format", _B, "RepeatedFormatError: repeated malformed replies, none cut by a limit"),
        Reason("aborted", _I, "status ABORTED (Miles' session server saw no model call; a failed collection)"),
        Reason("pending", _I, "status PENDING: the rollout never finished"),
        Reason("no_exit_status", _I, "agentic sample without exit_status: the agent function returned nothing"),
        Reason("no_reward", _I, "no finite reward"),
        Reason("not_graded", _I, "submitted, but no verdict reached the classifier"),
        Reason("grader_error", _I, "the grader failed (checkout, copy, exec, a killed or lost eval container), not the patch"),
        Reason("image_pull", _I, "the task image could not be pulled"),
        Reason("container_start", _I, "the sandbox container did not start"),
        Reason("checkout_failed", _I, "the task branch could not be checked out"),
        Reason("hide_history_failed", _I, "the task's git history could not be replaced"),
        Reason("network_cut_failed", _I, "the sandbox could not be cut from the network after checkout"),
        Reason("container_lost", _I, "the sandbox vanished mid-trial (removed, the daemon down or restarted)"),
        Reason("endpoint_error", _I, "the model endpoint kept failing (connection, 5xx) past the retries"),
        Reason("trial_timeout", _I, "the trial ran past RESCUE_SWE_TRIAL_TIMEOUT (start, grading, engine outages)"),
        Reason("cancelled", _I, "the trial was cancelled"),
        Reason("sample_assembly", _I, "Miles' session server refused to assemble the sample (HTTP 422)"),
        Reason("pace_straggler", _I, "pace abandoned the group after RESCUE_PACE_STRAGGLER_S"),
        Reason(OTHER_EXIT, _I, "any other exit status: an exception out of the agent, by its class name"),
    )
}
# fmt: on

#: Metadata keys whose presence marks a sample as produced by an agent function.
AGENTIC_KEYS = frozenset(
    {
        "instance_id",
        "exit_status",
        "agent_metrics",
        "eval_report",
        "tito_session_mismatch",
        "agent_exit_code",
    }
)

#: Exit statuses (mini-swe-agent, Harbor, OpenEnv, rescue's agent) that mean the budget ran out.
BUDGET_EXIT_STATUSES = frozenset(
    {
        "LimitsExceeded",
        "TimeBudgetExceeded",
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

_END_REASONS = {"max_turns": "turn_cap", "length": "context_limit"}
_UNFINISHED_STATUSES = frozenset({"aborted", "pending"})


@dataclass(frozen=True)
class Classification:
    """An outcome with the reason it was chosen (a short label kept for the census)."""

    outcome: Outcome
    reason: str


def because(reason: str) -> Classification:
    """The class ``REASONS`` gives ``reason``; a label outside the table is ``OTHER_EXIT``'s
    (an exit status the table does not name: ``infra_no_result``), kept as it is."""
    row = REASONS.get(reason) or REASONS[OTHER_EXIT]
    return Classification(row.outcome, reason)


def classify_exit_status(
    exit_status: str,
    *,
    resolved: bool | None = None,
    eval_status: str | None = None,
    patch_apply_failed: bool = False,
    finish_reason: str | None = None,
    grader_reason: str | None = None,
) -> Classification:
    """Class of an agent run from its exit status and, after a submission, the grader.

    ``grader_reason`` is the grader's own label of an unresolved verdict; ``tests_oom``
    (the tests under the patch exhausted the grader container's memory) is kept as such.

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
            return because("patch_apply_failed" if patch_apply_failed else "grader_error")
        if resolved is None:
            return because("not_graded")
        if resolved:
            return because("resolved")
        if eval_status == "timeout":
            return because("tests_timeout")
        return because("tests_oom" if grader_reason == "tests_oom" else "unresolved")
    if exit_status in BUDGET_EXIT_STATUSES or "SeqLen" in exit_status:
        reason = {
            "LimitsExceeded": "turn_cap",
            "max_turns": "turn_cap",
            "TimeBudgetExceeded": "time_budget",
            "RepeatedFormatError": "context_limit" if finish_reason == "length" else "format",
        }.get(exit_status, "context_limit")
        return because(reason)
    return because(exit_status or "unknown_exit")


def classify_agent_exit_code(code: Any, *, resolved: bool | None) -> Classification:
    """Class of a run of slime's coding-agent example from the agent CLI's exit code.

    The example grades the agent's diff whatever the exit code
    (``examples/coding_agent_rl/generate.py``: ``swe.run_evaluation`` after
    ``HARNESS_CLS().run``), and ``resolved`` is that verdict (``None``: no reward).

    - ``0``: the agent ended the episode itself and was graded: ``solved`` when resolved,
      else ``submitted_failure``;
    - negative (``slime.agent.sandbox.EXIT_TIME_BUDGET_EXCEEDED = -1``): the agent's own
      time budget (``SWE_AGENT_TIME_BUDGET_SEC``) ran out: ``solved`` when the diff it left
      resolves the task, else ``budget_failure`` (reason ``time_limit``);
    - positive: the agent CLI exited with an error (an API error from the model adapter,
      a crash): ``infra_no_result`` (reason ``agent_cli_error``), whatever the grader said;
    - not an integer: ``infra_no_result`` (reason ``unknown_exit``).

    Without a verdict (``resolved is None``) codes 0 and negative are ``infra_no_result``
    (``no_reward``). The example's own aborts (``_abort_result``: status ``aborted``) are
    rule 2's.
    """
    try:
        code = int(code)
    except (TypeError, ValueError):
        return Classification(Outcome.INFRA_NO_RESULT, "unknown_exit")
    if code > 0:
        return Classification(Outcome.INFRA_NO_RESULT, "agent_cli_error")
    if resolved is None:
        return Classification(Outcome.INFRA_NO_RESULT, "no_reward")
    if resolved:
        return Classification(Outcome.SOLVED, "resolved")
    if code < 0:
        return Classification(Outcome.BUDGET_FAILURE, "time_limit")
    return Classification(Outcome.SUBMITTED_FAILURE, "unresolved")


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
        reason = str(metadata.get("outcome_reason", "agent"))
        row = REASONS.get(reason)
        if row is not None and row.outcome is not outcome:
            raise InputError(
                f"metadata['outcome']={outcome.value!r} with outcome_reason={reason!r}: "
                f"rescue.outcomes.REASONS books {reason!r} as {row.outcome.value}"
            )
        return Classification(outcome, reason)
    status_text = status_value(status)
    if status_text in _UNFINISHED_STATUSES:
        return because(status_text)
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
            grader_reason=report.get("reason"),
        )
    if "agent_exit_code" in metadata:
        resolved = metadata.get("grading_solved")
        if resolved is None and reward is not None and _finite(reward):
            resolved = reward > solved_threshold
        return classify_agent_exit_code(
            metadata["agent_exit_code"], resolved=None if resolved is None else bool(resolved)
        )
    if status_text == "failed":
        return Classification(Outcome.INFRA_NO_RESULT, "failed")
    if agentic if agentic is not None else is_agentic(metadata):
        return because("no_exit_status")
    if status_text == "truncated":
        return because("truncated")
    if metadata.get("end_reason") in _END_REASONS:
        return because(_END_REASONS[metadata["end_reason"]])
    if reward is None or not _finite(reward):
        return because("no_reward")
    return because("resolved" if reward > solved_threshold else "unresolved")


def is_capped(classification: Classification) -> bool:
    """Whether a rollout hit a limit: the turn cap, a length/context limit or its time
    budget: what mask filters mask.

    Budget failures from repeated malformed output (reason ``format``) are not capped: the
    policy failed the format, no limit cut it off.
    """
    return classification.outcome is Outcome.BUDGET_FAILURE and classification.reason != "format"


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
