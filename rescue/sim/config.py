"""Every parameter of one simulated run, in one table: ``SimConfig``.

Specification
-------------
Each field of ``SimConfig`` carries its help text and its kind (``Kind``) in the field's
metadata. From that one table come:

- the flags of ``rescue sim`` (``--<name-with-dashes>``, help with the default; booleans as
  ``--name`` / ``--no-name``), built by ``rescue.sim.cli``;
- the keys of a scenario file (``rescue.sim.scenario``): the same names, with dashes or
  underscores, TOML values;
- validation: a bad value is an ``InputError`` naming the flag and what is allowed.

A value on the command line is text: numbers as usual, a tuple comma-separated
(``--turn-time 1,3,1``), ``difficulty`` as ``k:probability`` pairs (``--difficulty
1:0.5,3:0.5``), ``initial-logits`` as rows separated by ``;`` (``0,0,0;2,0,-2;...``).

Nothing here is tuned to make a prediction hold: the defaults are set once, from the
shape of a SWE agent run (a 40-turn cap, groups of 8, 16 groups per step, test runs
costing a few edits' time) and are the ``swe-like`` scenario.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from rescue.errors import InputError
from rescue.sim.arms import ARMS, DEFAULT_ARMS, LOSS_NORMS, ArmSpec, parse_arms
from rescue.sim.policy import CHOICES, ROWS

__all__ = [
    "ARMS",
    "BASELINE_SCOPES",
    "DEFAULT_ARMS",
    "EPISODE_MODELS",
    "LOSS_NORMS",
    "ArmSpec",
    "Kind",
    "SimConfig",
    "flag_name",
    "parse_arms",
    "settings",
]

#: The widest log-normal sigma of a turn's wall-clock (``time_noise``): e^(5 · 4) is already
#: a turn 10^8 times its median.
MAX_TIME_NOISE = 5.0
#: How an episode is played: the turn-by-turn agent, or the strategy table (``env``).
EPISODE_MODELS: tuple[str, ...] = ("agent", "table")
#: The rollouts a baseline is computed over.
BASELINE_SCOPES: tuple[str, ...] = ("group", "batch")


@dataclass(frozen=True)
class Kind:
    """What values a setting takes, and how they are read from a flag or a file.

    ``base``: ``int`` | ``float`` | ``bool`` | ``choice`` | ``ints`` | ``floats`` | ``pairs``
    (``(k, probability)`` pairs) | ``matrix`` (rows of ``cols`` floats); ``n`` is the
    length of a fixed tuple (0: any), ``choices`` the words a choice allows.
    """

    base: str
    n: int = 0
    cols: int = 0
    choices: tuple[str, ...] = ()

    @property
    def metavar(self) -> str:
        return {
            "int": "N",
            "float": "X",
            "choice": "{" + ",".join(self.choices) + "}",
            "ints": ",".join(["N"] * self.n),
            "floats": ",".join(["X"] * self.n),
            "pairs": "K:P,...",
            "matrix": "R;R;... (R = " + ",".join(["X"] * self.cols) + ")",
        }.get(self.base, "")

    def from_text(self, text: str, name: str) -> Any:
        """A flag's value from its text."""
        t = text.strip()
        try:
            if self.base == "int":
                return self.check(int(t), name)
            if self.base == "float":
                return self.check(float(t), name)
            if self.base == "choice":
                return self.check(t, name)
            if self.base in ("ints", "floats"):
                return self.check([x for x in t.split(",")], name)
            if self.base == "pairs":
                return self.check([p.split(":") for p in t.split(",")], name)
            if self.base == "matrix":
                return self.check([r.split(",") for r in t.split(";")], name)
        except ValueError:
            pass
        raise InputError(f"{flag_name(name)}={text!r}; allowed: {self.describe()}")

    def check(self, value: Any, name: str) -> Any:
        """A value of this kind (from a file or a flag), converted; else ``InputError``."""
        bad = InputError(f"{flag_name(name)}={value!r}; allowed: {self.describe()}")
        try:
            if self.base == "bool":
                if not isinstance(value, bool):
                    raise bad
                return value
            if self.base == "int":
                if isinstance(value, bool) or float(value) != int(float(value)):
                    raise bad
                return int(float(value))
            if self.base == "float":
                if isinstance(value, bool):
                    raise bad
                return float(value)
            if self.base == "choice":
                if value not in self.choices:
                    raise bad
                return str(value)
            if self.base in ("ints", "floats"):
                items = list(value)
                if isinstance(value, str) or (self.n and len(items) != self.n):
                    raise bad
                cast = Kind("int") if self.base == "ints" else Kind("float")
                return tuple(cast.check(x, name) for x in items)
            if self.base == "pairs":
                rows = [list(p) for p in value]
                if not rows or any(len(p) != 2 for p in rows):
                    raise bad
                return tuple((Kind("int").check(k, name), float(p)) for k, p in rows)
            if self.base == "matrix":
                rows = [list(r) for r in value]
                if not rows or any(len(r) != self.cols for r in rows):
                    raise bad
                return tuple(tuple(float(x) for x in r) for r in rows)
        except (TypeError, ValueError) as e:
            if isinstance(e, InputError):
                raise
            raise bad from None
        raise AssertionError(self.base)

    def describe(self) -> str:
        return {
            "bool": "true or false",
            "int": "an integer",
            "float": "a number",
            "choice": ", ".join(self.choices),
            "ints": f"{self.n} integers, comma-separated",
            "floats": f"{self.n or 'some'} numbers, comma-separated",
            "pairs": "k:probability pairs, comma-separated (k >= 1, probabilities summing to 1)",
            "matrix": f"rows of {self.cols} numbers, rows separated by ';'",
        }[self.base]

    def show(self, value: Any) -> str:
        """A value as it is written on the command line."""
        if self.base == "bool":
            return "on" if value else "off"
        if self.base in ("ints", "floats"):
            return ",".join(f"{x:g}" for x in value)
        if self.base == "pairs":
            return ",".join(f"{k}:{p:g}" for k, p in value)
        if self.base == "matrix":
            return ";".join(",".join(f"{x:g}" for x in r) for r in value)
        return f"{value:g}" if isinstance(value, float) else str(value)


