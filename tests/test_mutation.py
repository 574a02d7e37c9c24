"""``make mutate`` (``tests/mutation.py``): the mutants of a module run against the tests that
import it; the score counts the killed among the non-equivalent; each survivor is printed
with its file:line; the list of equivalents follows the code.

End to end on a small fixture repository (a package of two functions, one tested), through
mutmut itself: the numbers below are the fixture's, worked out by hand from mutmut's
operators (``<`` becomes ``<=``, a number ``n`` becomes ``n + 1``, ...).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import mutation
import pytest

BOUNDS = '''\
"""Bounds."""


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x


def scale(x, by=2):
    return x * by + 1


def sign(x):
    return 1 if x > 0 else -1
'''

TEST = """\
from toy.bounds import clamp, scale


def test_clamp():
    assert clamp(-5, 0, 10) == 0
    assert clamp(50, 0, 10) == 10
    assert clamp(5, 0, 10) == 5


def test_scale():
    assert scale(3) == 7 and scale(3, 3) == 10
"""

#: ``x < low`` -> ``x <= low``: at ``x == low`` both return ``low``, which is ``x``.
EQUIVALENT = """\
[[equivalent]]
module = "toy/bounds.py"
function = "clamp"
original = "if x < low:"
mutated = "if x <= low:"
why = "at x == low both branches return the same value"
"""
#: Two wrong entries: a mutant that does not exist, and one the tests kill.
STALE = """
[[equivalent]]
module = "toy/bounds.py"
function = "clamp"
original = "return x"
mutated = "return None"
why = "no such mutant: mutmut leaves a return's value alone"

