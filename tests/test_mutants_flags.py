"""``rescue.flags``: each flag type says exactly what it allows, and allows exactly that.

The expected sentences are written out here (the forms the module's docstring promises:
``an integer >= 0``, ``a number in (0, 1]``), so a bound, an open end or a word changed in
the code fails a test; every range is tried on both sides of each bound and on the bound.
"""

from __future__ import annotations

import argparse

import pytest

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
