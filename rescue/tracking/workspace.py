"""The census as a researcher reads it in wandb: a saved workspace, section by question.

Specification
-------------
``SECTIONS`` is the workspace, as plain data: each section answers one question of the
census, each panel names its keys, its x axis and what it answers. ``build(entity,
project, group=...)`` turns it into wandb's own ``wandb_workspaces.workspaces.Workspace``
(the ``[wandb]`` extra), ``describe()`` into the text ``--dry-run`` prints, and
``rescue.tracking.preview`` draws the same panels from offline runs.

The runs are grouped the way the launchers name them: by wandb group, which is the run's
name ``<family>-<arm>[-a<A>][-k<K>]...-seed<S>`` for the launchers' runs (one arm and seed
a group) and the arm's label for the simulator's (its seeds in the group, as mean and
range); ``--group`` keeps the runs of one group, or of the groups a regular expression
matches. Every key a panel names is logged by the Miles adapter, the slime adapter or the
simulator (a test), against ``rollout/step`` or ``train/step`` as
``rescue.tracking.metrics`` declares; the panels keyed by b plot against ``B_AXIS``, b of the
steps before (the same step's b shares its rollouts' noise with the rates).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rescue.errors import InputError
from rescue.tracking.metrics import B_AXIS, STEP, TRAIN_STEP

C = "rollout/census/"
G = C + "generated/"
S = C + "samples/"
#: The outcomes, in the census' order.
OUTCOMES = ("solved", "submitted_failure", "budget_failure", "infra_no_result")
#: The scored outcomes (an infra no-result has no turns worth comparing).
SCORED = OUTCOMES[:3]
#: Where a group can end (``rescue.census.Bucket``).
BUCKETS = (
    "trained_fresh", "trained_stale", "trained_protected", "dropped_stale", "aborted",
    "filtered", "lost",
)  # fmt: skip
#: The workspace's name in wandb.
NAME = "rescue: the outcome census"


@dataclass(frozen=True)
class Panel:
    """One line plot: ``keys`` against ``x``; ``style`` ``line``, ``stacked-area`` or
    ``pct-area`` (shares); ``answers``: the question it answers, in a sentence."""

    title: str
    keys: tuple[str, ...]
    answers: str
    x: str = STEP
    style: str = "line"


@dataclass(frozen=True)
class Section:
    """A section of the workspace: the question its panels answer."""

    name: str
    question: str
    panels: tuple[Panel, ...]


SECTIONS: tuple[Section, ...] = (
    Section(
        "Where every group went",
        "Did every group that entered the buffer land in exactly one bucket, and which?",
        (
            Panel(
                "Groups settled per step, by bucket",
                tuple(f"{C}groups/{b}" for b in BUCKETS),
                "how many groups trained fresh, stale or protected, and how many were dropped, "
                "aborted, filtered or lost",
                style="stacked-area",
            ),
            Panel(
                "Conservation: groups entered, still buffered, requeued",
                (f"{C}groups/entered", f"{C}groups/buffered", f"{C}groups/requeued"),
                "entered = settled + the change in buffered, every step (the census checks it)",
            ),
            Panel(
                "Groups without a result",
                (f"{C}no_result/fraction", f"{C}no_result/groups"),
                "how often an infrastructure fault excluded a group (what the watchdog stops on)",
            ),
        ),
    ),
    Section(
        "The four outcomes",
        "What became of the rollouts: solved, submitted failure, budget failure, no result?",
        (
            Panel(
                "Outcome shares, every generated rollout",
                tuple(f"{G}outcome/{o}_rate" for o in OUTCOMES),
                "the policy's behaviour, whatever the arm did with the groups (the judge's view)",
                style="pct-area",
            ),
            Panel(
                "Outcome shares, trained rollouts",
                tuple(f"{C}outcome/{o}_rate" for o in OUTCOMES),
                "what the loss saw: a drop arm's survivors only",
                style="pct-area",
            ),
            Panel(
                "Outcomes of the dropped stale groups",
                tuple(f"{C}dropped/outcome/{o}" for o in OUTCOMES),
                "whether the drop tracks the outcome (an outcome-dependent exclusion shows here)",
            ),
        ),
    ),
    Section(
        "Turns by outcome",
        "Do successes come fast and failures slow, and do successes run the tests?",
        (
            Panel(
                "Mean turns by outcome, every generated rollout",
                tuple(f"{G}turns_mean/{o}" for o in SCORED),
                "the 'succeed fast, fail slow' signature: budget failures at the cap",
            ),
            Panel(
                "p90 turns by outcome, every generated rollout",
                tuple(f"{G}turns_p90/{o}" for o in SCORED),
                "the tail of each outcome's turns",
            ),
            Panel(
                "Successes that ran the tests before submitting",
                (f"{G}ran_tests_rate/solved", f"{C}ran_tests_rate/solved"),
                "whether the policy checks its work (generated and trained views)",
            ),
        ),
    ),
    Section(
        "Against b",
        "Does the cap-hit rate move with the baseline b the masked rollouts are paid?",
        (
            Panel(
                "Cap-hit rate against b (b of the steps before)",
                (f"{G}cap_hit_rate", f"{C}cap_hit_rate"),
                "the plan's subsidy: masking pays a capped rollout b, so the cap-hit rate should "
                "rise with b under the mask and not under R = 0",
                x=B_AXIS,
            ),
            Panel(
                "Submitted-failure rate against b (b of the steps before)",
                (f"{G}outcome/submitted_failure_rate",),
                "whether submitting (and failing) gives way to running into the cap as b rises",
                x=B_AXIS,
            ),
            Panel(
                "b over the run",
                (f"{C}b_all", B_AXIS, f"{C}b_realized", f"{C}b_paid/masked"),
                "the realized baseline (all members, unmasked only), its prior-steps value, and "
                "what the masked rollouts were paid",
            ),
        ),
    ),
    Section(
        "Staleness and protect",
        "How stale were the trained groups, and did protect keep its share at weight 1/a?",
        (
            Panel(
                "Staleness of the trained groups",
                (f"{C}staleness_mean", f"{C}staleness_max"),
                "how far behind the weights the trained groups were generated",
            ),
            Panel(
                "Stale groups kept by protect and dropped (kept share = keep rate, expect a)",
                (f"{C}groups/trained_protected", f"{C}groups/dropped_stale"),
                "protect's keep rate against a: each protect-a<A> group's kept share sits at its a",
                style="pct-area",
            ),
            Panel(
                "Protect's weights",
                (f"{C}protected_weight_mean", f"{S}weight_mean", f"{C}protected_groups"),
                "the 1/a weight of the protected groups and the batch's mean weight",
            ),
        ),
    ),
    Section(
        "Pace",
        "How long did pace's schedule hold finished groups back?",
        (
            Panel(
                "Pace's waits",
                (f"{C}pace_wait_s", f"{C}pace_wait_groups"),
                "seconds a step waited for the schedule, and the takes that waited",
            ),
        ),
    ),
    Section(
        "The off-policy correction",
        "Is the sampler's distribution close enough to the trainer's for the correction?",
        (
            Panel(
                "Score centering: the correction's size and the truncated share",
                ("train/rescue/sc/correction_l1", "train/rescue/sc/truncated_frac"),
                "the L1 size of the score-centering correction and the tokens it truncated",
                x=TRAIN_STEP,
            ),
            Panel(
                "Score centering: head mass of the sampler and the trainer",
                ("train/rescue/sc/head_mass_sampler", "train/rescue/sc/head_mass_trainer"),
                "how much probability the recorded top-K heads hold on each side",
                x=TRAIN_STEP,
            ),
            Panel(
                "Simulator: the correction's size and TIS clipping",
                ("sim/sc_correction_l1", "sim/tis_clipfrac"),
                "the same diagnostics in the simulator",
            ),
        ),
    ),
    Section(
        "The trainer",
        "What did each optimizer step do?",
        (
            Panel(
                "Update norm",
                ("train/rescue/update_norm",),
                "‖Δθ‖ of each optimizer step",
                x=TRAIN_STEP,
            ),
            Panel(
                "Advantages on the trained tokens",
                ("train/rescue/adv_mean", "train/rescue/adv_var"),
                "mean and variance of the advantages the loss trained",
                x=TRAIN_STEP,
            ),
            Panel(
                "Simulator: update norm",
                ("sim/update_norm",),
                "‖Δθ‖ of each simulated step",
            ),
        ),
    ),
)


def panel_keys(sections: tuple[Section, ...] = SECTIONS) -> list[str]:
    """Every key a panel plots or keys its x axis on (``rollout/step`` and ``train/step``
    included), in order, once each."""
    keys: dict[str, None] = {}
    for section in sections:
        for p in section.panels:
            keys.update(dict.fromkeys((p.x, *p.keys)))
    return list(keys)


def unlogged(logged: set[str], sections: tuple[Section, ...] = SECTIONS) -> list[str]:
    """The keys some panel of ``sections`` names that are not in ``logged``."""
    return [k for k in panel_keys(sections) if k not in logged]


def group_filter(group: str | None) -> str | None:
    """``--group``: the wandb group itself, or a regular expression over groups (checked)."""
    if group is None:
        return None
    try:
        re.compile(group)
    except re.error as e:
        raise InputError(f"--group {group!r}: not a regular expression ({e})") from None
    return group


def describe(entity: str, project: str, group: str | None = None) -> str:
    """The workspace as ``--dry-run`` prints it: sections, their questions and panels."""
    lines = [f"workspace {NAME!r} for {entity}/{project}"]
    lines.append(f"  runs: {'groups matching ' + repr(group) if group else 'every run'}, "
                 "grouped by wandb group (the launchers' <family>-<arm>...-seed<S>)")  # fmt: skip
    for s in SECTIONS:
        lines += ["", f"{s.name}: {s.question}"]
        for p in s.panels:
            kind = "" if p.style == "line" else f" [{p.style}]"
            lines.append(f"  - {p.title}{kind}")
            lines.append(f"      x: {p.x}")
            lines.append(f"      y: {', '.join(p.keys)}")
            lines.append(f"      answers: {p.answers}")
    return "\n".join(lines)


def build(entity: str, project: str, group: str | None = None) -> Any:
    """The workspace as ``wandb_workspaces.workspaces.Workspace`` (not saved)."""
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
        from wandb_workspaces import expr
    except ImportError:
        raise InputError(
            "rescue wandb workspace needs wandb-workspaces: pip install 'rescue[wandb]'"
        ) from None
    sections = [
        ws.Section(
            name=s.name,
            is_open=True,
            panels=[
                wr.LinePlot(
                    title=p.title,
                    x=p.x,
                    y=list(p.keys),
                    plot_type=p.style,
                    groupby_aggfunc="mean",
                    groupby_rangefunc="minmax",
                )
                for p in s.panels
            ],
        )
        for s in SECTIONS
    ]
    runset = ws.RunsetSettings(
        query=group_filter(group) or "",
        regex_query=group is not None,
        groupby=[expr.Metric("Group")],
    )
    return ws.Workspace(
        entity=entity,
        project=project,
        name=NAME,
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis=STEP),
        runset_settings=runset,
    )
