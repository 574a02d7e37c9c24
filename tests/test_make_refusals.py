"""make's refusals each depend on their line of the Makefile, and the suite notices when one
goes: a fault planted by hand in a copy of the Makefile (a refusal removed, inverted or
narrowed) makes the suite's refusal test fail on that copy, and the refusal disappear from
make's answer. This is the Makefile's part of mutation testing, which a Python mutation
tester cannot reach (``make mutate`` runs the Python modules'; docs/development.md).

Also the refusals the plants found untested: a switch given through the environment, two
goals that read different variables, a rehearsal or integration run without its sources.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_frameworks
import test_make_variables as suite
from test_make_variables import ENV, make, refused

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()


# ── the refusals the plants showed no test forced ───────────────────────────────────────


@pytest.mark.parametrize(("switch", "target"), [("REHEARSAL", "q2"), ("DRY_RUN", "swe-arm")])
def test_a_switch_from_the_environment_is_refused_as_on_the_command_line(switch, target):
    r = make(target, env={**ENV, switch: "yes"})
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert f"{switch}=yes: allowed 0 or 1" in r.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "q2", "SEEDS=3"],
        ["q2", "demo", "SEEDS=3"],
        ["q2", "q1", "DUMPS=d"],
        ["q1", "q3", "Q2_DIR=r"],
    ],
)
def test_two_goals_accept_what_either_reads(argv):
    r = make(*argv)
    assert "***" not in r.stderr, r.stderr


def test_two_goals_refuse_what_neither_reads():
    assert refused("demo", "map", "SEEDS=3").startswith("SEEDS=3: make demo map does not read")


def _stamped_venv(folder: Path, stamps: list[str]) -> Path:
    """A virtual environment whose stamps are up to date (newer than pyproject.toml), so a
    target checks its variables without installing anything."""
    folder.mkdir(parents=True)
    for stamp in stamps:
        (folder / stamp).touch()
    return folder


def rehearsal_without(root: Path, tmp: Path, missing: str) -> subprocess.CompletedProcess:
    venv = _stamped_venv(tmp / f"rv-{missing}", [".stamp"])
    given = [f"{v}=/src" for v in ("MILES_SRC", "MEGATRON_SRC") if v != missing]
    return subprocess.run(
        ["make", "--no-print-directory", "rehearsal", f"REHEARSAL_VENV={venv}", *given],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )


def integration_without_sources(root: Path, tmp: Path) -> subprocess.CompletedProcess:
    extras = next(
        line.split(":= ")[1]
        for line in MAKEFILE.splitlines()
        if line.startswith("INTEGRATION_EXTRAS :=")
    )
    venv = _stamped_venv(tmp / "iv", [".stamp-base", f".stamp-{extras}"])
    return subprocess.run(
        ["make", "--no-print-directory", "integration", f"VENV={venv}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )


@pytest.mark.parametrize("missing", ["MILES_SRC", "MEGATRON_SRC"])
def test_a_rehearsal_without_its_sources_is_refused_naming_the_variable(tmp_path, missing):
    r = rehearsal_without(ROOT, tmp_path, missing)
    assert r.returncode == 2 and f"make rehearsal: set {missing}=/path/to/" in r.stderr, r.stderr
    assert "nothing was installed" in r.stderr  # refused before any prerequisite ran


def test_make_integration_without_a_source_is_refused(tmp_path):
    r = integration_without_sources(ROOT, tmp_path)
    assert r.returncode == 2
    assert "make integration: set MILES_SRC=/path/to/miles and/or SLIME_SRC" in r.stderr, r.stderr
    assert "nothing was installed" in r.stderr  # refused before any prerequisite ran


# ── the plants ──────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Plant:
    """One fault: ``old`` (a line or lines of the Makefile, there exactly once) replaced by
    ``new``; ``check(root, tmp)`` is a test of the suite, run against the Makefile in ``root``,
    that must pass on the real Makefile and fail on the planted one."""

    name: str
    old: str
    new: str
    check: Callable[[Path, Path], None]


def _with_root(module, function: Callable[..., None], *args) -> Callable[[Path, Path], None]:
    """``function(*args)`` of a test module whose ``ROOT`` is the copy's folder."""

    def check(root: Path, tmp: Path) -> None:
        saved = module.ROOT
        module.ROOT = root
        try:
            function(*args)
        finally:
            module.ROOT = saved

    return check


def _refuses_rehearsal_without(missing: str) -> Callable[[Path, Path], None]:
    def check(root: Path, tmp: Path) -> None:
        r = rehearsal_without(root, tmp, missing)
        assert r.returncode == 2 and f"make rehearsal: set {missing}=" in r.stderr, r.stderr
        assert "nothing was installed" in r.stderr

    return check


def _refuses_integration_without_sources(root: Path, tmp: Path) -> None:
    r = integration_without_sources(root, tmp)
    assert r.returncode == 2 and "make integration: set MILES_SRC=" in r.stderr, r.stderr
    assert "nothing was installed" in r.stderr


def _integration_source_not_a_folder(root: Path, tmp: Path) -> None:
    saved = test_frameworks.ROOT
    test_frameworks.ROOT = root
    try:
        test_frameworks.test_make_integration_rejects_a_source_that_is_not_a_folder(
            tmp, "MILES_SRC"
        )
    finally:
        test_frameworks.ROOT = saved


