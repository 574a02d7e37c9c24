"""The arm registry (``rescue.arms``): every consumer accepts every registered arm, and the
launchers' tables, the Makefile and the README say what the registry says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rescue import arms
from rescue.errors import InputError
from rescue.gate import Arm

ROOT = Path(__file__).resolve().parents[1]
NAMES = arms.NAMES


def test_the_launchers_table_is_generated_from_the_registry():
    """``launch/arms.sh`` is ``python -m rescue.arms``'s output, byte for byte."""
    text = (ROOT / "launch" / "arms.sh").read_text()
    assert text == arms.bash_table(), "run: python -m rescue.arms > launch/arms.sh"
    out = subprocess.run(
        [sys.executable, "-m", "rescue.arms"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout == text


def _bash_definition(name: str) -> dict[str, str] | None:
    script = (
        f'source {ROOT / "launch" / "arms.sh"}; rescue_arm_definition "$1" || exit 3; '
        "for v in ARM_REGIME ARM_GATE ARM_MASK ARM_SCALING ARM_BASELINE ARM_ESTIMATOR "
        'ARM_DRGRPO ARM_TAKES_A; do echo "$v=${!v}"; done'
    )
    done = subprocess.run(["bash", "-c", script, "bash", name], capture_output=True, text=True)
    if done.returncode == 3:
        return None
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.split())


@pytest.mark.parametrize("name", NAMES)
def test_every_consumer_accepts_every_registered_arm(name):
    from rescue.judge.power import arm_label
    from rescue.judge.runs import ARM_NAMES, identify, parse_name
    from rescue.questions import chains
    from rescue.rehearsal.miles.launchers import LAUNCHERS
    from rescue.rehearsal.verdict import checks
    from rescue.sim.arms import ARMS as SIM_ARMS
    from rescue.sim.arms import ArmSpec
    from rescue.sim.power_cli import question_arms

    arm = arms.ARMS[name]
    # the gate
    assert Arm.of(name) is Arm(arm.gate)
    # the simulator: it runs the arm as defined, or refuses it naming what it runs
    if arm.simulator:
        spec = ArmSpec.parse(f"{name}:0.5" if arm.takes_a else name)
        assert spec.name == name and spec.gate_arm is Arm(arm.gate)
        assert spec.mask is arm.mask and spec.population == arm.population
        assert spec.matched is (arm.scaling is arms.Scaling.MATCHED)
        assert spec.turn_baseline is (arm.estimator == "turn")
        assert spec.pace is (arm.gate == "pace")
        assert (spec.a is not None) is arm.takes_a
        assert name in SIM_ARMS
    else:
        assert name not in SIM_ARMS
        with pytest.raises(InputError, match=f"arm={name!r} is not an arm; allowed: drop"):
            ArmSpec.parse(name)
    # the judge and power
    assert name in ARM_NAMES
    for family in ("swe", "rlvr", "sim"):
        label = f"{family}-{name}" + ("-a0.5" if arm.takes_a else "") + "-seed3"
        cond, seed = parse_name(label)
        assert (cond.family, cond.base_arm, seed) == (family, name, 3)
    cond, seed = identify(tags=f"arm:{name},seed:2", where="test")
    assert (cond.base_arm, seed) == (name, 2)
    assert parse_name(arm_label(f"{name}:0.5" if arm.takes_a else name))[0].base_arm == name
    # the questions, with power's reading of them
    for question in arms.QUESTIONS:
        runs = arms.question_runs(question)
        assert (name in {a for a, _ in runs}) is (question in arm.questions)
        if question != "q1":
            said = question_arms(question)
            assert any(x.partition(":")[0] == name for x in said) is (question in arm.questions)
    assert (name in chains.Q2_ARMS) is ("q2" in arm.questions)
    assert (name in {a for a, _ in chains.Q3_ARMS}) is ("q3" in arm.questions)
    assert (name == chains.Q1_ARM) is ("q1" in arm.questions)
    # the rehearsal: each Miles launcher it rehearses runs exactly its arms
    for launcher, rehearsed in LAUNCHERS.items():
        assert (name in rehearsed.arms) is (launcher in arm.launchers)
    assert (name in checks.MASKING_ARMS) is (arm.budget and arm.mask)
    # the launchers' table
    definition = _bash_definition(name)
    assert definition == {
        "ARM_REGIME": arm.regime,
        "ARM_GATE": arm.gate,
        "ARM_MASK": str(int(arm.mask)),
        "ARM_SCALING": arm.scaling.value,
        "ARM_BASELINE": arm.population,
        "ARM_ESTIMATOR": arm.estimator,
        "ARM_DRGRPO": str(int(arm.drgrpo)),
        "ARM_TAKES_A": str(int(arm.takes_a)),
    }


def test_a_name_that_is_no_arm_is_refused_everywhere():
    from rescue.judge.runs import parse_name

    assert arms.canonical("keep-all") is None
    with pytest.raises(InputError, match="arm='keep-all' is not an arm; allowed: drop, never-drop"):
        Arm.of("keep-all")
    assert parse_name("swe-keep-all-seed1") is None
    assert _bash_definition("keep-all") is None


def test_the_gate_arms_are_the_registry_gate_column():
    assert tuple(a.value for a in Arm) == arms.GATES
    assert {a.gate for a in arms.ARMS.values() if a.budget} == {"never-drop"}


def test_an_old_spelling_is_its_arm_with_one_note(capsys):
    from rescue.sim.arms import ArmSpec

    arms._noted.clear()
    assert arms.ALIASES == {"turn-baseline": "turn"}
    assert ArmSpec.parse("turn-baseline").label == "turn"
    assert ArmSpec.parse("Turn_Baseline").name == "turn"
    err = capsys.readouterr().err
    assert err == "rescue: note: arm 'turn-baseline' is now spelled 'turn'\n"
    notes: list[str] = []
    assert arms.canonical("turn-baseline", note=notes.append) == "turn"
    assert notes == []  # once per process
    assert arms.canonical("turn", note=notes.append) == "turn" and notes == []


def test_the_replay_letters_are_the_registry_arms():
    assert arms.by_replay_letter() == {"a": "zero", "b": "mask", "c": "survivor", "e": "turn"}


def test_a_bad_entry_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="arm x: estimator='pertoken'; allowed: group, turn"):
        arms.ArmDef("x", "budget", "never-drop", "x", estimator="pertoken")
    with pytest.raises(ValueError, match="arm x: a budget-regime arm's gate is never-drop"):
        arms.ArmDef("x", "budget", "drop", "x")


