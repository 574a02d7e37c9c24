"""``rescue.flags``: each flag type says exactly what it allows, and allows exactly that.

The expected sentences are written out here (the forms the module's docstring promises:
``an integer >= 0``, ``a number in (0, 1]``), so a bound, an open end or a word changed in
the code fails a test; every range is tried on both sides of each bound and on the bound.

The ``RESCUE_*`` settings' kinds are declared inside the tests (the modules' own declarations
run at import, which no test is counted for; a throwaway name, removed from ``SETTINGS``
after), each checked against what the docs promise, written out by hand:
the default cell of docs/miles.md's table (``1`` and ``0`` for a switch, ``512``, ``0.5``, a
choice's first value in backquotes, a ``shown`` text such as ``unset (off)`` kept as declared),
the refusal ``NAME='text'; allowed: ...`` with the kind's own sentence (``0 (default), 1``,
``a number > 0 (default 2)``, ``any text``), a switch taking exactly ``1`` and ``0``, a text
(a path) kept with its blanks and its case, and ``read()`` taking ``os.environ`` only when
no mapping is given (the test's environment and mapping disagree).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from rescue import flags
from rescue.errors import InputError
from rescue.flags import Range, existing, integer, number


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (integer(0), "an integer >= 0"),
        (integer(1, 3), "an integer in [1, 3]"),
        (integer(high=5), "an integer <= 5"),
        (integer(), "an integer"),
        (number(0, 1), "a number in [0, 1]"),
        (number(0, 1, low_open=True), "a number in (0, 1]"),
        (number(0, 1, high_open=True), "a number in [0, 1)"),
        (number(0, 1, low_open=True, high_open=True), "a number in (0, 1)"),
        (number(0.5), "a number >= 0.5"),
        (number(0, low_open=True), "a number > 0"),
        (number(high=2.5), "a number <= 2.5"),
        (number(high=2.5, high_open=True), "a number < 2.5"),
        (number(), "a number"),
    ],
)
def test_each_range_states_what_it_allows(kind: Range, said: str):
    assert kind.allowed() == said
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        kind("not a number")
    assert str(refused.value) == f"'not a number': allowed {said}"


def test_an_integer_range_takes_both_bounds_and_nothing_past_them():
    kind = integer(1, 3)
    assert [kind(t) for t in ("1", "2", "3", " 3 ")] == [1, 2, 3, 3]
    assert all(type(kind(t)) is int for t in ("1", "3"))
    for text in ("0", "4", "2.5", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"allowed an integer in \[1, 3\]"):
            kind(text)


def test_a_number_range_takes_its_closed_ends_and_refuses_its_open_ones():
    closed, half, open_ = number(0, 1), number(0, 1, high_open=True), number(0, 1, low_open=True)
    assert closed("0") == 0.0 and closed("1") == 1.0 and type(closed("1")) is float
    assert half("0") == 0.0 and half("0.5") == 0.5 and open_("1") == 1.0 and open_("0.5") == 0.5
    for kind, text in ((half, "1"), (open_, "0"), (closed, "1.01"), (closed, "-0.01")):
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)
    assert half.contains(0.999) and not half.contains(1.0) and not half.contains(float("nan"))
    assert open_.contains(1.0) and not open_.contains(0.0) and not open_.contains(float("inf"))


@pytest.mark.parametrize(
    ("what", "accepts", "refuses"),
    [("file", "file", "folder"), ("folder", "folder", "file"), ("path", "file", "nothing")],
)
def test_an_existing_path_is_a_file_a_folder_or_either(tmp_path, what, accepts, refuses):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    kind = existing(what)
    assert kind.__name__ == what
    assert kind(str(tmp_path / accepts)) == str(tmp_path / accepts)
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        kind(str(tmp_path / refuses))
    assert str(refused.value) == f"{str(tmp_path / refuses)!r}: no such {what}"


def test_existing_is_any_path_by_default(tmp_path):
    (tmp_path / "folder").mkdir()
    assert existing().what == "path" and existing()(str(tmp_path / "folder"))
    with pytest.raises(argparse.ArgumentTypeError, match="no such path"):
        existing()(str(tmp_path / "absent"))


# ── Settings from the environment ───────────────────────────────────────────────────────


@pytest.fixture(autouse=True)
def declarations() -> Iterator[None]:
    """The test's own declarations leave ``SETTINGS`` as it was."""
    before = dict(flags.SETTINGS)
    yield
    flags.SETTINGS.clear()
    flags.SETTINGS.update(before)


