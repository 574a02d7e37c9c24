"""make refuses what it does not know: a variable no target you named reads (a typo, or a
setting of another target) stops it with one line naming the variable and the closest name
it knows; a switch takes 0 or 1; SEEDS and STEPS take integers. Nothing runs first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_launch_inputs import MAKEFILE, phony_targets

ROOT = Path(__file__).resolve().parents[1]
#: make as a user types it: not a make run by another make (`make test` runs this file).
#: make's environment without make's own variables, nor the inputs a user may have exported
#: (make reads an exported MILES_SRC as the variable): each test names the ones it gives.
INPUTS = {"MILES_SRC", "SLIME_SRC", "MEGATRON_SRC", "DUMPS", "MODEL", "RUN_DIR", "KILL_AT"}
ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("MAKE") and k != "MFLAGS" and k not in INPUTS
}


def make(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-n", "--no-print-directory", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env or ENV,
    )


def refused(*argv: str) -> str:
    r = make(*argv)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    return re.sub(r"^Makefile:[0-9]+: \*\*\* ", "", line).removesuffix(".  Stop.")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["q2", "REHEARSL=1"],
            "REHEARSL=1: no make target reads REHEARSL; did you mean REHEARSAL?",
        ),
        (
            ["q2", "rehearsal=1"],
            "rehearsal=1: no make target reads rehearsal; did you mean REHEARSAL?",
        ),
        (
            ["q2", "RUNDIR=runs/x"],
            "RUNDIR=runs/x: no make target reads RUNDIR; did you mean RUN_DIR?",
        ),
        (["test", "PYTEST_ARG=-x"], "no make target reads PYTEST_ARG; did you mean PYTEST_ARGS?"),
        (["agent-prepare", "OUT=rows.jsonl"], "OUT=rows.jsonl: no make target reads OUT"),
        (["demo", "SEEDS=3"], "SEEDS=3: make demo does not read SEEDS (read by make q2 q3 "),
        (["q1", "SEEDS=3"], "SEEDS=3: make q1 does not read SEEDS (read by make q2 q3 "),
        (["q2", "MODEL=m"], "MODEL=m: make q2 does not read MODEL (read by make q1 q3)"),
    ],
)
def test_a_variable_no_goal_reads_is_refused_naming_it_and_the_closest_name(argv, said):
    assert said in refused(*argv)


@pytest.mark.parametrize("switch", ["REHEARSAL", "FORCE", "DRY_RUN", "RESUME"])
@pytest.mark.parametrize("value", ["yes", "true", "2", ""])
def test_a_switch_takes_0_or_1_only(switch, value):
    target = {"REHEARSAL": "q2", "FORCE": "q3", "DRY_RUN": "swe-arm", "RESUME": "swe-arm"}[switch]
    if value == "":  # an empty switch is as unset (its default 0), not refused
        assert "allowed 0 or 1" not in make(target, f"{switch}=").stderr
        return
    assert refused(target, f"{switch}={value}") == f"{switch}={value}: allowed 0 or 1"


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [("SEEDS", "0", "an integer >= 1"), ("SEEDS", "three", "an integer >= 1"),
     ("SEEDS", "-2", "an integer >= 1"), ("STEPS", "-1", "an integer >= 0"),
     ("STEPS", "1.5", "an integer >= 0")],
)  # fmt: skip
def test_seeds_and_steps_take_integers(variable, value, allowed):
    assert refused("q2", f"{variable}={value}") == f"{variable}={value}: allowed {allowed}"


SOURCES = ["MILES_SRC=launch", "MEGATRON_SRC=docs"]


@pytest.mark.parametrize(
    "argv",
    [
        # (folders of the repository stand in for the sources: make checks they are folders)
        ["q2", "REHEARSAL=1", "SEEDS=3", "STEPS=5", "RUN_DIR=r", *SOURCES],
        ["q3", "REHEARSAL=1", "FORCE=1", "Q2_DIR=r", "MODEL=tiny-gpt2", *SOURCES],
        ["q1", "REHEARSAL=1", "DUMPS=d", "MODEL=m", "RUN_DIR=r", *SOURCES],
        ["q1", "DUMPS=d", "MODEL=m"],
        ["swe-arm", "ARM=drop", "A=0.5", "NUM_ROLLOUT=3", "DRY_RUN=1"],
        ["rlvr-sweep", "ARMS=zero mask", "SEEDS=2", "DRY_RUN=1"],
        ["test", "PYTEST_ARGS=-q", "VENV=.venv", "PYTHON=python3"],
        ["rehearsal", *SOURCES, "OFFPOLICY=tis", "ARM=protect"],
        ["rehearsal-test", *SOURCES, "REHEARSAL_MARKERS=x"],
        ["integration", "MILES_SRC=launch", "SLIME_SRC=docs"],
        ["q2", "q3", "FORCE=1"],  # two goals: what either reads
    ],
)
def test_what_a_goal_reads_is_accepted(argv):
    r = make(*argv)
    assert "***" not in r.stderr, r.stderr


def test_a_make_run_by_a_make_is_not_checked_again():
    """A question's stage runs `make rlvr-sweep SEEDS=...` under `make q2 RUN_DIR=...`,
    which passes RUN_DIR down: only the make the user typed is checked."""
    r = make("rlvr-sweep", "RUN_DIR=r", "DRY_RUN=1", env={**ENV, "MAKELEVEL": "1"})
    assert "***" not in r.stderr, r.stderr


def reads_lists() -> dict[str, str]:
    return dict(re.findall(r"^READS_([a-z0-9-]+) :=(.*)$", MAKEFILE, re.M))


def test_every_target_has_its_list_of_variables_in_one_place():
    listed = set(reads_lists())
    cluster = set(re.search(r"^CLUSTER_TARGETS := (.*?)(?<!\\)$", MAKEFILE, re.M | re.S)[1]
                  .replace("\\\n", " ").split())  # fmt: skip
    assert phony_targets() - listed - cluster == set()
    # the training rehearsal's variables
    assert {"MEGATRON_SRC", "OFFPOLICY"} <= set(reads_lists()["rehearsal"].split())
    assert {"MEGATRON_SRC", "REHEARSAL_MARKERS"} <= set(reads_lists()["rehearsal-test"].split())


def test_the_switches_include_every_switch_of_the_launchers():
    common = (ROOT / "launch" / "common.sh").read_text()
    launchers = set(re.search(r"RESCUE_SWITCHES=\(([^)]*)\)", common)[1].split())
    makefile = re.search(r"^SWITCHES := (.*?)(?<!\\)$", MAKEFILE, re.M | re.S)[1]
    assert launchers <= set(makefile.replace("\\\n", " ").split())


@pytest.mark.parametrize("question", ["q2", "q3"])
def test_make_q2_and_q3_check_the_machine_before_installing_anything(tmp_path, question):
    """On a machine without GPUs (no nvidia-smi here), `make q2` stops before it creates
    the virtual environment, so before any package or dataset is fetched."""
    venv = tmp_path / "venv"
    bare = {**ENV, "PATH": "/usr/bin:/bin", "MILES_DIR": str(tmp_path / "no-miles")}
    r = subprocess.run(
        ["make", "--no-print-directory", question, f"VENV={venv}", f"RUN_DIR={tmp_path / 'r'}",
         f"PYTHON={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=bare,
    )  # fmt: skip
    assert r.returncode == 2 and not venv.exists() and not (tmp_path / "r").exists()
    said = r.stderr.splitlines()
    assert said[0].startswith(f"rescue question: error: {question} trains on a GPU cluster")
    assert said[1].startswith("make: *** [Makefile:") and len(said) == 2


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["rehearsal"], "make rehearsal: set MILES_SRC=/path/to/miles"),
        (["rehearsal-test", "MILES_SRC=launch"], "make rehearsal-test: set MEGATRON_SRC="),
        (["rehearsal", "MILES_SRC=no-such", "MEGATRON_SRC=docs"],
         "MILES_SRC=no-such is not a directory: set MILES_SRC to a Miles checkout"),
        (["q1", "REHEARSAL=1"], "make q1: set MILES_SRC=/path/to/miles"),
        (["q2", "REHEARSAL=1", "MILES_SRC=launch"], "make q2: set MEGATRON_SRC="),
        (["agent-arm", "REHEARSAL=1", "ENV=cooking", "ARM=zero"], "make agent-arm: set MILES_SRC="),
        (["integration"], "make integration: set MILES_SRC=/path/to/miles and/or SLIME_SRC="),
        (["integration", "SLIME_SRC=no-such"], "SLIME_SRC=no-such is not a directory"),
        (["q1"], "make q1: set DUMPS=DIR, the debug dumps of a finished run"),
    ],
)  # fmt: skip
def test_a_missing_input_is_refused_before_anything_is_installed(tmp_path, argv, said):
    """Not a dry run: make as typed, with environments that do not exist yet; it stops in
    one line and creates neither."""
    venvs = [f"VENV={tmp_path / 'venv'}"]
    if argv[0] != "integration":  # which does not read it
        venvs.append(f"REHEARSAL_VENV={tmp_path / 'rvenv'}")
    r = subprocess.run(
        ["make", "--no-print-directory", *argv, *venvs, f"PYTHON={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=ENV,
    )  # fmt: skip
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert said in line and line.endswith("nothing was installed.  Stop.")
    assert not (tmp_path / "venv").exists() and not (tmp_path / "rvenv").exists()
