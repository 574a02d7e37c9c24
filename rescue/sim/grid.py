"""A map's grid, declared in a file before it runs (``rescue sim map --grid FILE``).

Specification
-------------
A grid file is TOML::

    title = "where P3 can bite"                 # one line
    base = "budget-three-outcome"               # the preset scenario every cell starts from
    arms = ["zero", "mask", "matched", "step-control"]  # P3's arms (zero and mask required)
    seeds = 6                                   # seeds per arm and cell, from first-seed
    first-seed = 0
    rule = "..."                                # optional: a rule the map's result feeds,
                                                # written before the map ran, in words
    [placement]                                 # optional: that rule's numbers (the map
    steps = 300                                 # applies them: ``drift_map.placement``)
    min-ratio = 1.0
    min-b = 0.5
    [config]                                    # settings every cell takes (as a scenario's)
    subsidy = true

    [[axis]]                                    # one per axis, in the order of the table
    setting = "difficulty"                      # a SimConfig setting (dashes or underscores)
    what = "the level b reaches"                # what the axis stands for, in words
    labels = ["easy", "base", "hard"]           # optional names of the values
    values = [[[1, 0.5], [2, 0.5]], [[2, 0.4], [3, 0.4], [4, 0.2]], [[3, 0.4], [4, 0.6]]]

A cell is one value of every axis (their product, first axis slowest). Every value is
checked as the setting's flag would be (``SimConfig``), so a bad value is an error naming
the file, the axis and what is allowed, before anything runs. An axis on ``steps`` is the
run length: a cell of fewer steps is judged on the first steps of the longest run of its
other settings (a run is deterministic in its seed and its first n steps do not depend on
how many follow: ``tests/test_sim_map.py``), so each run is simulated once.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.sim import scenario as sc
from rescue.sim.arms import ArmSpec, parse_arms
from rescue.sim.config import SimConfig, settings

_TOP = ("title", "base", "arms", "seeds", "first-seed", "rule", "placement", "config", "axis")
_PLACEMENT = ("steps", "min-ratio", "min-b")
_AXIS = ("setting", "what", "labels", "values")
#: The arms a map runs: P3's (``matched`` optional).
REQUIRED_ARMS = ("zero", "mask")
#: The default grid, shipped in the package (``make map``).
DEFAULT = "p3-drift.toml"


@dataclass(frozen=True)
class Axis:
    """One axis: a setting, what it stands for, its values and their names."""

    setting: str
    what: str
    values: tuple[Any, ...]
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Cell:
    """One point of the grid: each axis' value index, and the cell's settings."""

    index: tuple[int, ...]
    config: SimConfig
    #: The settings the cell's runs are simulated with (``steps`` at the axis' longest).
    simulated: SimConfig

    def label(self, grid: Grid) -> str:
        return ", ".join(
            f"{a.setting} {a.labels[i]}" for a, i in zip(grid.axes, self.index, strict=True)
        )


@dataclass(frozen=True)
class Placement:
    """A placement rule's numbers: at run length ``steps``, the cells whose mask runs'
    subsidy ratio is at least ``min_ratio`` and final b at least ``min_b`` qualify."""

    steps: int
    min_ratio: float
    min_b: float


@dataclass(frozen=True)
class Grid:
    """A parsed grid file."""

    title: str
    base: str
    arms: tuple[ArmSpec, ...]
    seeds: tuple[int, ...]
    axes: tuple[Axis, ...]
    config: dict[str, Any] = field(default_factory=dict)
    rule: str = ""
    placement: Placement | None = None
    text: str = ""
    source: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def cells(self) -> list[Cell]:
        """Every cell, first axis slowest."""
        base = sc.preset(self.base)
        longest = max((max(a.values) for a in self.axes if a.setting == "steps"), default=None)
        out = []
        for index in itertools.product(*(range(len(a.values)) for a in self.axes)):
            values = {a.setting: a.values[i] for a, i in zip(self.axes, index, strict=True)}
            cfg = base.sim_config(**{**self.config, **values})
            sim = cfg if longest is None else cfg.replace(steps=longest)
            out.append(Cell(index, cfg, sim))
        return out


def _label(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_label(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse(text: str, *, where: str) -> Grid:
    """A grid from a file's text (``where`` names it in errors)."""
    data = sc._toml(text, where)
    unknown = sorted(set(data) - set(_TOP))
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_TOP)}"
        )
    base = str(data.get("base", "budget-three-outcome"))
    if base not in sc.names():
        raise InputError(f"{where}: base={base!r}; allowed: {', '.join(sc.names())}")
    arms_list = data.get("arms", ["zero", "mask", "matched"])
    if isinstance(arms_list, str) or not all(isinstance(a, str) for a in arms_list):
        raise InputError(f'{where}: arms must be a list of arm names, e.g. ["zero", "mask"]')
    try:
        arms = tuple(parse_arms(",".join(arms_list)))
    except InputError as e:
        raise InputError(f"{where}: arms: {e}") from None
    missing = [a for a in REQUIRED_ARMS if a not in {x.label for x in arms}]
    if missing:
        raise InputError(f"{where}: arms must include {', '.join(missing)} (P3 compares them)")
    seeds, first = data.get("seeds", 5), data.get("first-seed", 0)
    if not (isinstance(seeds, int) and seeds >= 1 and isinstance(first, int) and first >= 0):
        raise InputError(
            f"{where}: seeds={seeds!r}, first-seed={first!r}; allowed: seeds >= 1, first-seed >= 0"
        )
    kinds = {s.name: s.kind for s in settings()}
    config = {}
    table = data.get("config", {})
    if not isinstance(table, dict):
        raise InputError(f"{where}: [config] must be a table of settings")
    for key, value in table.items():
        name = _setting(key, kinds, where, "[config]")  # before its value is checked
        config[name] = _check(kinds, key, value, where, "[config]")
    axes = []
    raw_axes = data.get("axis", [])
    if not isinstance(raw_axes, list) or not raw_axes:
        raise InputError(f"{where}: no [[axis]]; a map needs at least one axis")
    for n, raw in enumerate(raw_axes, 1):
        at = f"[[axis]] {n}"
        bad = sorted(set(raw) - set(_AXIS))
        if bad:
            raise InputError(
                f"{where}: {at}: unknown key(s) {', '.join(bad)}; allowed: {', '.join(_AXIS)}"
            )
        name = _setting(str(raw.get("setting", "")), kinds, where, at)
        values = raw.get("values")
        if not isinstance(values, list) or not values:
            raise InputError(f"{where}: {at} ({name}): values must be a non-empty list")
        checked = tuple(_check(kinds, name, v, where, f"{at} ({name})") for v in values)
        labels = raw.get("labels") or [_label(v) for v in values]
        if len(labels) != len(values) or not all(isinstance(x, str) for x in labels):
            raise InputError(f"{where}: {at} ({name}): labels must name each value once")
        if name in {a.setting for a in axes} or name in config:
            raise InputError(
                f"{where}: {at}: {name} is set twice (an axis and [config] or two axes)"
            )
        axes.append(Axis(name, str(raw.get("what", "")), checked, tuple(labels)))
    placement = None
    if "placement" in data:
        raw = data["placement"]
        if not isinstance(raw, dict) or sorted(raw) != sorted(_PLACEMENT):
            raise InputError(f"{where}: [placement] needs exactly {', '.join(_PLACEMENT)}")
        try:
            placement = Placement(int(raw["steps"]), float(raw["min-ratio"]), float(raw["min-b"]))
        except (TypeError, ValueError):
            raise InputError(
                f"{where}: [placement]: steps an integer, min-ratio and min-b numbers"
            ) from None
    grid = Grid(
        title=str(data.get("title", "")),
        base=base,
        arms=arms,
        seeds=tuple(range(first, first + seeds)),
        axes=tuple(axes),
        config=config,
        rule=str(data.get("rule", "")),
        placement=placement,
        text=text,
        source=where,
    )
    try:
        grid.cells()  # every combination is a valid configuration
    except InputError as e:
        raise InputError(f"{where}: a cell's settings: {e}") from None
    return grid