[[equivalent]]
module = "toy/bounds.py"
function = "scale"
original = "return x * by + 1"
mutated = "return x * by - 1"
why = "wrong: scale(3) tells them apart"
"""


def fixture(root: Path, equivalents: str = EQUIVALENT + STALE) -> Path:
    (root / "toy").mkdir(parents=True)
    (root / "toy" / "__init__.py").write_text("")
    (root / "toy" / "bounds.py").write_text(BOUNDS)
    (root / "tests").mkdir()
    (root / "tests" / "test_bounds.py").write_text(TEST)
    (root / "tests" / "test_other.py").write_text("def test_nothing():\n    assert 1 + 1 == 2\n")
    (root / "tests" / "mutation.toml").write_text(equivalents)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = ''\n")
    return root


def run(root: Path, *modules: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(Path(mutation.__file__)),
            *modules,
            "--root",
            str(root),
            "--jobs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    root = fixture(tmp_path_factory.mktemp("repo"))
    return root, run(root, "toy/bounds.py")


def test_a_module_s_mutants_are_run_and_scored_with_each_survivor_at_its_line(ran):
    _, r = ran
    out = r.stdout.replace("\r", "\n")
    assert "== toy/bounds.py: mutants run against tests/test_bounds.py\n" in out  # not test_other
    # clamp: `<`->`<=` (equivalent), `>`->`>=` (survives: the test never puts x at high);
    # scale: 2->3, *->/, +->-, 1->2, each killed; sign: no test calls it, each survives
    survivors = [line.split("survived: ")[1] for line in out.splitlines() if "survived: " in line]
    assert any(
        s.startswith("toy/bounds.py:7: clamp: 'if x > high:' -> 'if x >= high:'") for s in survivors
    ), survivors
    sign = [s for s in survivors if s.startswith("toy/bounds.py:17: sign (no test calls it)")]
    assert len(sign) == len([s for s in survivors if " sign " in s]) >= 3
    assert not any("if x <= low" in s for s in survivors)  # listed as equivalent
    row = next(line for line in out.splitlines() if line.startswith("| `toy/bounds.py` |"))
    mutants, killed, equivalent, survived = (int(x) for x in row.split("|")[2:6])
    assert equivalent == 1 and survived == len(survivors) and killed == 4
    assert mutants == killed + equivalent + survived
    assert f"{100 * killed / (mutants - 1):.1f}%" in row
    # below the bar (sign is untested): exit 1, saying so
    assert r.returncode == 1
    # the wrong entries of the list of equivalents
    assert "clamp: 'return x' -> 'return None': no such mutant" in r.stderr
    assert "scale: 'return x * by + 1' -> 'return x * by - 1': killed by the tests" in r.stderr
    assert (
        f"make mutate: toy/bounds.py: {100 * killed / (mutants - 1):.1f}% killed, below 85%"
        in r.stderr
    )


def test_survivors_run_again_with_the_tests_written_since(ran):
    root, first = ran
    row = next(x for x in first.stdout.splitlines() if x.startswith("| `toy/bounds.py` |"))
    mutants, killed = (int(x) for x in row.split("|")[2:4])
    # a test added to a covering file (a new file would change the selection: all again)
    (root / "tests" / "test_bounds.py").write_text(
        TEST.replace(
            "from toy.bounds import clamp, scale", "from toy.bounds import clamp, scale, sign"
        )
        + "\n\ndef test_sign():\n    assert [sign(-2), sign(0), sign(1), sign(2)] == [-1, -1, 1, 1]\n"
    )
    try:
        r = subprocess.run(
            [sys.executable, mutation.__file__, "toy/bounds.py", "--root", str(root),
             "--jobs", "2", "--survivors"],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        (root / "tests" / "test_bounds.py").write_text(TEST)
    out = r.stdout.replace("\r", "\n")
    # the survivors and the equivalent one (a survivor to mutmut) run again
    assert f"== toy/bounds.py: the {mutants - killed} survivors of its last run, again" in out
    survivors = [line for line in out.splitlines() if "survived: " in line]
    # every mutant of sign is killed now; clamp's `>` -> `>=` still survives
    assert [s.split("survived: ")[1].split("  [")[0] for s in survivors] == [
        "toy/bounds.py:7: clamp: 'if x > high:' -> 'if x >= high:'"
    ]
    row = next(x for x in out.splitlines() if x.startswith("| `toy/bounds.py` |"))
    assert [int(x) for x in row.split("|")[2:6]] == [mutants, mutants - 2, 1, 1]
    assert killed < mutants - 2


def test_the_repository_is_not_written(ran):
    root, _ = ran
    assert (root / "toy" / "bounds.py").read_text() == BOUNDS
    assert sorted(p.name for p in root.iterdir()) == ["build", "pyproject.toml", "tests", "toy"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "MODULES is empty"),
        (["toy/absent.py"], "MODULES: toy/absent.py: allowed a Python file of a package"),
        (["tests/test_bounds.py"], "MODULES: tests/test_bounds.py: allowed a Python file"),
        (["pyproject.toml"], "MODULES: pyproject.toml: allowed a Python file"),
        (["toy/bounds.py", "--jobs", "0"], "MUTATE_JOBS=0: allowed an integer >= 1"),
        (["toy/__init__.py"], "MODULES: toy/__init__.py: no test file imports it"),
    ],
)
def test_bad_input_is_one_line(tmp_path, argv, said):
    root = fixture(tmp_path)
    r = subprocess.run(
        [sys.executable, mutation.__file__, *argv, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith("make mutate: error: ") and said in line


def test_the_covering_tests_are_those_that_import_the_module(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    for name, text in {
        "test_a.py": "import rescue.sim.grid as g\n",
        "test_b.py": "from rescue.sim import grid\n",
        "test_c.py": "from rescue.sim.grid import parse\n",
        "test_d.py": "from rescue.sim import gridlike\nimport rescue.sim\n",
        "test_e.py": "x = 'rescue.sim.grid'\n",
        "helper.py": "import rescue.sim.grid\n",
    }.items():
        (tests / name).write_text(text)
    assert mutation.covering_tests("rescue/sim/grid.py", tmp_path) == [
        "tests/test_a.py",
        "tests/test_b.py",
        "tests/test_c.py",
    ]
    # a module's list in tests/mutation.toml replaces them; a name there must exist
    assert mutation.covering_tests("rescue/sim/grid.py", tmp_path, ["tests/test_e.py"]) == [
        "tests/test_e.py"
    ]
    with pytest.raises(mutation.Refused, match=r"tests/test_f\.py: no such test file"):
        mutation.covering_tests("rescue/sim/grid.py", tmp_path, ["tests/test_f.py"])
    assert mutation.dotted("rescue/sim/__init__.py") == "rescue.sim"


def test_a_mutant_s_line_and_change_are_read_from_its_function():
    source = textwrap.dedent("""\
        class Range:
            x = 1

            # a comment above
            @property
            def low(self):
                a = 1
                return a + 1
        """)
    original = "# a comment above\n@property\ndef low(self):\n    a = 1\n    return a + 1\n"
    mutated = original.replace("a + 1", "a - 1")
    assert mutation.change(original, mutated, "Range.low", source) == (
        8,
        "return a + 1",
        "return a - 1",
    )
    assert mutation.function_of("rescue.flags.xǁRangeǁallowed__mutmut_3") == "Range.allowed"
    assert mutation.function_of("rescue.output.x_check_out__mutmut_12") == "check_out"


def test_the_score_counts_the_killed_among_the_non_equivalent():
    ms = [
        mutation.Mutant(f"m{i}", s, "f", 1, "a", "b")
        for i, s in enumerate(["killed"] * 17 + ["equivalent"] * 2 + ["survived"] * 3)
    ]
    s = mutation.score("rescue/x.py", ms, 61)
    assert (s.mutants, s.killed, s.equivalent, s.survived) == (22, 17, 2, 3)
    assert s.score == 17 / 20 and s.score >= mutation.THRESHOLD
    assert s.row() == "| `rescue/x.py` | 22 | 17 | 2 | 3 | 85.0% | 1 min 1 s |"


def test_the_plugin_runs_the_quickest_tests_first_under_a_plain_pytest_s_signals(
    tmp_path, monkeypatch
):
    import json
    import signal
    from types import SimpleNamespace

    plugin: dict = {}
    exec(mutation.PLUGIN, plugin)
    monkeypatch.chdir(tmp_path)
    items = [SimpleNamespace(nodeid=n) for n in ("slow", "unknown", "quick", "mid")]
    plugin["pytest_collection_modifyitems"](None, None, items)  # no durations yet: as collected
    assert [i.nodeid for i in items] == ["slow", "unknown", "quick", "mid"]
    took = {"slow": 30.0, "quick": 0.01, "mid": 2.0}
    (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": took}))
    plugin["pytest_collection_modifyitems"](None, None, items)
    assert [i.nodeid for i in items] == ["quick", "mid", "slow", "unknown"]
    # the fork server's settings (SIGINT ignored, SIGTERM an exit of status 0, SIGCHLD its
    # own) become a plain pytest's
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *a: None)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        plugin["pytest_configure"](None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
