"""The arms: every arm named once, with what defines it.

Specification
-------------
An *arm* is one way of handling an outcome-dependent exclusion. Each changes one thing: a
stale-handling arm (regime ``stale``) decides what happens to a group that arrives too stale
and scores a capped rollout R = 0; a budget-regime arm (regime ``budget``) decides what
happens to a capped rollout and never drops a group (its gate is never-drop).

==============  ======  ==========  ====  =======  =========  =========  ======  =====
arm             regime  gate        mask  scaling  baseline   estimator  Dr.    a
                                                                         GRPO
==============  ======  ==========  ====  =======  =========  =========  ======  =====
``drop``        stale   drop        no    none     all G      group      no      no
``never-drop``  stale   never-drop  no    none     all G      group      no      no
``protect``     stale   protect     no    none     all G      group      no      yes
``pace``        stale   pace        no    none     all G      group      no      no
``zero``        budget  never-drop  no    none     all G      group      no      no
``mask``        budget  never-drop  yes   none     all G      group      no      no
``matched``     budget  never-drop  yes   matched  all G      group      no      no
``step-control`` budget never-drop  yes   step     all G      group      no      no
``drgrpo-mask`` budget  never-drop  yes   none     all G      group      yes     no
``survivor``    budget  never-drop  yes   none     survivors  group      no      no
``turn``        budget  never-drop  no    none     all G      turn       no      no
==============  ======  ==========  ====  =======  =========  =========  ======  =====

What each column means, and who reads it:

``gate``        the ``rescue.gate.Arm`` of the arm (the launchers' ``RESCUE_ARM``).
``mask``        capped rollouts are loss-masked (``rescue.mask.mask_decision`` with rho = 1;
                the filter ``filters.mask_truncated_zero_reward`` on the cluster).
``scaling``     how each step's size is set: ``none`` (the arm's own), ``matched`` (the
                mask's direction at the update norm the R = 0 arm takes on the same batch
                from the same state: ``rescue.mask.matched_scale``, ``rescue.miles.matched``),
                ``step`` (the step-size control: R = 0's direction at the update norm the
                mask arm takes on the same batch from the same state; its mask filter runs
                to measure the mask's step, which is not applied).
``population``  the group baseline's population (``rescue.advantages.group_advantages``).
``estimator``   ``group`` (one advantage per rollout) or ``turn`` (per turn, with the
                turn-reached baseline). For a stale-handling arm these three are the
                defaults of settings its launcher lets one change (``BASELINE``,
                ``ESTIMATOR``, ``DRGRPO``); a budget-regime arm sets them itself.

Where an arm runs: ``launchers`` (``swe``, ``rlvr``, ``agent`` on Miles, ``slime``),
``questions`` (``q1`` replays the dumps of its run, ``q2`` and ``q3`` train it; q3 runs
protect at each of ``QUESTION_A["q3"]``), ``simulator`` (``rescue sim``) and ``replay``
(the letter of the offline replay's arms (a)-(e), ``rescue replay advantages``; (d) is a
fraction of the mask, not an arm of its own).

One vocabulary: an arm is spelled as here everywhere (launchers, runs' names, the
simulator, the judge). An old spelling in ``aliases`` is still accepted, with a one-line
note on stderr (``canonical``).

Adding an arm: one ``ArmDef`` below, then its behaviour where the columns are read;
``launch/arms.sh`` is generated from this table (``python -m rescue.arms >
launch/arms.sh``), and ``tests/test_arms.py`` checks every consumer accepts every arm.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

REGIMES: tuple[str, ...] = ("stale", "budget")
GATES: tuple[str, ...] = ("drop", "never-drop", "protect", "pace")
POPULATIONS: tuple[str, ...] = ("all", "survivors")
ESTIMATORS: tuple[str, ...] = ("group", "turn")
LAUNCHERS: tuple[str, ...] = ("swe", "rlvr", "agent", "slime")
QUESTIONS: tuple[str, ...] = ("q1", "q2", "q3")


class Scaling(str, Enum):
    """How an arm's step size is set (module docstring)."""

    NONE = "none"
    #: the mask's direction at the R = 0 arm's update norm
    MATCHED = "matched"
    #: R = 0's direction at the mask arm's update norm
    STEP = "step"


