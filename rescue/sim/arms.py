"""The arms the simulator compares: one way each of handling outcome-dependent exclusion.

Specification
-------------
The arms and what defines each are ``rescue.arms``' table (its ``simulator`` column says
which the simulator runs); here they are resolved to what the simulator does:

==================  ====================  ===================  ============  ============
arm                 stale groups          capped rollouts      baseline      advantage
==================  ====================  ===================  ============  ============
``drop``            dropped (K)           R = 0, trained       all G         per rollout
``never-drop``      kept, weight 1        R = 0, trained       all G         per rollout
``protect``         coin a, 1/a           R = 0, trained       all G         per rollout
``pace``            none: trainer waits   R = 0, trained       all G         per rollout
``mask``            kept, weight 1        loss-masked (R = 0)  all G         per rollout
``matched``         kept, weight 1        loss-masked (R = 0)  all G         per rollout
``zero``            kept, weight 1        R = 0, trained       all G         per rollout
``survivor``        kept, weight 1        loss-masked          survivors     per rollout
``turn``            kept, weight 1        R = 0, trained       turn-reached  per turn
==================  ====================  ===================  ============  ============

``turn-baseline``, the simulator's former name of ``turn``, is still accepted, with a note.

``matched`` is the matched-update control: the mask arm's step rescaled to the update
norm the ``zero`` arm takes on the same batch from the same parameters
(``rescue.mask.matched_scale``, the trainer's rule; the simulator's step is plain gradient
ascent, so the scale is the ratio of the two gradient norms). It keeps the mask's
direction and takes R = 0's step size.

The stale arms keep capped rollouts at R = 0 and the budget arms never drop, so each arm
changes one thing. ``zero`` and ``never-drop`` are therefore the same configuration and
give identical runs for a seed (the runner computes it once).

``pace`` bounds staleness by waiting, by the schedule Miles' pace rollout runs
(``rescue.pace``): no group is trained more than K steps after it started; the trainer
waits for a straggler whose place in the batch is owed, and admission keeps generating
plus buffered plus taken groups within the window (``pace_window``) (``engine``).

The loss normalizer: the mean over the batch's rollouts (Miles' default), or, with the
``:wnorm`` suffix (``protect:0.5:wnorm``, label ``protect-a0.5-wnorm``), the loss divided
by the sum of the rollouts' loss weights. Protect's 1/a weights raise its expected step by
1/P(kept) under the mean; normalized by the weights they do not, which separates the arm's
direction from its step size (prediction P6). Only protect has weights other than 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from rescue import arms
from rescue.arms import ArmDef, Scaling
from rescue.errors import InputError
from rescue.gate import Arm

#: Every arm name the simulator accepts (``rescue.arms``' ``simulator`` column).
ARMS: tuple[str, ...] = arms.names(simulator=True)
#: The keep probabilities of the default protect runs.
DEFAULT_A: tuple[float, ...] = (0.5, 0.1)

#: The arms ``rescue sim`` runs without a scenario: every arm, protect at a = 0.5 and 0.1.
DEFAULT_ARMS: tuple[str, ...] = tuple(
    item
    for name in ARMS
    for item in ((f"{name}:{a:g}" for a in DEFAULT_A) if arms.ARMS[name].takes_a else (name,))
)

#: Loss normalizers: the batch's rollouts (default) or the sum of their loss weights.
LOSS_NORMS: tuple[str, ...] = ("rollouts", "weights")
_WNORM = "wnorm"


@dataclass(frozen=True)
class ArmSpec:
    """One arm, resolved to what the gate, the filter and the normalizer do.

    Args:
        name: one of ``ARMS``.
        a: keep probability of a stale group under ``protect`` (0 < a <= 1); None otherwise.
        loss_norm: ``rollouts`` (default) or ``weights`` (protect only).
    """

    name: str
    a: float | None = None
    loss_norm: str = "rollouts"

    def __post_init__(self) -> None:
        name = arms.canonical(self.name)
        if name is None or name not in ARMS:
            raise InputError(f"arm={self.name!r} is not an arm; allowed: {', '.join(ARMS)}")
        object.__setattr__(self, "name", name)
        if self.definition.takes_a:
            if self.a is None or not (0.0 < float(self.a) <= 1.0):
                raise InputError(f"--a={self.a!r} for arm protect; allowed: 0 < a <= 1")
            object.__setattr__(self, "a", float(self.a))
        elif self.a is not None:
            object.__setattr__(self, "a", None)  # a is meaningful for protect only
        if self.loss_norm not in LOSS_NORMS:
            raise InputError(f"loss_norm={self.loss_norm!r}; allowed: {', '.join(LOSS_NORMS)}")
        if self.loss_norm == "weights" and self.name != "protect":
            raise InputError(
                f"arm {self.name}: only protect has loss weights to normalize by (:{_WNORM})"
            )

    @classmethod
    def parse(cls, text: str, *, default_a: float = 0.5) -> ArmSpec:
        """``"drop"``, ``"protect"`` (uses ``default_a``), ``"protect:0.1"``, ``"protect:0.5:wnorm"``."""
        name, *opts = (p.strip() for p in text.strip().lower().split(":"))
        name = arms.canonical(name) or name.replace("_", "-")
        norm = "weights" if opts and opts[-1] == _WNORM else "rollouts"
        if norm == "weights":
            opts = opts[:-1]
        if len(opts) > 1 or (opts and name != "protect"):
            raise InputError(
                f"arm {text!r}: only protect takes ':a'; allowed: protect:A[:{_WNORM}] with 0 < A <= 1"
            )
        if name != "protect":
            return cls(name, loss_norm=norm)
        try:
            a = float(opts[0]) if opts and opts[0] else float(default_a)
        except ValueError:
            raise InputError(
                f"arm {text!r}: a={opts[0]!r} is not a number; allowed: 0 < a <= 1"
            ) from None
        return cls(name, a, norm)

    @property
    def definition(self) -> ArmDef:
        """The arm's entry in ``rescue.arms``."""
        return arms.ARMS[self.name]

    @property
    def label(self) -> str:
        """Name used in files, plots and tables, e.g. ``protect-a0.5`` or ``protect-a0.5-wnorm``."""
        out = f"protect-a{self.a:g}" if self.name == "protect" else self.name
        return out + (f"-{_WNORM}" if self.loss_norm == "weights" else "")

    @property
    def text(self) -> str:
        """The arm as ``--arms`` spells it (``protect:0.5:wnorm``); ``parse`` reads it back."""
        if self.name != "protect":
            return self.name
        return f"protect:{self.a:g}" + (f":{_WNORM}" if self.loss_norm == "weights" else "")

    @property
    def gate_arm(self) -> Arm:
        """The ``rescue.gate.Arm`` of this arm (budget arms never drop)."""
        return Arm.of(self.name)

    @property
    def pace(self) -> bool:
        """Whether the trainer bounds staleness by waiting for stragglers."""
        return self.gate_arm is Arm.PACE

    @property
    def mask(self) -> bool:
        """Whether capped rollouts are loss-masked (``rescue.mask.mask_decision``, rho = 1)."""
        return self.definition.mask

    @property
    def matched(self) -> bool:
        """Whether each step is rescaled to the R = 0 step's update norm on the same batch."""
        return self.definition.scaling is Scaling.MATCHED

    @property
    def step_control(self) -> bool:
        """Whether each step is R = 0's, rescaled to the mask step's update norm on the same
        batch (the step-size control)."""
        return self.definition.scaling is Scaling.STEP

    @property
    def population(self) -> str:
        """Baseline population of ``rescue.advantages.group_advantages``."""
        return self.definition.population

    @property
    def turn_baseline(self) -> bool:
        """Whether advantages are per turn with ``turn_reached_baseline``."""
        return self.definition.estimator == "turn"

    @property
    def behaviour(self) -> tuple:
        """What the run does; two arms with the same behaviour give identical runs."""
        return (
            self.gate_arm.value,
            self.a,
            self.mask,
            self.definition.scaling.value,
            self.population,
            self.turn_baseline,
            self.loss_norm,
        )


def parse_arms(text: str, *, default_a: float = 0.5) -> list[ArmSpec]:
    """A comma-separated list of arms (``--arms``); duplicates are an error."""
    specs = [ArmSpec.parse(t, default_a=default_a) for t in text.split(",") if t.strip()]
    if not specs:
        raise InputError(f"--arms={text!r} names no arm; allowed: {', '.join(ARMS)}")
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise InputError(f"--arms names {', '.join(dup)} more than once")
    return specs
