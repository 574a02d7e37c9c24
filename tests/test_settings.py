"""The ``RESCUE_*`` settings of a run's processes: each declared once through ``rescue.flags``,
read one way, and documented as declared.

Every module that declares a setting (``flags.setting``, ``choice``, ``switch``, ``count``,
``amount``, ``text``, found in the sources) is imported; then every declaration must have
its row in the docs with the declared default, and every row of docs/miles.md's table of
settings must be a declaration.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from rescue import flags
from rescue.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
DECLARES = re.compile(r"\bflags\.(setting|choice|switch|count|amount|text)\(")
ROW = re.compile(r"^\| `(RESCUE_[A-Z0-9_]+)` \| ([^|]*) \|", re.M)


def declaring_modules() -> list[str]:
    out = []
    for folder in ("rescue", "filters", "swe_smith_tasks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if DECLARES.search(path.read_text()):
                parts = path.relative_to(ROOT).with_suffix("").parts
                out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


@pytest.fixture(scope="module")
def declared() -> dict[str, flags.Setting]:
    for name in declaring_modules():
        importlib.import_module(name)
    return dict(flags.SETTINGS)


def docs_rows() -> dict[str, list[tuple[str, str]]]:
    """``RESCUE_*`` -> [(page, default cell)] of every docs table row naming it first."""
    rows: dict[str, list[tuple[str, str]]] = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for name, default in ROW.findall(page.read_text()):
            rows.setdefault(name, []).append((page.name, default.strip()))
    return rows


def test_the_settings_the_issue_counted_are_declared(declared):
    """The 17 readers that were hand-written parsers, each now a declaration."""
    assert {
        "RESCUE_ARM", "RESCUE_A", "RESCUE_SEED", "RESCUE_MASK_RHO", "RESCUE_BASELINE",
        "RESCUE_TRUNCATED_REWARD", "RESCUE_ESTIMATOR", "RESCUE_KAPPA", "RESCUE_TURN_TOKENS",
        "RESCUE_SC_TOP_K", "RESCUE_SC_CAP", "RESCUE_ORACLE_DIR", "RESCUE_ORACLE_STREAM",
        "RESCUE_UPDATE_NORM", "RESCUE_MAX_STALENESS", "RESCUE_GENERATE_FUNCTION",
        "RESCUE_WATCHDOG_WINDOW", "RESCUE_WATCHDOG_MAX_NO_RESULT", "RESCUE_WATCHDOG_IDLE_S",
        "RESCUE_PACE_WINDOW", "RESCUE_PACE_STRAGGLER_S", "RESCUE_DRGRPO_DIVISOR",
    } <= set(declared)  # fmt: skip


def test_every_declared_setting_is_documented_with_its_default(declared):
    rows = docs_rows()
    wrong = []
    for name, setting in sorted(declared.items()):
        found = rows.get(name, [])
        if [cell for _, cell in found] != [setting.shown]:
            wrong.append(f"{name}: declared default {setting.shown!r}, docs rows {found}")
    assert not wrong, "\n".join(wrong)


def test_the_miles_page_table_is_the_declarations(declared):
    text = (ROOT / "docs" / "miles.md").read_text()
    table = text[text.index("| setting | default | meaning |") :].split("\n\n", 1)[0]
    rows = ROW.findall(table)
    assert len(rows) >= 18
    for name, default in rows:
        assert name in declared, f"docs/miles.md documents {name}, which no module declares"
        assert default.strip() == declared[name].shown, name


def test_a_setting_reads_its_default_when_unset_or_blank_and_refuses_in_one_line():
    s = flags.Setting("RESCUE_TEST_X", 3, int, "an integer", "3")
    assert s.read({}) == 3 and s.read({"RESCUE_TEST_X": "  "}) == 3
    assert s.read({"RESCUE_TEST_X": " 7 "}) == 7
    with pytest.raises(InputError, match=r"^RESCUE_TEST_X='x'; allowed: an integer$"):
        s.read({"RESCUE_TEST_X": " x "})


def test_a_choice_is_read_case_insensitively_and_names_its_values():
    c = flags.choice("RESCUE_TEST_CHOICE", ("all", "survivors"))
    assert c.read({}) == "all" and c.read({"RESCUE_TEST_CHOICE": " Survivors "}) == "survivors"
    with pytest.raises(InputError, match=r"^RESCUE_TEST_CHOICE='loo'; allowed: all, survivors$"):
        c.read({"RESCUE_TEST_CHOICE": "LOO"})
    assert flags.SETTINGS.pop("RESCUE_TEST_CHOICE") is c


def test_switches_counts_and_amounts_state_their_range_and_default():
    on = flags.switch("RESCUE_TEST_ON", True)
    assert on.read({}) is True and on.read({"RESCUE_TEST_ON": "0"}) is False
    with pytest.raises(InputError, match=r"^RESCUE_TEST_ON='yes'; allowed: 1 \(default\), 0$"):
        on.read({"RESCUE_TEST_ON": "yes"})
    n = flags.count("RESCUE_TEST_N", 512, 1)
    with pytest.raises(InputError, match=r"='0'; allowed: an integer >= 1 \(default 512\)$"):
        n.read({"RESCUE_TEST_N": "0"})
    k = flags.amount("RESCUE_TEST_K", 2.0, 0, finite=False)
    assert k.read({"RESCUE_TEST_K": "inf"}) == float("inf")
    for bad in ("nan", "-1", "-inf", "x"):
        with pytest.raises(InputError, match=r"allowed: a number >= 0 \(default 2\)$"):
            k.read({"RESCUE_TEST_K": bad})
    for name in ("RESCUE_TEST_ON", "RESCUE_TEST_N", "RESCUE_TEST_K"):
        flags.SETTINGS.pop(name)