def test_words_spell_a_list_as_the_launchers_messages_do():
    assert arms.words(("a",)) == "a"
    assert arms.words(("a", "b", "c")) == "a, b or c"


#: A list of arm names as a sentence, a usage line or a table spells one: separated by
#: ``|``, commas (with or without ``or``), ``or`` or spaces.
_NAME = "|".join(re.escape(n) for n in sorted(NAMES, key=len, reverse=True))
_SEP = r"(?:\s*\|\s*|,\s*(?:or\s+)?|\s+or\s+|\s+)"
_LIST = re.compile(rf"(?<![\w-])(?:{_NAME})(?:{_SEP}(?:{_NAME}))+(?![\w-])")
_ALLOWED_LISTS = {
    NAMES,
    *(arms.names(regime=r) for r in arms.REGIMES),
    *(arms.names(launcher=x) for x in arms.LAUNCHERS),
}


def spelled_lists(text: str) -> list[tuple[str, ...]]:
    """Every list of three or more arm names in ``text`` (comment markers joined away)."""
    text = re.sub(r"\n\s*#\s*", " ", text)
    found = []
    for m in _LIST.finditer(text):
        items = tuple(re.findall(rf"(?<![\w-])(?:{_NAME})(?![\w-])", m.group(0)))
        if len(items) >= 3:
            found.append(items)
    return found


def test_the_list_finder_reads_the_launchers_spellings():
    assert spelled_lists("ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn") == [
        arms.names(regime="budget")
    ]
    assert spelled_lists("ARM=zero|mask|drgrpo-mask [SEED=1]") == [("zero", "mask", "drgrpo-mask")]
    assert spelled_lists("# ARM: drop | never-drop | protect | pace |\n# zero | mask") == [
        ("drop", "never-drop", "protect", "pace", "zero", "mask")
    ]
    assert spelled_lists("set ARM to drop, never-drop, protect or pace") == [
        arms.names(regime="stale")
    ]


@pytest.mark.parametrize(
    "path",
    ["Makefile", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "launch").glob("*.sh"))],
)
def test_every_arm_list_the_launchers_spell_is_a_registry_list(path):
    """A list of arms written out in a launcher or the Makefile (usage lines, messages,
    defaults) is the registry's list of a regime, a launcher, or every arm, in its order."""
    wrong = [x for x in spelled_lists((ROOT / path).read_text()) if x not in _ALLOWED_LISTS]
    assert not wrong, f"{path}: arm lists not in rescue/arms.py's table: {wrong}"


def test_the_readme_table_of_arms_is_the_registry():
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)`[^|]*\| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", text, re.M)
    assert [r[0] for r in rows] == list(NAMES)
    for name, regime, summary, where in rows:
        arm = arms.ARMS[name]
        assert regime.split()[0] == {"stale": "infrastructure", "budget": "budget"}[arm.regime]
        assert summary == arm.summary
        runs_on = {"Miles"} if set(arm.launchers) - {"slime"} else set()
        runs_on |= {"slime"} if "slime" in arm.launchers else set()
        runs_on |= {"simulator"} if arm.simulator else set()
        assert set(where.split(", ")) == runs_on, name