UNREAD = suite.test_a_variable_no_goal_reads_is_refused_naming_it_and_the_closest_name
PLANTS = [
    Plant(
        "a variable no goal reads is not refused",
        "ifneq ($(UNREAD),)\nifneq ($(call readers,$(UNREAD)),)",
        "ifneq (,)\nifneq ($(call readers,$(UNREAD)),)",
        _with_root(suite, UNREAD, ["q2", "REHEARSL=1"], "no make target reads REHEARSL"),
    ),
    Plant(
        "a variable of another goal is said to be read by none",
        "ifneq ($(call readers,$(UNREAD)),)",
        "ifneq (,)",
        _with_root(suite, UNREAD, ["demo", "SEEDS=3"], "make demo does not read SEEDS"),
    ),
    Plant(
        "no closest name is suggested",
        "m = difflib.get_close_matches(sys.argv[1].upper(), sys.argv[2:], 1, 0.6)",
        "m = []",
        _with_root(suite, UNREAD, ["q2", "RUNDIR=runs/x"], "did you mean RUN_DIR?"),
    ),
    Plant(
        "only the first goal's variables are read",
        "$(foreach g,$(GOALS),$(if $(filter undefined,$(origin READS_$(g)))",
        "$(foreach g,$(firstword $(GOALS)),$(if $(filter undefined,$(origin READS_$(g)))",
        _with_root(suite, test_two_goals_accept_what_either_reads, ["demo", "q2", "SEEDS=3"]),
    ),
    Plant(
        "a goal's list loses a variable it reads",
        "READS_q1 := RUN_DIR REHEARSAL DUMPS MODEL",
        "READS_q1 := RUN_DIR REHEARSAL MODEL",
        _with_root(
            suite,
            suite.test_what_a_goal_reads_is_accepted,
            ["q1", "REHEARSAL=1", "DUMPS=d", "MODEL=m", "RUN_DIR=r"],
        ),
    ),
    Plant(
        "a switch takes any value",
        "$(if $(filter-out 0 1,$($(v))),$(v))",
        "$(if $(filter 0 1,$($(v))),$(v))",
        _with_root(suite, suite.test_a_switch_takes_0_or_1_only, "FORCE", "yes"),
    ),
    Plant(
        "a switch is checked only on the command line",
        "$(if $(filter-out undefined default file,$(origin $(v)))",
        "$(if $(filter command line,$(origin $(v)))",
        _with_root(
            suite,
            test_a_switch_from_the_environment_is_refused_as_on_the_command_line,
            "REHEARSAL",
            "q2",
        ),
    ),
    Plant(
        "SEEDS takes 0",
        "grep -Ex '0*[1-9][0-9]*'",
        "grep -Ex '[0-9]+'",
        _with_root(
            suite, suite.test_seeds_and_steps_take_integers, "SEEDS", "0", "an integer >= 1"
        ),
    ),
    Plant(
        "STEPS is not checked",
        "$(error STEPS=$(STEPS): allowed an integer >= 0)",
        "",
        _with_root(
            suite, suite.test_seeds_and_steps_take_integers, "STEPS", "-1", "an integer >= 0"
        ),
    ),
    Plant(
        "a make run by a make is checked again",
        "ifeq ($(MAKELEVEL),0)",
        "ifeq (0,0)",
        _with_root(suite, suite.test_a_make_run_by_a_make_is_not_checked_again),
    ),
    Plant(
        "a rehearsal starts without MILES_SRC",
        "ifeq ($(MILES_SRC),)\n$(error make $(firstword $(NEEDS_REHEARSAL_SOURCES)): set MILES_SRC",
        "ifeq (planted,)\n$(error make $(firstword $(NEEDS_REHEARSAL_SOURCES)): set MILES_SRC",
        _refuses_rehearsal_without("MILES_SRC"),
    ),
    Plant(
        "a rehearsal starts without MEGATRON_SRC",
        "ifeq ($(MEGATRON_SRC),)\n$(error make $(firstword $(NEEDS_REHEARSAL_SOURCES)): set MEGATRON",
        "ifeq (planted,)\n$(error make $(firstword $(NEEDS_REHEARSAL_SOURCES)): set MEGATRON",
        _refuses_rehearsal_without("MEGATRON_SRC"),
    ),
    Plant(
        "make integration starts without a source",
        "ifeq ($(MILES_SRC)$(SLIME_SRC),)\n$(error make integration",
        "ifeq (planted,)\n$(error make integration",
        _refuses_integration_without_sources,
    ),
    Plant(
        "make integration takes a source that is not a folder",
        "$(if $(MILES_SRC),$(call source_dir,MILES_SRC,a Miles checkout))",
        "",
        _integration_source_not_a_folder,
    ),
]


def copy_with(makefile: str, folder: Path) -> Path:
    """A folder where make finds ``makefile`` and what it reads beside it (``launch/*.sh``
    for the launchers' variables, ``pyproject.toml`` older than any stamp)."""
    folder.mkdir()
    (folder / "Makefile").write_text(makefile)
    (folder / "launch").symlink_to(ROOT / "launch")
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    return folder


@pytest.mark.parametrize("plant", PLANTS, ids=[p.name for p in PLANTS])
def test_a_refusal_planted_out_of_a_copy_of_the_makefile_fails_its_test(tmp_path, plant):
    assert MAKEFILE.count(plant.old) == 1, f"the Makefile changed: update the plant {plant.name!r}"
    clean = copy_with(MAKEFILE, tmp_path / "clean")
    planted = copy_with(MAKEFILE.replace(plant.old, plant.new), tmp_path / "planted")
    (tmp_path / "t-clean").mkdir()
    (tmp_path / "t-planted").mkdir()
    plant.check(clean, tmp_path / "t-clean")  # the copy itself is refused as the Makefile is
    with pytest.raises(AssertionError):
        plant.check(planted, tmp_path / "t-planted")