@dataclass(frozen=True)
class ArmDef:
    """One arm: what defines it and where it runs (module docstring)."""

    name: str
    regime: str
    gate: str
    #: One line for the arms' table in the README (what happens to the excluded rollouts).
    summary: str
    mask: bool = False
    scaling: Scaling = Scaling.NONE
    population: str = "all"
    estimator: str = "group"
    drgrpo: bool = False
    takes_a: bool = False
    aliases: tuple[str, ...] = ()
    launchers: tuple[str, ...] = ()
    questions: tuple[str, ...] = ()
    simulator: bool = True
    replay: str | None = None

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("regime", self.regime, REGIMES),
            ("gate", self.gate, GATES),
            ("population", self.population, POPULATIONS),
            ("estimator", self.estimator, ESTIMATORS),
            *(("launchers", x, LAUNCHERS) for x in self.launchers),
            *(("questions", x, QUESTIONS) for x in self.questions),
        ):
            if value not in allowed:
                raise ValueError(
                    f"arm {self.name}: {field}={value!r}; allowed: {', '.join(allowed)}"
                )
        if self.regime == "budget" and self.gate != "never-drop":
            raise ValueError(f"arm {self.name}: a budget-regime arm's gate is never-drop")

    @property
    def budget(self) -> bool:
        """Whether the arm belongs to the budget regime (it never drops a group)."""
        return self.regime == "budget"


_STALE = ("swe", "slime")
_BUDGET = ("swe", "rlvr", "agent")

#: Every arm, in the order tables and lists show them.
ARMS: dict[str, ArmDef] = {
    arm.name: arm
    for arm in (
        ArmDef(
            "drop",
            "stale",
            "drop",
            "a group staler than K is dropped (Miles' default)",
            launchers=_STALE,
            questions=("q3",),
        ),
        ArmDef(
            "never-drop",
            "stale",
            "never-drop",
            "every group is trained, weight 1",
            launchers=_STALE,
            questions=("q1", "q3"),
        ),
        ArmDef(
            "protect",
            "stale",
            "protect",
            "a stale group is kept with probability a and weighted 1/a",
            takes_a=True,
            launchers=_STALE,
            questions=("q3",),
        ),
        ArmDef(
            "pace",
            "stale",
            "pace",
            "no group arrives staler than K: the trainer waits for stragglers",
            launchers=_STALE,
            questions=("q3",),
        ),
        ArmDef(
            "zero",
            "budget",
            "never-drop",
            "capped rollouts score R = 0 and are trained",
            launchers=_BUDGET,
            questions=("q2",),
            replay="a",
        ),
        ArmDef(
            "mask",
            "budget",
            "never-drop",
            "capped rollouts are loss-masked",
            mask=True,
            launchers=_BUDGET,
            questions=("q2",),
            replay="b",
        ),
        ArmDef(
            "matched",
            "budget",
            "never-drop",
            "the mask arm's step rescaled to the `zero` arm's update norm",
            mask=True,
            scaling=Scaling.MATCHED,
            launchers=_BUDGET,
            questions=("q2",),
        ),
        ArmDef(
            "step-control",
            "budget",
            "never-drop",
            "the `zero` arm's step rescaled to the mask arm's update norm",
            mask=True,
            scaling=Scaling.STEP,
            launchers=_BUDGET,
            questions=("q2",),
        ),
        ArmDef(
            "drgrpo-mask",
            "budget",
            "never-drop",
            "the mask with Dr. GRPO's constant normalization",
            mask=True,
            drgrpo=True,
            launchers=_BUDGET,
            questions=("q2",),
            simulator=False,
        ),
        ArmDef(
            "survivor",
            "budget",
            "never-drop",
            "the mask with the survivors' baseline",
            mask=True,
            population="survivors",
            launchers=_BUDGET,
            questions=("q2",),
            replay="c",
        ),
        ArmDef(
            "turn",
            "budget",
            "never-drop",
            "R = 0 with the turn-reached baseline",
            estimator="turn",
            aliases=("turn-baseline",),
            launchers=_BUDGET,
            questions=("q2",),
            replay="e",
        ),
    )
}

#: Every arm name, in table order.
NAMES: tuple[str, ...] = tuple(ARMS)
#: Old spelling -> the arm's name.
ALIASES: dict[str, str] = {alias: arm.name for arm in ARMS.values() for alias in arm.aliases}
#: The keep probabilities a question runs an arm that takes ``a`` at.
QUESTION_A: dict[str, tuple[float, ...]] = {"q3": (0.25, 0.5)}

_noted: set[str] = set()


def _note_stderr(text: str) -> None:
    print(f"rescue: note: {text}", file=sys.stderr)


def canonical(text: str, *, note: Callable[[str], None] | None = _note_stderr) -> str | None:
    """The arm ``text`` names (case and ``_`` for ``-`` aside), or None when it names none.
    An alias gives its arm, with a one-line note (once per alias and process) through
    ``note`` (None: no note)."""
    name = text.strip().lower().replace("_", "-")
    if name in ARMS:
        return name
    if name in ALIASES:
        if note is not None and name not in _noted:
            _noted.add(name)
            note(f"arm {name!r} is now spelled {ALIASES[name]!r}")
        return ALIASES[name]
    return None


