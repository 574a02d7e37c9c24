"""The three launchers the training rehearsal runs, each with its settings and its checks.

One driver (``rescue.rehearsal.miles.run``) rehearses any of them: it runs the launcher
with ``DRY_RUN=1`` and the settings below, takes the ``ray job submit`` command it prints
(the exact training command of the arm), applies the CPU-change table and runs it.

=========  ======================  ==================  ==============================
launcher   script                  Miles entry point   what a step is
=========  ======================  ==================  ==============================
``swe``    ``launch/swe_arm.sh``   ``train_async.py``  SWE-smith trials of a scripted
                                                       agent in stand-in sandboxes,
                                                       fully asynchronous
``rlvr``   ``launch/rlvr_arm.sh``  ``train.py``        single-turn responses sampled
                                                       from the taught tiny model,
                                                       graded by Miles' ``math`` grader
``agent``  ``launch/agent_arm.sh`` ``train.py``        TextWorld cooking episodes, one
                                                       engine request per action
=========  ======================  ==================  ==============================

A launcher's ``settings`` are the variables the rehearsal sets, each with its reason
(printed at the start of a run), and ``arm_settings`` an arm's own over them; every other
variable keeps the launcher's own default.
``{out}`` is the run folder, ``{model}`` the tiny model's folder and ``{megatron}`` its
weights as a Megatron checkpoint. ``CHECKS[launcher]``
names the checks of ``rescue.rehearsal.verdict.report`` that apply; the others are reported as
"does not apply", with the reason in ``NOT_APPLICABLE``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rescue import arms


@dataclass(frozen=True)
class Launcher:
    """One launcher the rehearsal runs (module docstring)."""

    name: str
    script: str
    entry: str
    #: The arms it runs (``rescue.arms``' launchers column).
    arms: tuple[str, ...]
    #: The launcher's own default OFFPOLICY, and the values the rehearsal may set.
    offpolicy: tuple[str, ...]
    settings: tuple[tuple[str, str, str], ...]
    #: The family ``rescue report`` judges the run as (``rescue.judge.runs``).
    family: str
    #: Settings of one arm over ``settings`` (name, value, reason).
    arm_settings: dict[str, tuple[tuple[str, str, str], ...]] = field(default_factory=dict)

    def settings_of(self, arm: str) -> tuple[tuple[str, str, str], ...]:
        """The launcher's settings with the arm's own over them."""
        own = self.arm_settings.get(arm, ())
        names = {name for name, _, _ in own}
        return (*(s for s in self.settings if s[0] not in names), *own)


_COMMON: tuple[tuple[str, str, str], ...] = (
    ("GPUS_PER_NODE", "2", "Ray logical GPUs: one train actor, one (external) engine"),
    ("TP", "1", "one training process"),
    ("CP", "1", "one training process"),
    ("LR", "1e-3", "a step moves the bf16 weights (1e-6 moves only the fp32 main weights)"),
    ("SAVE_INTERVAL", "1000", "one checkpoint, at the last step"),
    ("WANDB_MODE", "offline", "no network; the report reads the offline history"),
    ("DUMP_STEPS", "all", "every step's rollout dump, for the replay check"),
    ("RAY_STOP", "0", "never stop another Ray on a shared machine"),
)

SWE = Launcher(
    name="swe",
    script="launch/swe_arm.sh",
    entry="train_async.py",
    arms=arms.names(launcher="swe"),
    offpolicy=("tis-sc", "tis"),
    family="swe",
    settings=(
        ("ROLLOUT_BATCH_SIZE", "2", "2 cores: 2 prompts a step"),
        ("N_SAMPLES", "4", "group size 4: one trial of each scripted behaviour per group"),
        ("MAX_TURNS", "8", "a turn cap the loop behaviour reaches within seconds"),
        (
            "MAX_SEQ_LEN",
            "4096",
            "the agent's system prompt (1.3k tokens of the tiny tokenizer) and 8 turns fit; "
            "the overrun behaviour fills it in a few turns",
        ),
        ("MAX_RESPONSE_LEN", "1024", "below MAX_SEQ_LEN, as the launcher requires"),
        (
            "STALENESS",
            "0",
            "K = 0: a group generated across a weight update is stale, so a few steps have "
            "stale groups",
        ),
        ("AGENT_CONCURRENCY", "16", "4 groups' trials at once (with the EXTRA_ARGS below)"),
        (
            "EXTRA_ARGS",
            "--async-max-concurrent-samples 16",
            "4 groups in flight, not Miles' default of one step's 2: groups that start while "
            "the trainer steps make model calls before the next weight update, so stale "
            "groups appear every step (the rehearsal's --extra-args are added after)",
        ),
        ("MAX_TOKENS_PER_GPU", "4096", "micro-batches of a few trajectories"),
        *_COMMON,
        (
            "REF_LOAD",
            "{out}/ref",
            "empty: the trainer starts from Megatron's seeded initialization; the engine "
            "receives those weights at Miles' first weight update",
        ),
        (
            "PREFLIGHT",
            "0",
            "the cluster pre-flight checks GPUs and Docker; the rehearsal has its own",
        ),
        ("REAP", "0", "no real containers"),
    ),
    arm_settings={
        "pace": (("STALENESS", "1", "pace needs K >= 1 for a window wider than one step's batch"),),
        "drop": (
            ("AGENT_CONCURRENCY", "12", "3 groups' trials at once (with the EXTRA_ARGS below)"),
            (
                "EXTRA_ARGS",
                "--async-max-concurrent-samples 12",
                "3 groups in flight: one crosses each weight update and is dropped; with 4 "
                "nearly every group in flight went stale and each step waited for them to be "
                "generated again (the rehearsal's --extra-args are added after)",
            ),
        ),
    },
)

RLVR = Launcher(
    name="rlvr",
    script="launch/rlvr_arm.sh",
    entry="train.py",
    arms=arms.names(launcher="rlvr"),
    offpolicy=("none", "tis", "tis-sc"),
    family="rlvr",
    settings=(
        ("ROLLOUT_BATCH_SIZE", "4", "4 prompts a step"),
        (
            "N_SAMPLES",
            "4",
            "groups of 4: the taught model's right, wrong and truncated responses side by side",
        ),
        ("GPUS_PER_RUN", "1", "one training process"),
        ("MAX_TOKENS_PER_GPU", "2048", "micro-batches of a few dozen responses, above the cap"),
        *_COMMON,
        (
            "REF_LOAD",
            "{megatron}",
            "the taught model in Megatron's format (rescue.rehearsal.miles.checkpoint): the "
            "trainer starts from the weights the engine serves and the calibration measured",
        ),
        ("HF_CHECKPOINT", "{model}", "the taught tiny model (rescue.rehearsal.tiny.singleturn)"),
    ),
)

AGENT = Launcher(
    name="agent",
    script="launch/agent_arm.sh",
    entry="train.py",
    arms=arms.names(launcher="agent"),
    offpolicy=("none",),
    family="agent",
    settings=(
        ("ENV", "cooking", "TextWorld's cooking games, made offline by tw-make"),
        ("ROLLOUT_BATCH_SIZE", "2", "2 games a step"),
        ("N_SAMPLES", "4", "groups of 4 episodes of one game"),
        ("GPUS_PER_RUN", "1", "one training process (the recipe's 2 would start two)"),
        (
            "CAP",
            "24",
            "actions per episode: tw-make's level-5 games take 19 to 24 moves, so the recipe's "
            "15 would leave every one out; 24 keeps all five levels",
        ),
        (
            "STEP_TOKENS",
            "32",
            "a taught reply is about ten tokens (think block, action); 32 cuts a rambling one",
        ),
        (
            "CONTEXT_LEN",
            "1024",
            "a step's prompt (the recipe's format, the tiny tokenizer) is a few hundred tokens",
        ),
        ("MAX_TOKENS_PER_GPU", "4096", "micro-batches of a few dozen steps"),
        *_COMMON,
        (
            "REF_LOAD",
            "{megatron}",
            "the taught model in Megatron's format: the trainer starts from the weights the "
            "engine serves, and the KL loss's reference is the same model",
        ),
        ("HF_CHECKPOINT", "{model}", "the taught tiny model (rescue.rehearsal.tiny.textgames)"),
    ),
)

LAUNCHERS: dict[str, Launcher] = {x.name: x for x in (SWE, RLVR, AGENT)}

#: Checks that hold only on one launcher's path, with why the others skip them.
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "census": {
        "rlvr": "the synchronous trainer has no asynchronous buffer (the sample census is "
        "checked against the dumps by replay)",
    },
    "unused": {
        "rlvr": "the synchronous trainer has no unused-group handler",
    },
    "outcomes": {},
    "infra": {},
}
NOT_APPLICABLE["census"]["agent"] = NOT_APPLICABLE["census"]["rlvr"]
NOT_APPLICABLE["unused"]["agent"] = NOT_APPLICABLE["unused"]["rlvr"]
