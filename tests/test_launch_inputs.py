"""What the launchers and the Makefile tell a user who sets something wrong, and `make help`.

The launchers run with ``DRY_RUN=1`` against stand-ins (``launch_env``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from launch_env import ROOT, launch
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import miles_dir as miles_dir  # a fixture


def slime_checkout(tmp_path: Path) -> Path:
    """A stand-in slime checkout: the two entry points a Miles checkout has, and slime/."""
    slime = tmp_path / "slime-checkout"
    (slime / "slime").mkdir(parents=True)
    for name in ("train.py", "train_async.py"):
        (slime / name).write_text("")
    return slime


@pytest.mark.parametrize(
    ("script", "prog", "env"),
    [
        ("swe_arm.sh", "swe-arm", {"ARM": "drop"}),
        ("rlvr_arm.sh", "rlvr-arm", {"ARM": "zero", "CAP": "1024"}),
    ],
)
def test_miles_dir_naming_a_slime_checkout_says_so(script, prog, env, bin_dir, tmp_path):
    slime = slime_checkout(tmp_path)
    result = launch(script, bin_dir, None, DRY_RUN="1", MILES_DIR=str(slime), **env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"{prog}: error: MILES_DIR={slime} is a slime checkout (it holds slime/, not miles/): "
        "set MILES_DIR to a Miles checkout (radixark/miles)\n"
    )


def test_a_miles_checkout_is_not_taken_for_slime(bin_dir, miles_dir):
    """The stand-in Miles checkout has neither slime/ nor miles/: it is not refused."""
    result = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", ARM="drop")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("seed", ["-3", "-0", "1.5", "x"])
def test_a_seed_the_judge_cannot_read_is_refused(seed, bin_dir, miles_dir):
    result = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", ARM="drop", SEED=seed)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"swe-arm: error: SEED='{seed}' is not a non-negative integer")


def test_seed_zero_is_a_seed(bin_dir, miles_dir):
    result = launch("swe_arm.sh", bin_dir, miles_dir, DRY_RUN="1", ARM="drop", SEED="0")
    assert result.returncode == 0, result.stderr
    assert "-seed0" in result.stdout


# ── make help ────────────────────────────────────────────────────────────────────────────

MAKEFILE = (ROOT / "Makefile").read_text()


def phony_targets() -> set[str]:
    return {t for line in re.findall(r"^\.PHONY:(.*)$", MAKEFILE, re.M) for t in line.split()}


#: GNU make's own variables, which the Makefile reads and a user does not set.
MAKE_OWN = {"MAKELEVEL", "MAKECMDGOALS", "MAKEFLAGS", "MAKE", "CURDIR"}


def user_variables() -> set[str]:
    """Variables a user sets: assigned with ``?=``, or read but never assigned here (make's
    own variables aside)."""
    assigned = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*:?=", MAKEFILE, re.M))
    defaulted = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*\?=", MAKEFILE, re.M))
    read = set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", MAKEFILE))
    read |= set(re.findall(r"\$\((?:or|if) \$\(([A-Z][A-Z0-9_]*)\)", MAKEFILE))
    return defaulted | (read - assigned - MAKE_OWN)


def make_help(*args: str) -> str:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def test_make_help_lists_every_target():
    text = make_help("help")
    listed = set(re.findall(r"make ([a-z][a-z0-9-]*)", text))
    assert phony_targets() - listed == set()
    assert {"demo", "rlvr-sweep", "help", "clean"} <= phony_targets()


def test_make_help_names_every_variable_of_the_makefile():
    text = make_help("help")
    missing = {v for v in user_variables() if not re.search(rf"\b{v}\b", text)}
    assert missing == set()
    assert {"PYTHON", "VENV", "TORCH", "PYTEST_ARGS", "MILES_SRC", "DRY_RUN"} <= user_variables()


def test_plain_make_is_help():
    assert make_help() == make_help("help")
