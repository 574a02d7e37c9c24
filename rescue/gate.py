"""The stale-group decision: one gate for the simulator, Miles and slime.

Invariant
---------
The decision for a group is a pure function of ``(arm, a, seed, max_staleness, group id,
staleness)``. The protect coin ``u = coin(seed, group_id) ∈ [0, 1)`` is a hash, not a
draw from a generator: it is memoized by construction, identical after a restart and in
any process, independent across group ids and seeds, and a group that reaches the
decision twice (recycled with ``--async-unused-samples-handler retry``) gets the same
answer. Nothing needs to be checkpointed.

Arms (a group is *stale* when ``staleness > max_staleness``):

``drop``        stale groups are dropped (Miles' ``--max-weight-staleness`` behaviour).
``never-drop``  every group is kept with weight 1.
``protect``     a stale group is kept iff ``u < a``, with loss weight ``1/a``; dropped
                otherwise. Then ``E[1{u<a}/a] = 1``: the weighted loss is unbiased for
                the never-drop loss. ``a = 1`` is never-drop.
``pace``        staleness is bounded by waiting, not by the gate: the trainer waits for
                a group before it could become stale (``rescue.pace``), so no group
                should reach the gate stale. One that does anyway (the engines' version
                moved faster than the schedule counts) is kept with weight 1 and counted
                as stale (census bucket ``trained_stale``): never dropped.

Fresh groups are always kept with weight 1. Only ``drop`` and ``protect`` ever drop.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from rescue import arms, flags
from rescue.errors import InputError


class Arm(str, Enum):
    """The gate's arms: the ``gate`` column of ``rescue.arms`` (``arms.GATES``)."""

    DROP = "drop"
    NEVER_DROP = "never-drop"
    PROTECT = "protect"
    PACE = "pace"

    @classmethod
    def of(cls, arm: str) -> Arm:
        """The gate of a registered arm (``rescue.arms``): its own for a stale-handling arm,
        never-drop for a budget-regime arm. ``InputError`` for a name that is no arm."""
        name = arms.canonical(arm)
        if name is None:
            raise InputError(f"arm={arm!r} is not an arm; allowed: {', '.join(arms.NAMES)}")
        return cls(arms.ARMS[name].gate)

    @property
    def drops(self) -> bool:
        """Whether the arm can drop a stale group (``drop``, ``protect``)."""
        return self in (Arm.DROP, Arm.PROTECT)

    @classmethod
    def parse(cls, value: str | Arm, *, setting: str = "arm") -> Arm:
        if isinstance(value, Arm):
            return value
        try:
            return cls(str(value).strip().lower().replace("_", "-"))
        except ValueError:
            allowed = ", ".join(a.value for a in cls)
            raise InputError(f"{setting}={value!r} is not an arm; allowed: {allowed}") from None


#: Environment variables read by ``Gate.from_env`` (set by the launchers).
ENV_ARM = "RESCUE_ARM"
ENV_A = "RESCUE_A"
ENV_SEED = "RESCUE_SEED"


@dataclass(frozen=True)
class Decision:
    """What happens to one group: kept or not, and the loss weight of each of its samples."""

    keep: bool
    weight: float
    stale: bool

    @property
    def protected(self) -> bool:
        """A stale group kept under the protect arm with weight 1/a > 1."""
        return self.stale and self.keep and self.weight != 1.0