def names(
    *,
    regime: str | None = None,
    launcher: str | None = None,
    question: str | None = None,
    simulator: bool | None = None,
) -> tuple[str, ...]:
    """The arms (in table order) of a regime, a launcher, a question or the simulator."""
    return tuple(
        arm.name
        for arm in ARMS.values()
        if (regime is None or arm.regime == regime)
        and (launcher is None or launcher in arm.launchers)
        and (question is None or question in arm.questions)
        and (simulator is None or arm.simulator == simulator)
    )


def question_runs(question: str) -> tuple[tuple[str, float | None], ...]:
    """The (arm, a) runs of a question: an arm that takes ``a`` once per ``QUESTION_A``."""
    out: list[tuple[str, float | None]] = []
    for name in names(question=question):
        if ARMS[name].takes_a:
            out.extend((name, a) for a in QUESTION_A[question])
        else:
            out.append((name, None))
    return tuple(out)


def by_replay_letter() -> dict[str, str]:
    """The offline replay's letter -> the arm it computes (``rescue.replay.arms``)."""
    return {arm.replay: arm.name for arm in ARMS.values() if arm.replay}


def words(items: tuple[str, ...] | list[str], last: str = "or") -> str:
    """``a, b or c``: a list as the launchers' messages spell it."""
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"


def _bash_array(name: str, items: tuple[str, ...]) -> str:
    """``RESCUE_<name>=(items)``: a list of the launchers' (not a setting: none reads it from
    the environment)."""
    return f"RESCUE_{name}=({' '.join(items)})"


def _bash_words(name: str, items: tuple[str, ...]) -> str:
    return f'RESCUE_{name}="{words(items)}"'


def bash_table() -> str:
    """``launch/arms.sh``: the table as the launchers read it (``python -m rescue.arms``)."""
    lines = [
        "# shellcheck shell=bash",
        "# shellcheck disable=SC2034  # the variables are read by the scripts that source this file",
        "# The arms, generated from rescue/arms.py by `python -m rescue.arms > launch/arms.sh`:",
        "# change the table there, not here (tests/test_arms.py fails when the two differ).",
        "# Sourced by common.sh and rlvr_config.sh.",
        "",
        _bash_array("ARM_NAMES", NAMES),
        _bash_array("STALE_ARMS", names(regime="stale")),
        _bash_array("BUDGET_ARMS", names(regime="budget")),
        *(_bash_array(f"{x.upper()}_ARM_LIST", names(launcher=x)) for x in LAUNCHERS),
        _bash_words("STALE_ARM_WORDS", names(regime="stale")),
        _bash_words("BUDGET_ARM_WORDS", names(regime="budget")),
        *(_bash_words(f"{x.upper()}_ARM_WORDS", names(launcher=x)) for x in LAUNCHERS),
        "",
        "# True when ARM is a stale-handling arm / a budget-regime arm.",
        "rescue_is_stale_arm() {",
        '  [[ " ${RESCUE_STALE_ARMS[*]} " == *" $ARM "* ]]',
        "}",
        "rescue_is_budget_arm() {",
        '  [[ " ${RESCUE_BUDGET_ARMS[*]} " == *" $ARM "* ]]',
        "}",
        "",
        "# rescue_arm_definition NAME: the arm's row of the table as ARM_REGIME, ARM_GATE,",
        "# ARM_MASK (0 or 1), ARM_SCALING, ARM_BASELINE, ARM_ESTIMATOR, ARM_DRGRPO (0 or 1) and",
        "# ARM_TAKES_A (0 or 1); status 1, nothing set, for a NAME that is not an arm.",
        "rescue_arm_definition() {",
        "  case $1 in",
    ]
    for arm in ARMS.values():
        lines.append(
            f"    {arm.name}) ARM_REGIME={arm.regime} ARM_GATE={arm.gate} ARM_MASK={int(arm.mask)}"
            f" ARM_SCALING={arm.scaling.value} ARM_BASELINE={arm.population}"
            f" ARM_ESTIMATOR={arm.estimator} ARM_DRGRPO={int(arm.drgrpo)}"
            f" ARM_TAKES_A={int(arm.takes_a)} ;;"
        )
    lines += ["    *) return 1 ;;", "  esac", "}", ""]
    return "\n".join(lines)


def main() -> int:
    """``python -m rescue.arms``: print ``launch/arms.sh``."""
    sys.stdout.write(bash_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
