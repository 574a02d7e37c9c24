"""Named scenarios: small TOML files of simulator settings, each isolating one mechanism.

Specification
-------------
A scenario file (``rescue sim --scenario-file FILE``; the presets ship in
``rescue/sim/scenarios/*.toml`` and are listed by ``rescue sim --scenarios``) is TOML::

    name = "two-outcome"                       # optional: default the file's stem
    title = "solved or capped only"            # one line for listings
    regime = "A"                               # A (budget, reward known), B (outcome unseen), or -
    isolates = "..."                           # the mechanism it isolates, in a sentence
    expect = "..."                             # what the theory says it must (or must not) show
    arms = ["zero", "mask", "survivor"]        # what `rescue sim --scenario NAME` runs

    [config]                                   # any SimConfig setting, by its flag's name
    group-size = 8                             # (dashes or underscores), a TOML value
    submit-failure = false

Every key of ``[config]`` is a ``SimConfig`` field (``rescue sim --help`` lists them);
an unknown key, or a value of the wrong kind, is an error naming the file and the key.
Settings the file does not name keep their defaults (the ``swe-like`` values); flags on
the command line override the file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.sim.arms import ArmSpec, parse_arms
from rescue.sim.config import SimConfig, settings

#: Where the presets live, inside the package.
PRESETS = "scenarios"
#: The presets, in the order ``make demo`` runs them (``<name>.toml`` in ``PRESETS``).
PRESET_NAMES: tuple[str, ...] = ("fast-thorough", "budget-three-outcome", "two-outcome", "swe-like")
_TOP_KEYS = ("name", "title", "regime", "isolates", "expect", "arms", "config")


@dataclass(frozen=True)
class Scenario:
    """A named set of settings and the arms it is about."""

    name: str
    title: str = ""
    regime: str = "-"
    isolates: str = ""
    expect: str = ""
    arms: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def sim_config(self, **overrides: Any) -> SimConfig:
        """The ``SimConfig`` of the file, with ``overrides`` (e.g. the command line's) on top."""
        return SimConfig(**{**self.config, **overrides})


def _toml(text: str, where: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{where}: not valid TOML: {e}") from None


def parse(text: str, *, where: str, default_name: str = "") -> Scenario:
    """A scenario from the text of a file (``where`` names it in errors)."""
    data = _toml(text, where)
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_TOP_KEYS)}"
        )
    table = data.get("config", {})
    if not isinstance(table, dict):
        raise InputError(f"{where}: [config] must be a table of settings")
    kinds = {s.name: s.kind for s in settings()}
    config: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in kinds:
            raise InputError(
                f"{where}: [config] {key} is not a setting; allowed: "
                + ", ".join(s.flag[2:] for s in settings())
            )
        try:
            config[name] = kinds[name].check(value, name)
        except InputError as e:
            raise InputError(f"{where}: [config] {key}: {e}") from None
    arms = data.get("arms", [])
    if isinstance(arms, str) or not all(isinstance(a, str) for a in arms):
        raise InputError(f'{where}: arms must be a list of arm names, e.g. ["drop", "protect:0.5"]')
    if arms:
        try:
            parse_arms(",".join(arms))
        except InputError as e:
            raise InputError(f"{where}: arms: {e}") from None
    regime = str(data.get("regime", "-"))
    if regime not in ("A", "B", "-"):
        raise InputError(f"{where}: regime={regime!r}; allowed: A, B, -")
    scenario = Scenario(
        name=str(data.get("name") or default_name),
        title=str(data.get("title", "")),
        regime=regime,
        isolates=str(data.get("isolates", "")),
        expect=str(data.get("expect", "")),
        arms=tuple(arms),
        config=config,
        source=where,
    )
    try:
        scenario.sim_config()
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return scenario


def load_file(path: str | Path) -> Scenario:
    """A scenario from a file (``--scenario-file``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"--scenario-file {path}: {e.strerror or e}") from None
    return parse(text, where=str(path), default_name=p.stem)


def names() -> list[str]:
    """The preset scenarios' names, in the order the demo runs them."""
    return list(PRESET_NAMES)


def preset(name: str) -> Scenario:
    """A preset by name (``--scenario NAME``)."""
    if name not in PRESET_NAMES:
        raise InputError(f"--scenario {name!r}; allowed: {', '.join(PRESET_NAMES)}, all")
    f = resources.files("rescue.sim").joinpath(PRESETS, f"{name}.toml")
    return parse(f.read_text(), where=f"scenario {name} ({name}.toml)", default_name=name)


def listing() -> str:
    """The presets, one paragraph each (``rescue sim --scenarios``)."""
    out = []
    for n in names():
        s = preset(n)
        out.append(f"{n} (regime {s.regime}): {s.title}\n  isolates: {s.isolates}\n"
                   f"  arms: {', '.join(s.arms)}")  # fmt: skip
    return "\n".join(out)


def render(scenario: Scenario, config: SimConfig, arms: Sequence[ArmSpec]) -> str:
    """A scenario file of ``scenario`` with every setting of ``config`` and ``arms`` written out."""
    head = ["# every setting written out; edit and run with rescue sim --scenario-file FILE"]
    for key in ("name", "title", "regime", "isolates", "expect"):
        value = getattr(scenario, key)
        if value:
            head.append(f"{key} = {_value(value)}")
    head.append(f"arms = {_value(tuple(a.text for a in arms))}")
    return "\n".join(head) + "\n\n" + as_toml(config)


def as_toml(config: SimConfig) -> str:
    """A ``[config]`` table with every setting of ``config`` (to copy into a file)."""
    lines = ["[config]"]
    for f in fields(config):
        lines.append(f"{f.name.replace('_', '-')} = {_value(getattr(config, f.name))}")
    return "\n".join(lines) + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return repr(v)
