"""The tests' one stand-in for a trainer's ``Sample`` (Miles' ``miles.utils.types.Sample``).

A plain dataclass with a subset of the real class's fields, each with the real field's
name and default, the real ``Status`` enum values (a new sample is ``PENDING``, reward
``None``) and the real ``get_reward_value``; it imports neither Miles nor torch. slime's
``Sample`` has the same fields with the same defaults.

``check_against(real_sample_class)`` says how this class differs from a real one: the
integration tests run it against Miles' class (tests/test_miles_buffer.py) and slime's
(tests/test_slime_rollout.py) when ``MILES_SRC`` / ``SLIME_SRC`` is set, so a field the
frameworks rename or a default they change fails there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    """The fields of Miles' and slime's ``Sample`` that rescue reads or writes."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    train_metadata: dict | None = None

    def get_reward_value(self, args: Any) -> Any:
        return self.reward if not args.reward_key else self.reward[args.reward_key]


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def check_against(real: type) -> list[str]:
    """How ``Sample`` differs from ``real`` (a framework's ``Sample``): one line per difference.

    Compared: every field of ``Sample`` exists in ``real`` with an equal default (a status
    default compares by value), the ``Status`` values, and ``get_reward_value`` on a plain
    and on a dict reward.
    """
    problems = []
    theirs = {f.name: f for f in dataclasses.fields(real)}
    for f in dataclasses.fields(Sample):
        if f.name not in theirs:
            problems.append(f"field {f.name!r} is not a field of {real.__module__}.Sample")
            continue
        mine, other = _default(f), _default(theirs[f.name])
        if f.name == "status":
            mine, other = mine.value, getattr(other, "value", other)
        if mine != other:
            problems.append(f"field {f.name!r}: default {mine!r} here, {other!r} there")
    mine_status = {s.name: s.value for s in Sample.Status}
    their_status = {s.name: s.value for s in real.Status}
    if mine_status != their_status:
        problems.append(f"Status: {mine_status} here, {their_status} there")

    class Args:
        reward_key = None

    for reward, key in ((0.5, None), ({"acc": 1.0}, "acc")):
        Args.reward_key = key
        got = (
            Sample(reward=reward).get_reward_value(Args),
            real(reward=reward).get_reward_value(Args),
        )
        if got[0] != got[1]:
            problems.append(
                f"get_reward_value with reward_key={key!r}: {got[0]!r} here, {got[1]!r} there"
            )
    return problems
