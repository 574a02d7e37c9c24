"""Runs as the judge sees them: which arm and seed, and the rows they logged.

Specification
-------------
A run is identified by its *condition* (family, arm, and the arm's settings a, k, cap)
and its seed. Real runs carry them the way the launchers write them:

- wandb group / run name
  ``<family>-<arm>[-a<A>][-k<K>][-cap<CAP>][-est-turn][-drgrpo][-tis|-tis-sc]-seed<SEED>``
  (family ``swe`` or ``rlvr``), e.g. ``swe-protect-a0.5-k2-seed1``; ``-est-turn`` and
  ``-drgrpo`` name a stale-handling arm run with the turn-reached estimator or Dr. GRPO
  (the launchers' ``ESTIMATOR=turn``, ``DRGRPO=1``); ``-tis`` / ``-tis-sc`` an off-policy
  correction other than the family's default (``OFFPOLICY``);
- wandb tags ``arm:<arm>,seed:<seed>[,a:..][,k:..][,cap:..][,estimator:turn][,drgrpo:1]
  [,offpolicy:..]`` (tags win over the name).

The simulator also runs variants of an arm (``VARIANTS``: ``wnorm``, protect with its
loss divided by the sum of its weights), named ``<arm>[-a<A>]-<variant>`` (tag
``variant:<v>``): their own label in the cohort, and the arm's roles in the predictions.

The simulator's runs have family ``sim`` and an arm label such as ``protect-a0.5``
(``<arm>[-a<A>]``). Arms come from the shared vocabulary ``ARM_NAMES`` (``rescue.arms``);
an old spelling (``ALIASES``: ``turn-baseline``, which simulator runs written before the
vocabulary was one still carry) is read as its arm.

Runs of one *cohort* are compared with each other; the arm label within a cohort keeps a
and k (``drop-k2``, ``protect-a0.5-k2``). A cohort is one family, cap and *setting* (the
estimator and Dr. GRPO named above, so an arm is never compared with another trained under
a different estimator), one *scenario* (the simulator's ``scenario`` field, or a tag
``scenario:<name>``) and one value of every *compared setting* on which its runs differ:
the simulator's settings for ``sim`` runs (every key of the run's config but its identity,
``SIM_IDENTITY``: the simulator writes its whole ``SimConfig`` there), ``REAL_SETTINGS``
for the cluster's, read from the run's config (``cohorts``). Runs of different scenarios
or settings are never pooled; two runs of the same arm and seed in one cohort are a
*collision*: the first read is kept and the report says so at its top.

A run's rows are the history rows it logged (dicts of metric key -> number). Columns are
built on first use and cached: ``Run.column(key)`` is a float array over the rows, NaN
where a row lacks the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rescue import arms
from rescue.errors import InputError

#: Stale-handling and budget-regime arms (the shared vocabulary, ``rescue.arms``), and the
#: old spellings still read.
ARM_NAMES: tuple[str, ...] = arms.NAMES
ALIASES: dict[str, str] = arms.ALIASES


FAMILIES: tuple[str, ...] = ("swe", "rlvr", "sim")
#: Step key of rollout-side metrics on the cluster and in the simulator's JSONL.
STEP_KEY = "rollout/step"

_ARM_RE = "|".join(re.escape(a) for a in sorted((*ARM_NAMES, *ALIASES), key=len, reverse=True))
_NUM = r"[0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?"
#: Variants of an arm the simulator runs beside it, judged in the arm's roles: ``wnorm``,
#: protect with its loss divided by the sum of the weights (label ``protect-a0.5-wnorm``).
VARIANTS: tuple[str, ...] = ("wnorm",)
_TAIL = (
    rf"(?P<arm>{_ARM_RE})(?:-a(?P<a>{_NUM}))?(?:-k(?P<k>[0-9]+))?"
    r"(?:-cap(?P<cap>[0-9]+))?(?P<setting>(?:-est-turn)?(?:-drgrpo)?(?:-tis-sc|-tis)?)"
    rf"(?:-(?P<variant>{'|'.join(VARIANTS)}))?(?:-seed(?P<seed>[0-9]+))?$"
)
#: A name without a family (the simulator's labels), then one with a family prefix.
_NAMES = (re.compile("^" + _TAIL), re.compile(r"^(?P<family>[a-z0-9]+)-" + _TAIL))


@dataclass(frozen=True)
class Condition:
    """What distinguishes one arm's runs from another's, seed aside."""

    family: str = "sim"
    arm: str = "zero"
    a: float | None = None
    k: int | None = None
    cap: int | None = None
    variant: str | None = None
    #: How the batch becomes a gradient when not the default: ``est-turn``, ``drgrpo`` or
    #: ``est-turn-drgrpo`` (None: the group estimator without Dr. GRPO).
    setting: str | None = None
    #: The simulator scenario the run belongs to (None: none named).
    scenario: str | None = None

    @property
    def label(self) -> str:
        """The arm label inside its cohort: ``<arm>[-a<A>][-k<K>][-<variant>]`` (e.g.
        ``protect-a0.5-k2``, ``protect-a0.5-wnorm``)."""
        out = self.arm
        if self.a is not None:
            out += f"-a{self.a:g}"
        if self.k is not None:
            out += f"-k{self.k}"
        if self.variant is not None:
            out += f"-{self.variant}"
        return out

    @property
    def cohort(self) -> tuple[str, int | None, str | None, str | None]:
        """Runs with the same family, cap, setting and scenario may be compared (``cohorts``
        splits them further by the compared settings on which they differ)."""
        return (self.family, self.cap, self.setting, self.scenario)

    @property
    def base_arm(self) -> str:
        """The vocabulary name (an old spelling such as ``turn-baseline`` is its arm's)."""
        return ALIASES.get(self.arm, self.arm)


def parse_name(text: str) -> tuple[Condition, int | None] | None:
    """``(condition, seed)`` of a group / run name or a simulator label, else None.

    ``swe-protect-a0.5-k2-seed1`` -> (swe, protect, a=0.5, k=2), seed 1;
    ``protect-a0.5`` -> (sim, protect, a=0.5), no seed; ``drop-seed3`` -> (sim, drop), 3.
    """
    text = text.strip().lower()
    for pattern in _NAMES:
        m = pattern.match(text)
        if m is None:
            continue
        cond = Condition(
            family=m.groupdict().get("family") or "sim",
            arm=m["arm"],
            a=float(m["a"]) if m["a"] else None,
            k=int(m["k"]) if m["k"] else None,
            cap=int(m["cap"]) if m["cap"] else None,
            variant=m["variant"] or None,
            setting=m["setting"].lstrip("-") or None,
        )
        return cond, (int(m["seed"]) if m["seed"] else None)
    return None


def parse_tags(tags: Iterable[str] | str) -> dict[str, str]:
    """``arm:protect,seed:1,a:0.5`` (a string or a list) -> ``{"arm": "protect", ...}``."""
    items = tags.split(",") if isinstance(tags, str) else list(tags)
    out = {}
    for t in items:
        key, sep, value = str(t).strip().partition(":")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def identify(
    *,
    tags: Iterable[str] | str = (),
    group: str | None = None,
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    where: str = "run",
) -> tuple[Condition, int]:
    """The condition and seed of a run from its tags, group, name or config.

    Each field comes from the tags when they have it (``arm``, ``seed``, ``a``, ``k``, ``variant``,
    ``cap``), else from the group name, else the run name, else the config's ``arm`` /
    ``seed`` (the simulator writes those). Raises ``ValueError`` naming ``where`` when
    nothing says which arm and seed.
    """
    t = parse_tags(tags)
    config = config or {}
    named = [p for p in (parse_name(group or ""), parse_name(name or "")) if p is not None]
    cond = named[0][0] if named else None
    seed = next((s for _, s in named if s is not None), None)
    arm_text = t.get("arm") or config.get("arm")
    if arm_text:
        spec = parse_name(str(arm_text))  # "protect" from a tag, "protect-a0.5" from a config
        if spec is None:
            raise InputError(
                f"{where}: arm {arm_text!r}; allowed: {', '.join(ARM_NAMES)} (or {', '.join(ALIASES)})"
            )
        arm = spec[0]
        same = cond is not None and cond.base_arm == arm.base_arm
        cond = Condition(
            family=cond.family if cond else "sim",
            arm=arm.arm,
            a=_num(t.get("a"), float, arm.a if arm.a is not None else (cond.a if same else None)),
            k=_num(t.get("k"), int, arm.k if arm.k is not None else (cond.k if same else None)),
            cap=_num(t.get("cap"), int, cond.cap if cond else None),
            variant=t.get("variant") or arm.variant or (cond.variant if same else None),
            setting=cond.setting if cond else None,
        )
    if cond is not None and ("estimator" in t or "drgrpo" in t or "offpolicy" in t):
        cond = replace(cond, setting=_setting(t, cond.setting))
    scenario = t.get("scenario") or config.get("scenario")
    if cond is not None and scenario:
        cond = replace(cond, scenario=str(scenario))
    seed = _num(t.get("seed", config.get("seed")), int, seed)
    if cond is None or seed is None:
        raise InputError(
            f"{where}: cannot tell the arm and seed (group {group!r}, name {name!r}, tags "
            f"{sorted(t)}); allowed: a group or name "
            "<family>-<arm>[-a<A>][-k<K>][-cap<CAP>][-est-turn][-drgrpo][-tis|-tis-sc]-seed<SEED>, "
            "or tags arm:<arm>,seed:<seed>"
        )
    return cond, int(seed)


def _setting(tags: Mapping[str, str], named: str | None) -> str | None:
    """The setting from the tags ``estimator:group|turn``, ``drgrpo:0|1`` and
    ``offpolicy:tis|tis-sc`` (the launchers tag a correction other than their family's
    default), each falling back to the name's."""
    named = named or ""
    turn = tags.get("estimator", "turn" if "est-turn" in named else "group")
    drgrpo = tags.get("drgrpo", "1" if "drgrpo" in named else "0")
    named_offpolicy = (
        "tis-sc" if named.endswith("tis-sc") else "tis" if named.endswith("tis") else ""
    )
    offpolicy = tags.get("offpolicy", named_offpolicy)
    for key, value, allowed in (
        ("estimator", turn, ("group", "turn")),
        ("drgrpo", drgrpo, ("0", "1")),
        ("offpolicy", offpolicy, ("", "tis", "tis-sc")),
    ):
        if value not in allowed:
            raise InputError(f"tag {key}:{value}; allowed: {', '.join(a for a in allowed if a)}")
    parts = (["est-turn"] if turn == "turn" else []) + (["drgrpo"] if drgrpo == "1" else [])
    parts += [offpolicy] if offpolicy else []
    return "-".join(parts) or None


def _num(text: Any, kind: type, default: Any) -> Any:
    if text is None or text == "":
        return default
    try:
        return kind(float(text)) if kind is int else kind(text)
    except (TypeError, ValueError):
        return default


@dataclass
class Run:
    """One run: its condition, seed, history rows and (simulator) offline figures.

    Attributes:
        condition: family, arm, a, k, cap.
        seed: the run's seed.
        rows: history rows, in logged order.
        source: where it was read from.
        offline: extra per-run figures, e.g. ``{"p7": {"group_mean": ..., ...}}`` from the
            simulator's ``runs.json``.
        config: the run's settings (wandb config, or the simulator's ``SimConfig``), for
            ``cohorts``; empty when unknown.
        notes: what reading the run noticed, for the report (a resumed run's steps read
            once, ``rescue.judge.lives``).
    """

    condition: Condition
    seed: int
    rows: list[dict[str, Any]]
    source: str = ""
    offline: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _columns: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _keys: set[str] | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return self.condition.label

    def keys(self) -> set[str]:
        """Every key some row has."""
        if self._keys is None:
            keys: set[str] = set()
            for r in self.rows:
                keys.update(r)
            self._keys = keys
        return self._keys

    def has(self, key: str) -> bool:
        return key in self.keys()

    def column(self, key: str) -> np.ndarray:
        """Float values of ``key`` per row; NaN where a row lacks it or holds no number."""
        col = self._columns.get(key)
        if col is None:
            col = np.fromiter((_float(r.get(key)) for r in self.rows), float, len(self.rows))
            self._columns[key] = col
        return col

    def zeroed(self, key: str) -> np.ndarray:
        """``column(key)`` with NaN read as 0 (cached, read-only): an outcome that did not
        occur in a step has no count there."""
        cached = self._columns.get("\0" + key)
        if cached is None:
            cached = np.nan_to_num(self.column(key), nan=0.0)
            cached.setflags(write=False)
            self._columns["\0" + key] = cached
        return cached

    def steps(self) -> np.ndarray:
        """The step of each row: ``rollout/step``, else wandb's ``_step``, else the row index."""
        for key in (STEP_KEY, "_step"):
            if self.has(key):
                col = self.column(key)
                idx = np.arange(len(self.rows), dtype=float)
                return np.where(np.isfinite(col), col, idx)
        return np.arange(len(self.rows), dtype=float)


def _float(v: Any) -> float:
    if v is None or isinstance(v, bool):
        return math.nan if v is None else float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return math.nan
    return math.nan


Cohort = dict[str, dict[int, Run]]

#: Settings of a cluster run (Miles' argument names, from its wandb config) that must agree
#: between the arms of one cohort; the arm's own settings (staleness K, the filter, the
#: estimator) are named in the run's group or tags instead.
REAL_SETTINGS: tuple[str, ...] = (
    "hf_checkpoint",
    "lr",
    "n_samples_per_prompt",
    "rollout_batch_size",
    "global_batch_size",
    "prompt_data",
    "rollout_max_response_len",
)


def config_value(run: Run, key: str) -> Any:
    """The run's config value of ``key`` (wandb's ``{"value": x}`` unwrapped), or None."""
    v = run.config.get(key)
    if isinstance(v, dict) and set(v) == {"value"}:  # wandb's {"value": x}
        v = v["value"]
    return v


#: What a simulator run's config holds beside its settings: the run's identity (the
#: simulator writes ``SimConfig`` plus these; wandb adds keys starting with ``_``).
SIM_IDENTITY = frozenset({"arm", "seed", "scenario"})


def compared_settings(run: Run) -> dict[str, str]:
    """The run's values of the settings its cohort must agree on (present ones only)."""
    if run.condition.family == "sim":
        keys: tuple[str, ...] = tuple(
            k for k in run.config if k not in SIM_IDENTITY and not k.startswith("_")
        )
    else:
        keys = REAL_SETTINGS
    out = {}
    for k in keys:
        if k in run.config:
            out[k] = json_text(config_value(run, k))
    return out


def json_text(v: Any) -> str:
    """A setting's value as comparable text (tuples and lists alike)."""
    import json

    return json.dumps(v, sort_keys=True, default=str).replace("[", "(").replace("]", ")")


@dataclass(frozen=True)
class CohortKey:
    """What one cohort's runs share: family, cap, setting, scenario, and the values of the
    compared settings on which the runs read together differed."""

    family: str
    cap: int | None = None
    setting: str | None = None
    scenario: str | None = None
    differs: tuple[tuple[str, str], ...] = ()

    def sort_key(self) -> tuple:
        return (self.family, self.cap or 0, self.setting or "", self.scenario or "", self.differs)


def cohorts(runs: Sequence[Run]) -> tuple[dict[CohortKey, Cohort], list[str]]:
    """Runs grouped by cohort, then arm label, then seed; and a note per collision.

    Runs are first grouped by ``Condition.cohort``; within a group, every compared setting
    (``compared_settings``) that all its runs logged and on which they differ splits it
    further. The first run of a (cohort, label, seed) wins; a later one is skipped and
    named.
    """
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.condition.cohort, []).append(r)
    out: dict[CohortKey, Cohort] = {}
    notes = []
    for (family, cap, setting, scenario), members in groups.items():
        values = [compared_settings(r) for r in members]
        shared = set.intersection(*(set(v) for v in values)) if values else set()
        differ = sorted(k for k in shared if len({v[k] for v in values}) > 1)
        for r, v in zip(members, values, strict=True):
            key = CohortKey(family, cap, setting, scenario, tuple((k, v[k]) for k in differ))
            seeds = out.setdefault(key, {}).setdefault(r.label, {})
            if r.seed in seeds:
                notes.append(
                    f"{r.source}: {r.condition.family} {r.label} seed {r.seed} already read from "
                    f"{seeds[r.seed].source} in the same cohort; skipped"
                )
                continue
            seeds[r.seed] = r
    return out, notes