def refusal(setting: flags.Setting, text: str) -> str:
    with pytest.raises(InputError) as refused:
        setting.read({setting.name: text})
    return str(refused.value)


@pytest.mark.parametrize(
    ("default", "shown"),
    [(64, "64"), (0, "0"), (10800.0, "10800"), (0.5, "0.5"), ("drop", "`drop`")],
)
def test_a_setting_shows_its_default_as_the_docs_table_writes_it(default, shown):
    """docs/miles.md: ``RESCUE_WATCHDOG_WINDOW`` 64, ``RESCUE_SEED`` 0, ``..._IDLE_S`` 10800,
    ``..._MAX_NO_RESULT`` 0.5, ``RESCUE_ARM`` `drop`."""
    declared = flags.setting("RESCUE_TEST_SHOWN", default, str, "anything")
    assert declared.shown == shown
    assert flags.SETTINGS["RESCUE_TEST_SHOWN"] is declared


def test_a_setting_shows_the_text_it_is_given_instead_of_its_default():
    declared = flags.setting(
        "RESCUE_TEST_WINDOW", None, int, "B to (K + 1)·B", shown="(K + 1)·B groups"
    )
    assert declared.shown == "(K + 1)·B groups"
    assert declared.read({}) is None and declared.allowed == "B to (K + 1)·B"


def test_a_setting_keeps_case_unless_told_and_drops_blanks_unless_told():
    kept = flags.setting("RESCUE_TEST_CASE", "x", str, "a name")
    assert kept.read({"RESCUE_TEST_CASE": " Qwen/Mixed-Case "}) == "Qwen/Mixed-Case"
    lowered = flags.setting("RESCUE_TEST_LOWER", "x", str, "a name", lower=True)
    assert lowered.read({"RESCUE_TEST_LOWER": " Mixed "}) == "mixed"
    path = flags.setting("RESCUE_TEST_PATH", "x", str, "a path", strip=False)
    assert path.read({"RESCUE_TEST_PATH": " /runs/a b "}) == " /runs/a b "


def test_read_takes_the_environment_only_when_no_mapping_is_given(monkeypatch):
    s = flags.Setting("RESCUE_TEST_ENV", 3, int, "an integer", "3")
    monkeypatch.setenv("RESCUE_TEST_ENV", "5")
    assert s.read() == 5
    assert s.read({}) == 3 and s.read({"RESCUE_TEST_ENV": "7"}) == 7
    monkeypatch.delenv("RESCUE_TEST_ENV")
    assert s.read() == 3


@pytest.mark.parametrize(
    ("default", "allowed", "shown"),
    [(True, "1 (default), 0", "1"), (False, "0 (default), 1", "0")],
)
def test_a_switch_is_1_or_0_with_its_default_first(default, allowed, shown):
    """docs/miles.md: ``RESCUE_UPDATE_NORM`` 1 (default) | 0, ``RESCUE_ORACLE_STREAM`` 0."""
    s = flags.switch("RESCUE_TEST_SWITCH", default)
    assert s.allowed == allowed and s.shown == shown
    assert s.read({}) is default and s.read({"RESCUE_TEST_SWITCH": "  "}) is default
    assert s.read({"RESCUE_TEST_SWITCH": "1"}) is True
    assert s.read({"RESCUE_TEST_SWITCH": " 0 "}) is False
    for text in ("yes", "true", "on", "2", "01", "-1"):
        assert refusal(s, text) == f"RESCUE_TEST_SWITCH={text!r}; allowed: {allowed}"


def test_a_choice_shows_its_first_value_or_the_text_it_is_given():
    """docs/miles.md: ``RESCUE_BASELINE`` `all`, one of ``all``, ``survivors``."""
    plain = flags.choice("RESCUE_TEST_CHOICE", ("all", "survivors"))
    assert plain.shown == "`all`" and plain.allowed == "all, survivors"
    told = flags.choice("RESCUE_TEST_TOLD", ("keep", "zero"), shown="`keep` (as Miles)")
    assert told.shown == "`keep` (as Miles)" and told.read({"RESCUE_TEST_TOLD": "ZERO"}) == "zero"
    assert refusal(told, "Half") == "RESCUE_TEST_TOLD='half'; allowed: keep, zero"