def _s(default: Any, help: str, kind: Kind, group: str) -> Any:
    meta = {"help": help, "kind": kind, "group": group}
    if isinstance(default, tuple):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


def flag_name(name: str) -> str:
    """``--max-staleness`` for the field ``max_staleness``."""
    return "--" + name.replace("_", "-")


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


INT, FLOAT, BOOL = Kind("int"), Kind("float"), Kind("bool")
#: The buffer's capacity when ``--buffer-capacity`` is 0 and the pace window is not larger.
DEFAULT_BUFFER_CAPACITY = 32
T, E, X, P = "trainer", "environment", "strategy table (--episodes table)", "policy"


@dataclass(frozen=True)
class SimConfig:
    """Every parameter of one simulated run. Time is in abstract units (an edit ~ 1).

    Each field's help and kind are in its metadata (``settings()``); ``rescue sim --help``
    lists them with their defaults. Staleness = the trainer's version when it gets a group
    minus the version the group was launched with.
    """

    # trainer and asynchrony
    steps: int = _s(300, "trainer steps (policy updates) per run", INT, T)
    groups_per_step: int = _s(16, "groups B in one training batch", INT, T)
    group_size: int = _s(8, "rollouts G per group (a group's rollouts share a task)", INT, T)
    concurrency: int = _s(16, "groups generating at once (Miles' default: one batch)", INT, T)
    buffer_capacity: int = _s(
        0,
        "finished groups the buffer holds; a finished worker waits while it is full (0: "
        f"{DEFAULT_BUFFER_CAPACITY}, or the pace window when that is larger, so every arm, "
        "pace included, runs with the same buffer)",
        INT,
        T,
    )
    train_time: float = _s(4.0, "wall-clock of one policy update", FLOAT, T)
    max_staleness: int = _s(1, "K: a group is stale when its staleness exceeds K", INT, T)
    pace_window: int = _s(
        0,
        "pace: the admission window W, groups generating plus buffered plus taken this step "
        "(0: (K + 1) x groups-per-step; allowed groups-per-step..(K + 1) x groups-per-step)",
        INT,
        T,
    )
    lr: float = _s(0.1, "step size of the policy-gradient ascent", FLOAT, T)
    std_normalize: bool = _s(
        True, "divide advantages by the baseline population's std (GRPO)", BOOL, T
    )
    baseline_scope: str = _s(
        "group",
        "the rollouts a baseline is over: each group, or the whole batch as one group",
        Kind("choice", choices=BASELINE_SCOPES),
        T,
    )
    kappa: float = _s(2.0, "shrinkage κ of the turn-reached baseline", FLOAT, T)
    subsidy: bool = _s(
        False,
        "log the exact subsidy terms each step (sim/subsidy/*: the b·∇P(cap) and ∇J terms of "
        "the masked update along ∇P(cap), rescue.sim.subsidy); needs --episodes agent and "
        "--baseline-scope group; about a tenth of a run's time at a 12-turn cap, more at "
        "longer caps",
        BOOL,
        T,
    )
    tis: bool = _s(
        True,
        "truncated importance ratio min(π_now / π_launch, tis-clip) per decision (Miles' --use-tis)",
        BOOL,
        T,
    )
    tis_clip: float = _s(2.0, "upper clip of the importance ratio (Miles' --tis-clip)", FLOAT, T)
    score_centering: bool = _s(
        True,
        "score centering (rescue.score_centering): subtract each decision's launching-policy "
        "expected (tis-weighted) score; with tis, the plan's TIS + SC (cap tis-clip), the "
        "cluster's default (OFFPOLICY=tis-sc)",
        BOOL,
        T,
    )
    # environment
    episodes: str = _s(
        "agent",
        "episode model: the turn-by-turn agent, or the strategy table (fixed rates and turns)",
        Kind("choice", choices=EPISODE_MODELS),
        E,
    )
    max_turns: int = _s(40, "the turn cap: not submitted by then is a budget failure", INT, E)
    infra_rate: float = _s(
        0.005, "probability a rollout is lost to infrastructure (its group is aborted)", FLOAT, E
    )
    submit_failure: bool = _s(
        True,
        "a wrong submit ends the episode as a submitted failure; off: it is refused and the "
        "episode goes on (two outcomes: solved or capped)",
        BOOL,
        E,
    )
    difficulty: tuple[tuple[int, float], ...] = _s(
        ((1, 0.3), (2, 0.25), (3, 0.2), (5, 0.1), (15, 0.15)),
        "a task needs k correct edits with this probability",
        Kind("pairs"),
        E,
    )
    blind_edit: tuple[float, float] = _s(
        (0.6, 0.15),
        "(progress, regress) probabilities of an edit without a failing test",
        Kind("floats", 2),
        E,
    )
    informed_edit: tuple[float, float] = _s(
        (0.7, 0.1),
        "(progress, regress) probabilities of an edit after a failing test run",
        Kind("floats", 2),
        E,
    )
    turn_time: tuple[float, float, float] = _s(
        (1.0, 3.0, 1.0),
        "wall-clock of an edit, a test run and a submit at turn 1",
        Kind("floats", 3),
        E,
    )
    context_growth: float = _s(0.03, "each later turn takes this fraction longer", FLOAT, E)
    time_noise: float = _s(0.3, "log-normal sigma of every turn's wall-clock", FLOAT, E)
    # the strategy table
    table_success: tuple[float, float] = _s(
        (0.6, 0.9), "success probability of fast and of thorough", Kind("floats", 2), X
    )
    table_turns: tuple[int, int, int, int] = _s(
        (4, 4, 6, 6),
        "turns of a fast success, fast failure, thorough (early) success, thorough failure",
        Kind("ints", 4),
        X,
    )
    table_late: float = _s(0.9, "share of thorough's successes that are late", FLOAT, X)
    table_late_turns: int = _s(30, "turns of a late thorough success", INT, X)
    # policy
    initial_logits: tuple[tuple[float, ...], ...] = _s(
        _initial_logits(),
        "the untrained policy: 13 rows of 3 logits (policy.ROWS: strategy, then the action "
        "rows of fast and thorough by phase)",
        Kind("matrix", cols=3),
        P,
    )

    def __post_init__(self) -> None:
        for f in fields(self):  # kinds first: a string where a number belongs names its flag
            object.__setattr__(
                self, f.name, f.metadata["kind"].check(getattr(self, f.name), f.name)
            )
        for name in ("steps", "groups_per_step", "group_size", "concurrency", "max_turns",
                     "table_late_turns"):  # fmt: skip
            if getattr(self, name) < 1:
                raise InputError(
                    f"{flag_name(name)}={getattr(self, name)!r}; allowed: an integer >= 1"
                )
        for name in ("max_staleness", "pace_window", "buffer_capacity"):
            if getattr(self, name) < 0:
                raise InputError(
                    f"{flag_name(name)}={getattr(self, name)!r}; allowed: an integer >= 0"
                )
        for name in ("train_time", "lr", "kappa", "context_growth", "time_noise", "tis_clip"):
            if not (getattr(self, name) >= 0):
                raise InputError(
                    f"{flag_name(name)}={getattr(self, name)!r}; allowed: a number >= 0"
                )
        if not self.time_noise <= MAX_TIME_NOISE:  # a wider log-normal overflows the clock
            raise InputError(
                f"--time-noise={self.time_noise!r}; allowed: a number in [0, {MAX_TIME_NOISE:g}]"
            )
        most = (self.max_staleness + 1) * self.groups_per_step
        if self.pace_window and not self.groups_per_step <= self.pace_window <= most:
            raise InputError(
                f"--pace-window={self.pace_window}; allowed: 0 (the default, (K + 1) x "
                f"--groups-per-step = {most}) or from one batch ({self.groups_per_step}) to {most}"
            )
        if not (0.0 <= self.infra_rate < 1.0):
            raise InputError(f"--infra-rate={self.infra_rate!r}; allowed: 0 <= rate < 1")
        ks = [k for k, _ in self.difficulty]
        ps = [p for _, p in self.difficulty]
        if min(ks) < 1 or min(ps) < 0 or abs(sum(ps) - 1) > 1e-9:
            raise InputError(
                f"--difficulty={Kind('pairs').show(self.difficulty)}; allowed: k:probability "
                "pairs with k >= 1 and probabilities summing to 1"
            )
        for name in ("blind_edit", "informed_edit"):
            q, r = getattr(self, name)
            if not (q >= 0 and r >= 0 and q + r <= 1):
                raise InputError(
                    f"{flag_name(name)}={q:g},{r:g}; allowed: progress, regress >= 0 with sum <= 1"
                )
        if min(self.turn_time) <= 0:
            raise InputError(f"--turn-time={self.turn_time!r}; allowed: three positive times")
        for name in ("table_success",):
            if not all(0 <= p <= 1 for p in getattr(self, name)):
                raise InputError(
                    f"{flag_name(name)}={getattr(self, name)!r}; allowed: probabilities"
                )
        if not (0.0 <= self.table_late <= 1.0):
            raise InputError(f"--table-late={self.table_late!r}; allowed: 0 <= share <= 1")
        turns = (*self.table_turns, self.table_late_turns)
        if min(turns) < 1 or (self.episodes == "table" and max(turns) > self.max_turns):
            raise InputError(
                f"--table-turns={Kind('ints', 4).show(self.table_turns)}, --table-late-turns="
                f"{self.table_late_turns}; allowed: 1 <= turns <= --max-turns ({self.max_turns})"
            )
        if self.subsidy and (self.episodes != "agent" or self.baseline_scope != "group"):
            raise InputError(
                f"--subsidy with --episodes {self.episodes} --baseline-scope "
                f"{self.baseline_scope}; allowed: --episodes agent and --baseline-scope group "
                "(the terms are per group of one task, and the strategy table has no cap)"
            )
        if len(self.initial_logits) != ROWS:
            raise InputError(
                f"--initial-logits has {len(self.initial_logits)} rows; allowed: {ROWS} rows of {CHOICES}"
            )

    def replace(self, **changes: Any) -> SimConfig:
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

    @property
    def pace_limit(self) -> int:
        """The pace window W: ``pace_window``, or (K + 1) x B."""
        return self.pace_window or (self.max_staleness + 1) * self.groups_per_step

    @property
    def capacity(self) -> int:
        """The buffer's capacity: ``buffer_capacity``, or when 0 the larger of
        ``DEFAULT_BUFFER_CAPACITY`` and the pace window."""
        return self.buffer_capacity or max(DEFAULT_BUFFER_CAPACITY, self.pace_limit)


@dataclass(frozen=True)
class Setting:
    """One row of the config table: a field's name, default, help, kind and group."""

    name: str
    default: Any
    help: str
    kind: Kind
    group: str

    @property
    def flag(self) -> str:
        return flag_name(self.name)


def settings() -> list[Setting]:
    """The config table, in field order."""
    out = []
    for f in fields(SimConfig):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        m = f.metadata
        out.append(Setting(f.name, default, m["help"], m["kind"], m["group"]))
    return out