def coin(seed: int, group_id: int | str) -> float:
    """The group's uniform in [0, 1): a hash of (seed, group id), the same in every process."""
    digest = hashlib.blake2b(f"{seed}\x1f{group_id}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) * 2.0**-53


@dataclass(frozen=True)
class Gate:
    """Stale-group gate.

    Args:
        arm: ``drop`` | ``never-drop`` | ``protect`` | ``pace`` (setting ``RESCUE_ARM``).
        a: keep probability of a stale group under ``protect``, in (0, 1]; required for
            protect, ignored otherwise (setting ``RESCUE_A``).
        seed: seed of the per-group coin (setting ``RESCUE_SEED``, default 0).
        max_staleness: a group is stale when ``staleness > max_staleness``; ``None``
            means no group is ever stale (Miles' ``--max-weight-staleness``, default off).
    """

    arm: Arm = Arm.DROP
    a: float | None = None
    seed: int = 0
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arm", Arm.parse(self.arm, setting=ENV_ARM))
        if self.arm is Arm.PROTECT and self.a is None:
            raise InputError(f"{ENV_A} (a) is required with arm protect; allowed: 0 < a <= 1")
        if self.a is not None:
            a = _parse_float(self.a, ENV_A)
            if not (0.0 < a <= 1.0):
                raise InputError(f"{ENV_A}={self.a!r} is out of range; allowed: 0 < a <= 1")
            object.__setattr__(self, "a", a)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InputError(f"{ENV_SEED}={self.seed!r} is not an integer")
        if self.max_staleness is not None and (
            isinstance(self.max_staleness, bool)
            or not isinstance(self.max_staleness, int)
            or self.max_staleness < 0
        ):
            raise InputError(
                f"max_weight_staleness={self.max_staleness!r}; allowed: a non-negative integer or None"
            )

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, max_staleness: int | None = None
    ) -> Gate:
        """A gate from ``RESCUE_ARM`` (default drop), ``RESCUE_A`` and ``RESCUE_SEED``."""
        return cls(
            arm=ARM.read(env), a=A.read(env), seed=SEED.read(env), max_staleness=max_staleness
        )

    @property
    def protect_weight(self) -> float:
        """The loss weight 1/a of a protected group."""
        return 1.0 / self.a if self.a else 1.0

    def is_stale(self, staleness: int | float | None) -> bool:
        """Whether a group with this staleness is stale (unknown staleness is never stale)."""
        return (
            staleness is not None
            and self.max_staleness is not None
            and staleness > self.max_staleness
        )

    def coin(self, group_id: int | str) -> float:
        return coin(self.seed, group_id)

    def decide(self, group_id: int | str, staleness: int | float | None) -> Decision:
        """Keep or drop one group, and its loss weight."""
        return self.decide_drawn(self.is_stale(staleness), self.coin(group_id))

    def decide_drawn(self, stale: bool, u: float) -> Decision:
        """The decision for a group already known stale or fresh whose coin is ``u``.

        ``decide`` is this with ``u = coin(seed, group id)``; the oracle's build step calls it
        with the staleness flag and the coin a never-drop run recorded on the group's samples
        (``rescue.samples`` tags), so every arm's selection comes from this one rule.
        """
        if not stale:
            return Decision(keep=True, weight=1.0, stale=False)
        if self.arm in (Arm.NEVER_DROP, Arm.PACE):
            return Decision(keep=True, weight=1.0, stale=True)
        if self.arm is Arm.DROP:
            return Decision(keep=False, weight=0.0, stale=True)
        if u < self.a:
            return Decision(keep=True, weight=self.protect_weight, stale=True)
        return Decision(keep=False, weight=0.0, stale=True)

    def describe(self) -> str:
        """One line for logs and run names, e.g. ``protect a=0.5 seed=1 K=2``."""
        parts = [self.arm.value]
        if self.arm is Arm.PROTECT:
            parts.append(f"a={self.a:g}")
        parts += [f"seed={self.seed}", f"K={self.max_staleness}"]
        return " ".join(parts)


def _parse_float(value: object, setting: str) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{setting}={value!r} is not a number; allowed: 0 < a <= 1") from None
    if not math.isfinite(x):
        raise InputError(f"{setting}={value!r} is not finite; allowed: 0 < a <= 1")
    return x


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{ENV_SEED}={text!r} is not an integer") from None


#: ``RESCUE_ARM`` (default ``drop``): the gate's arm.
ARM = flags.setting(
    ENV_ARM, Arm.DROP, lambda t: Arm.parse(t, setting=ENV_ARM), "an arm", shown="`drop`"
)
#: ``RESCUE_A``: protect's keep probability (no default: protect requires it).
A = flags.setting(
    ENV_A,
    None,
    lambda t: _parse_float(t, ENV_A),
    "0 < a <= 1",
    shown="— (required for `protect`)",
)
#: ``RESCUE_SEED`` (default 0): the seed of every coin rescue flips.
SEED = flags.setting(ENV_SEED, 0, _seed, "an integer")
seed_from_env = SEED.read