def _setting(key: str, kinds: dict, where: str, at: str) -> str:
    name = key.replace("-", "_")
    if name not in kinds:
        raise InputError(
            f"{where}: {at}: {key!r} is not a setting; allowed: "
            + ", ".join(s.flag[2:] for s in settings())
        )
    return name


def _check(kinds: dict, key: str, value: Any, where: str, at: str) -> Any:
    name = key.replace("-", "_")
    try:
        return kinds[name].check(value, name)
    except InputError as e:
        raise InputError(f"{where}: {at}: {e}") from None


def load(path: str | Path | None) -> Grid:
    """A grid from a file, or the shipped default (``DEFAULT``) when ``path`` is None."""
    if path is None:
        from importlib import resources

        f = resources.files("rescue.sim").joinpath("maps", DEFAULT)
        return parse(f.read_text(), where=f"the default grid ({DEFAULT})")
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"--grid {path}: {e.strerror or e}") from None
    return parse(text, where=str(path))


def describe(grid: Grid) -> list[str]:
    """The grid in words: one line per axis, and the count of cells and runs."""
    lines = [f"- {a.setting}" + (f" ({a.what})" if a.what else "") + ": "
             + ", ".join(a.labels) for a in grid.axes]  # fmt: skip
    cells = 1
    for a in grid.axes:
        cells *= len(a.values)
    simulated = cells // max((len(a.values) for a in grid.axes if a.setting == "steps"), default=1)
    lines.append(
        f"- {cells} cells × {len(grid.arms)} arms ({', '.join(a.label for a in grid.arms)}) × "
        f"{len(grid.seeds)} seeds ({grid.seeds[0]}-{grid.seeds[-1]}); {simulated * len(grid.arms) * len(grid.seeds)} "
        "runs simulated (a shorter run length is the first steps of the longest)"
    )
    return lines


def axis_index(grid: Grid, setting: str) -> int | None:
    """The position of the axis on ``setting`` (None: no such axis)."""
    return next((i for i, a in enumerate(grid.axes) if a.setting == setting), None)


def values_of(grid: Grid, cell: Cell) -> dict[str, str]:
    """``{setting: label}`` of a cell."""
    return {a.setting: a.labels[i] for a, i in zip(grid.axes, cell.index, strict=True)}


def names(grid: Grid) -> Sequence[str]:
    return [a.setting for a in grid.axes]