def test_a_count_is_an_integer_from_its_low_with_its_default():
    """docs/miles.md: ``RESCUE_TURN_TOKENS`` 512, an integer >= 1."""
    n = flags.count("RESCUE_TEST_COUNT", 512, 1)
    assert n.shown == "512" and n.allowed == "an integer >= 1 (default 512)"
    assert n.read({}) == 512
    assert n.read({"RESCUE_TEST_COUNT": "1"}) == 1
    assert n.read({"RESCUE_TEST_COUNT": " 20 "}) == 20
    assert type(n.read({"RESCUE_TEST_COUNT": "20"})) is int
    for text in ("0", "-3", "2.5", "x"):
        assert refusal(n, text) == (
            f"RESCUE_TEST_COUNT={text!r}; allowed: an integer >= 1 (default 512)"
        )


def test_a_count_unset_by_default_states_its_own_words():
    """``RESCUE_MAX_STALENESS``: unset means no limit, 0 is a limit."""
    n = flags.count(
        "RESCUE_TEST_LIMIT", None, 0, allowed="a non-negative integer, or unset", shown="unset"
    )
    assert n.shown == "unset" and n.read({}) is None
    assert n.read({"RESCUE_TEST_LIMIT": "0"}) == 0
    assert refusal(n, "-1") == "RESCUE_TEST_LIMIT='-1'; allowed: a non-negative integer, or unset"


def test_an_amount_is_finite_unless_told_and_its_low_may_be_open():
    k = flags.amount("RESCUE_TEST_AMOUNT", 2.0, 0)
    assert k.shown == "2" and k.read({}) == 2.0
    assert k.read({"RESCUE_TEST_AMOUNT": "0"}) == 0.0
    for text in ("inf", "-1", "nan"):
        assert (
            refusal(k, text) == f"RESCUE_TEST_AMOUNT={text!r}; allowed: a number >= 0 (default 2)"
        )
    cap = flags.amount("RESCUE_TEST_CAP", 2.0, 0, low_open=True, shown="2.0")
    assert cap.shown == "2.0" and cap.read({}) == 2.0
    assert cap.read({"RESCUE_TEST_CAP": "0.25"}) == 0.25
    for text in ("0", "-0.5", "inf"):
        assert refusal(cap, text) == f"RESCUE_TEST_CAP={text!r}; allowed: a number > 0 (default 2)"


def test_an_amount_unset_by_default_states_its_own_words():
    """``RESCUE_DRGRPO_DIVISOR``: a number > 0, unset: ``--rollout-max-response-len``."""
    d = flags.amount(
        "RESCUE_TEST_DIVISOR", None, 0, low_open=True, allowed="a number > 0", shown="`D`"
    )
    assert d.shown == "`D`" and d.read({}) is None
    assert d.read({"RESCUE_TEST_DIVISOR": "4096"}) == 4096.0
    assert refusal(d, "0") == "RESCUE_TEST_DIVISOR='0'; allowed: a number > 0"


def test_a_text_is_any_text_kept_with_its_blanks_and_case():
    """``RESCUE_ORACLE_DIR``: unset (off), else a folder taken as written."""
    path = flags.text("RESCUE_TEST_DIR", None, shown="unset (off)")
    assert path.shown == "unset (off)" and path.allowed == "any text"
    assert path.read({}) is None and path.read({"RESCUE_TEST_DIR": "   "}) is None
    assert path.read({"RESCUE_TEST_DIR": " /runs/Oracle A/ "}) == " /runs/Oracle A/ "
    assert path.read({"RESCUE_TEST_DIR": "x=1; y"}) == "x=1; y"
    named = flags.text("RESCUE_TEST_NAMED", "/data/oracle", shown="`/data/oracle`")
    assert (
        named.read({}) == "/data/oracle" and named.read({"RESCUE_TEST_NAMED": ""}) == "/data/oracle"
    )
