"""Settings of the simulator and the arms it compares.

Specification
-------------
``SimConfig`` holds every parameter of one simulated run (environment, timing, trainer);
each field documents its default and the CLI flag that sets it. Nothing here is tuned to
make a prediction hold: the values are set once, from the shape of a SWE agent run (a
40-turn cap, groups of 8, 16 groups per step, test runs costing a few edits' time).

An *arm* is one way of handling outcome-dependent exclusion (``ArmSpec``):

==================  ================  ===================  ============  ================
arm                 stale groups      capped rollouts      baseline      advantage
==================  ================  ===================  ============  ================
``drop``            dropped (K)       R = 0, trained       all G         per rollout
``never-drop``      kept, weight 1    R = 0, trained       all G         per rollout
``protect``         coin a, 1/a       R = 0, trained       all G         per rollout
``mask``            kept, weight 1    loss-masked (R = 0)  all G         per rollout
``zero``            kept, weight 1    R = 0, trained       all G         per rollout
``survivor``        kept, weight 1    loss-masked          survivors     per rollout
``turn-baseline``   kept, weight 1    R = 0, trained       turn-reached  per turn
==================  ================  ===================  ============  ================

The stale arms keep capped rollouts at R = 0 and the budget arms never drop, so each
arm changes one thing. ``zero`` and ``never-drop`` are therefore the same configuration
and give identical runs for a seed (the runner computes it once).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rescue.errors import InputError
from rescue.gate import Arm

#: Every arm name the simulator accepts.
ARMS: tuple[str, ...] = (
    "drop",
    "never-drop",
    "protect",
    "mask",
    "zero",
    "survivor",
    "turn-baseline",
)

#: The arms ``make demo`` runs: every arm, and protect at a = 0.5 and a = 0.1 (prediction P6).
DEFAULT_ARMS: tuple[str, ...] = (
    "drop",
    "never-drop",
    "protect:0.5",
    "protect:0.1",
    "mask",
    "zero",
    "survivor",
    "turn-baseline",
)


@dataclass(frozen=True)
class ArmSpec:
    """One arm, resolved to what the gate, the filter and the normalizer do.

    Args:
        name: one of ``ARMS``.
        a: keep probability of a stale group under ``protect`` (0 < a <= 1); None otherwise.
    """

    name: str
    a: float | None = None

    def __post_init__(self) -> None:
        if self.name not in ARMS:
            raise InputError(f"arm={self.name!r} is not an arm; allowed: {', '.join(ARMS)}")
        if self.name == "protect":
            if self.a is None or not (0.0 < float(self.a) <= 1.0):
                raise InputError(f"--a={self.a!r} for arm protect; allowed: 0 < a <= 1")
            object.__setattr__(self, "a", float(self.a))
        elif self.a is not None:
            object.__setattr__(self, "a", None)  # a is meaningful for protect only

    @classmethod
    def parse(cls, text: str, *, default_a: float = 0.5) -> ArmSpec:
        """``"drop"``, ``"protect"`` (uses ``default_a``) or ``"protect:0.1"``."""
        name, _, a_text = text.strip().lower().partition(":")
        name = name.replace("_", "-")
        if a_text and name != "protect":
            raise InputError(
                f"arm {text!r}: only protect takes ':a'; allowed: protect:A with 0 < A <= 1"
            )
        if name != "protect":
            return cls(name)
        try:
            a = float(a_text) if a_text else float(default_a)
        except ValueError:
            raise InputError(
                f"arm {text!r}: a={a_text!r} is not a number; allowed: 0 < a <= 1"
            ) from None
        return cls(name, a)

    @property
    def label(self) -> str:
        """Name used in files, plots and tables, e.g. ``protect-a0.5``."""
        return f"protect-a{self.a:g}" if self.name == "protect" else self.name

    @property
    def gate_arm(self) -> Arm:
        """The ``rescue.gate.Arm`` of this arm (budget arms never drop)."""
        if self.name in ("drop", "protect"):
            return Arm(self.name)
        return Arm.NEVER_DROP

    @property
    def mask(self) -> bool:
        """Whether capped rollouts are loss-masked (``rescue.mask.mask_decision``, rho = 1)."""
        return self.name in ("mask", "survivor")

    @property
    def population(self) -> str:
        """Baseline population of ``rescue.advantages.group_advantages``."""
        return "survivors" if self.name == "survivor" else "all"

    @property
    def turn_baseline(self) -> bool:
        """Whether advantages are per turn with ``turn_reached_baseline``."""
        return self.name == "turn-baseline"

    @property
    def behaviour(self) -> tuple:
        """What the run does; two arms with the same behaviour give identical runs."""
        return (self.gate_arm.value, self.a, self.mask, self.population, self.turn_baseline)


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


def _initial_logits() -> tuple[tuple[float, ...], ...]:
    """Logits of the untrained policy (a pretrained agent's habits), rows as in ``policy``."""
    return (
        # strategy: fast, thorough
        (0.0, 0.0, 0.0),
        # fast: edit, (test: not available), submit; phases start, edited x1/x2/x3+, -, -
        (2.0, 0.0, -2.0),
        (0.5, 0.0, 0.0),
        (0.0, 0.0, 0.5),
        (-0.5, 0.0, 1.0),
        (0.0, 0.0, 0.0),
        (0.0, 0.0, 0.0),
        # thorough: edit, test, submit; phases start, edited x1/x2/x3+, tests fail, tests pass
        (2.0, 0.0, -2.0),
        (0.0, 1.5, -2.5),
        (0.0, 1.5, -2.5),
        (0.0, 1.5, -2.0),
        (1.5, -1.0, -3.0),
        (-1.0, -1.0, 2.0),
    )


@dataclass(frozen=True)
class SimConfig:
    """Every parameter of one simulated run. Time is in abstract units (an edit ~ 1).

    Trainer and asynchrony:
        steps: trainer steps (policy updates) per run (default 300; ``--steps``).
        groups_per_step: groups B in one training batch (default 16; ``--groups-per-step``).
        group_size: rollouts G per group (default 8; ``--group-size``).
        concurrency: groups generated at once (default 16, Miles' default of one batch;
            ``--concurrency``).
        buffer_capacity: completed groups the buffer holds before a finished worker
            blocks (default 32; ``--buffer-capacity``).
        train_time: time one policy update takes (default 4.0; ``--train-time``).
        max_staleness: K, a group is stale when its staleness exceeds K (default 1;
            ``--max-staleness``). Staleness = trainer version at ``get`` minus the
            version the group was generated with.
        lr: step size of the policy-gradient ascent (default 0.1; ``--lr``).
        std_normalize: divide advantages by the group std (GRPO; default True).
        kappa: shrinkage κ of the turn-reached baseline (default 2.0; ``--kappa``).

    Environment:
        max_turns: the turn cap; a rollout that has not submitted by then is a budget
            failure (default 40; ``--max-turns``).
        infra_rate: probability that a rollout is lost to an infrastructure fault
            (default 0.005; ``--infra-rate``). A lost rollout aborts its group, as an
            ABORTED sample does in Miles.
        difficulty: (k, probability) pairs: a task needs k correct edits with that
            probability (default ((1, 0.3), (2, 0.25), (3, 0.2), (5, 0.1), (15, 0.15))).
        blind_edit: (progress, regress) probabilities of an edit made without a failing
            test to go on (default (0.6, 0.15)).
        informed_edit: the same after a failing test run (default (0.7, 0.1)).
        turn_time: wall-clock of an edit, a test run and a submit at turn 1
            (default (1.0, 3.0, 1.0)).
        context_growth: each later turn takes this fraction longer (default 0.03: turn 40
            takes 2.2x turn 1).
        time_noise: log-normal sigma of every turn's wall-clock (default 0.3).
        initial_logits: the untrained policy, one row of 3 logits per decision row
            (``policy.ROWS``).
    """

    steps: int = 300
    groups_per_step: int = 16
    group_size: int = 8
    concurrency: int = 16
    buffer_capacity: int = 32
    train_time: float = 4.0
    max_staleness: int = 1
    lr: float = 0.1
    std_normalize: bool = True
    kappa: float = 2.0
    max_turns: int = 40
    infra_rate: float = 0.005
    difficulty: tuple[tuple[int, float], ...] = (
        (1, 0.3),
        (2, 0.25),
        (3, 0.2),
        (5, 0.1),
        (15, 0.15),
    )
    blind_edit: tuple[float, float] = (0.6, 0.15)
    informed_edit: tuple[float, float] = (0.7, 0.1)
    turn_time: tuple[float, float, float] = (1.0, 3.0, 1.0)
    context_growth: float = 0.03
    time_noise: float = 0.3
    initial_logits: tuple[tuple[float, ...], ...] = field(default_factory=_initial_logits)

    def __post_init__(self) -> None:
        positive_ints = (
            "steps",
            "groups_per_step",
            "group_size",
            "concurrency",
            "buffer_capacity",
            "max_turns",
        )
        for name in positive_ints:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"--{name.replace('_', '-')}={v!r}; allowed: an integer >= 1")
        if (
            isinstance(self.max_staleness, bool)
            or not isinstance(self.max_staleness, int)
            or self.max_staleness < 0
        ):
            raise InputError(f"--max-staleness={self.max_staleness!r}; allowed: an integer >= 0")
        for name in ("train_time", "lr", "kappa", "context_growth", "time_noise"):
            if not (getattr(self, name) >= 0):
                raise InputError(
                    f"--{name.replace('_', '-')}={getattr(self, name)!r}; allowed: a number >= 0"
                )
        if not (0.0 <= self.infra_rate < 1.0):
            raise InputError(f"--infra-rate={self.infra_rate!r}; allowed: 0 <= rate < 1")
        ks = [k for k, _ in self.difficulty]
        ps = [p for _, p in self.difficulty]
        if not ks or min(ks) < 1 or min(ps) < 0 or abs(sum(ps) - 1) > 1e-9:
            raise InputError(
                f"difficulty={self.difficulty!r}; allowed: (k >= 1, probability) pairs summing to 1"
            )
        for name in ("blind_edit", "informed_edit"):
            q, r = getattr(self, name)
            if not (q >= 0 and r >= 0 and q + r <= 1):
                raise InputError(
                    f"{name}={(q, r)!r}; allowed: progress, regress >= 0 with sum <= 1"
                )
        if len(self.turn_time) != 3 or min(self.turn_time) <= 0:
            raise InputError(
                f"turn_time={self.turn_time!r}; allowed: three positive times (edit, test, submit)"
            )

    def replace(self, **changes) -> SimConfig:
        """A copy with some fields changed (validated again)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InputError(
                f"unknown simulator setting(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return SimConfig(**values)
