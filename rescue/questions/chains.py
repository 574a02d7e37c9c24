"""The stages of the three questions, on the cluster and in rehearsal (``REHEARSAL=1``).

Every stage runs a command that exists on its own (a ``make`` target, ``rescue ...``);
this module only orders them and names what each reads and writes under the run folder.

- q2 (budget regime, single-turn): prepare -> calibrate -> train (arms x seeds as Ray
  jobs) -> wait -> collect -> report -> gate (P3's verdict and interval, go / no go).
- q3 (infrastructure regime, SWE-smith): prepare -> pilot -> validate (the subset's
  reference solutions graded in the training sandbox; the tasks whose reference does not
  resolve leave the subset) -> subset -> train (drop,
  never-drop, protect a = 0.25 and 0.5, pace, with dumps) -> record -> oracle-build ->
  oracle-grad -> oracle-compare -> report (P5, P6). Started only after q2's gate said go,
  or with FORCE=1, which the report then states.
- q1 (offline replay of a finished run's dumps): census -> advantages (arms (a)-(e),
  offline P7) -> gradients (P1, P2) -> report.

The training stage is built in one place, ``training_stage``: on the cluster the
launchers' sweep, in rehearsal the embedded simulator (``rescue.questions.rehearsal
train``), which runs the same rescue code (gate, mask, normalizer, census) for a few steps
and two seeds. That stage is SIMULATED in a rehearsal and says so in its record and in the
output; every other stage runs its real command. The training rehearsal through Miles' own
loop on the CPU replaces it by changing ``training_stage`` alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rescue.errors import InputError
from rescue.stages import Stage

PY = sys.executable
RESCUE = (PY, "-m", "rescue")
REHEARSE = (PY, "-m", "rescue.questions.rehearsal")

#: The single-turn arms of q2 on the cluster (launch/rlvr_config.sh ARMS) and their
#: simulator names in rehearsal (the simulator has no Dr. GRPO arm).
Q2_ARMS = ("zero", "mask", "matched", "drgrpo-mask", "survivor", "turn")
Q2_SIM_ARMS = ("zero", "mask", "matched", "survivor", "turn-baseline")
#: The SWE arms of q3 (launch/config.sh): arm name and RESCUE_A.
Q3_ARMS = (
    ("drop", None),
    ("never-drop", None),
    ("protect", 0.25),
    ("protect", 0.5),
    ("pace", None),
)
Q3_SIM_ARMS = ("drop", "never-drop", "protect:0.25", "protect:0.5", "pace")
SIM_SCENARIO = {"q2": "budget-three-outcome", "q3": "swe-like"}
#: A rehearsal's seeds per arm and training steps per run, unless SEEDS / STEPS say others.
REHEARSAL_SEEDS = 2
REHEARSAL_STEPS = 40

SIMULATED_NOTE = (
    "SIMULATED: REHEARSAL=1 trains on the embedded simulator (rescue sim, the same gate, mask, "
    "normalizer and census code as the Miles adapters), not through Miles' loop; every other "
    "stage runs its real command"
)
#: The repository (commands run here) and the rehearsal's fixtures in it: tiny GSM8K and
#: SWE-smith rows.
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


@dataclass
class Settings:
    """What a question's command was given (``rescue question --help`` documents each)."""

    run_dir: Path
    rehearsal: bool = False
    seeds: int = 3
    steps: int = 0  # 0: the launchers' / simulator's own default
    force: bool = False
    q2_dir: Path | None = None
    dumps: str = ""
    model: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def path(self, *parts: str) -> str:
        return str(self.run_dir.joinpath(*parts))


def _make(target: str, **variables: str) -> tuple[str, ...]:
    return ("make", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items()))


def training_stage(question: str, s: Settings, inputs: tuple[str, ...]) -> Stage:
    """The one place the training of a question is chosen (see the module docstring)."""
    out = s.path("train")
    progress = s.path("progress", "train.json")
    if s.rehearsal:
        arms = Q2_SIM_ARMS if question == "q2" else Q3_SIM_ARMS
        cmd = (
            *REHEARSE,
            "train",
            "--scenario",
            SIM_SCENARIO[question],
            "--arms",
            ",".join(arms),
            "--seeds",
            str(s.seeds),
            "--steps",
            str(s.steps or REHEARSAL_STEPS),
            "--out",
            out,
        )
        if question == "q2":
            cmd += ("--cap-file", s.path("cap.json"), "--data", s.path("data", "prompts.jsonl"))
        return Stage(
            "train",
            cmd,
            inputs=inputs,
            outputs=(out,),
            progress=progress,
            job=f"rescue sim --scenario {SIM_SCENARIO[question]} (simulated training)",
            note=SIMULATED_NOTE,
        )
    if question == "q2":
        cmd = _make(
            "rlvr-sweep",
            PROMPT_DATA=s.path("data", "prompts.jsonl"),
            CAP_FILE=s.path("cap.json"),
            OUTPUT_DIR=s.path("out"),
            SWEEP_DIR=out,
            SEEDS=str(s.seeds),
            SWEEP_WATCH="0",
            **_steps(s),
            **({"FORCE": "1"} if s.force and s.seeds < 3 else {}),
        )
        return Stage(
            "train",
            cmd,
            inputs=inputs,
            outputs=(s.path("train", "plan.jsonl"),),
            job="make rlvr-sweep (submit every arm x seed as a Ray job)",
        )
    runs = " ".join(f"{arm}{'' if a is None else f':{a}'}" for arm, a in Q3_ARMS)
    cmd = (
        *REHEARSE,
        "swe-runs",
        "--runs",
        runs,
        "--seeds",
        str(s.seeds),
        "--prompt-data",
        s.path("data", "train.jsonl"),
        "--output-dir",
        s.path("out"),
        "--out",
        out,
        *(("--steps", str(s.steps)) if s.steps else ()),
    )
    return Stage(
        "train",
        cmd,
        inputs=inputs,
        outputs=(out,),
        progress=progress,
        job="make swe-arm, one run after another (drop, never-drop, protect, pace)",
    )


def _steps(s: Settings) -> dict[str, str]:
    return {"NUM_ROLLOUT": str(s.steps)} if s.steps else {}


def q2(s: Settings) -> list[Stage]:
    data, cap = s.path("data", "prompts.jsonl"), s.path("cap.json")
    report = s.path("report")
    if s.rehearsal:
        prepare = Stage(
            "prepare",
            (
                *RESCUE,
                "rlvr",
                "prepare",
                "--dataset",
                "gsm8k",
                "--source",
                str(FIXTURES / "gsm8k_rows.jsonl"),
                "--out",
                data,
            ),
            inputs=(str(FIXTURES / "gsm8k_rows.jsonl"),),
            outputs=(data,),
            job="rescue rlvr prepare (the repository's GSM8K rows)",
        )
        calibrate = Stage(
            "calibrate",
            (*REHEARSE, "calibrate", "--data", data, "--out", cap),
            inputs=(data,),
            outputs=(cap,),
            job="rescue rlvr calibrate against the stand-in SGLang engine",
            note="the stand-in engine gives every response one length, so the "
            "window is [0, 1]: the hand-off is real, the rate is not",
        )
        train = training_stage("q2", s, (data, cap))
        wait = Stage(
            "wait",
            (
                *REHEARSE,
                "wait",
                s.path("train"),
                "--arms",
                ",".join(Q2_SIM_ARMS),
                "--seeds",
                str(s.seeds),
            ),
            inputs=(s.path("train"),),
            job="check every arm x seed finished",
        )
        runs = s.path("train")
    else:
        prepare = Stage(
            "prepare",
            _make("rlvr-prepare", PROMPT_DATA=data),
            outputs=(data,),
            job="make rlvr-prepare",
        )
        calibrate = Stage(
            "calibrate",
            _make("rlvr-calibrate", PROMPT_DATA=data, CAP_FILE=cap),
            inputs=(data,),
            outputs=(cap,),
            job="make rlvr-calibrate",
        )
        train = training_stage("q2", s, (data, cap))
        wait = Stage(
            "wait",
            (
                *RESCUE,
                "rlvr",
                "watch",
                "--plan",
                s.path("train", "plan.jsonl"),
                "--address",
                s.extra.get("RAY_ADDRESS", "http://127.0.0.1:8265"),
            ),
            inputs=(s.path("train", "plan.jsonl"),),
            progress=s.path("progress", "wait.json"),
            job="rescue rlvr watch (until every run has ended)",
        )
        runs = s.path("out", "rlvr-*", "wandb")
    collect = Stage(
        "collect",
        (*REHEARSE, "collect", runs, "--out", s.path("runs.json")),
        inputs=(s.path("train"),),
        outputs=(s.path("runs.json"),),
        job="list every run's census for the report",
    )
    judge = Stage(
        "report",
        (*RESCUE, "report", runs, "--out", report, "--no-progress"),
        inputs=(s.path("runs.json"),),
        outputs=(s.path("report", "report.json"),),
        job="rescue report",
    )
    gate = Stage(
        "gate",
        (*REHEARSE, "gate", s.path("report", "report.json"), "--out", s.path("gate.json")),
        inputs=(s.path("report", "report.json"),),
        outputs=(s.path("gate.json"),),
        job="the P3 gate (go / no go for q3)",
    )
    return [prepare, calibrate, train, wait, collect, judge, gate]


def q1(s: Settings) -> list[Stage]:
    stages: list[Stage] = []
    dumps = s.dumps
    if s.rehearsal:
        dumps = s.path("dumps")
        stages.append(
            Stage(
                "dumps",
                (*REHEARSE, "dumps", "--out", dumps, "--steps", "2"),
                outputs=(dumps,),
                job="synthetic debug dumps (Miles' sample schema)",
                note="SIMULATED: the dumps of a finished run are drawn by "
                "rescue.replay.synthetic; every replay stage is real",
            )
        )
    elif not dumps:
        raise InputError("q1 needs DUMPS=DIR, the debug dumps of a finished run (rollout_*.pt)")
    pattern = str(Path(dumps) / "*.pt")
    model = s.model or ("tiny-gpt2" if s.rehearsal else "")
    if not model:
        raise InputError("q1 needs MODEL=PATH, the Hugging Face checkpoint the run started from")
    replay = s.path("replay")
    stages += [
        Stage(
            "census",
            (*RESCUE, "replay", "census", pattern, "--json"),
            inputs=(dumps,),
            outputs=(f"{replay}/census.json",),
            stdout=f"{replay}/census.json",
            job="rescue replay census",
        ),
        Stage(
            "advantages",
            (*RESCUE, "replay", "advantages", pattern, "--json"),
            inputs=(dumps,),
            outputs=(f"{replay}/advantages.json",),
            stdout=f"{replay}/advantages.json",
            job="rescue replay advantages (arms (a)-(e), offline P7)",
        ),
        Stage(
            "gradients",
            (*RESCUE, "replay", "gradients", pattern, "--model", model, "--json"),
            inputs=(dumps,),
            outputs=(f"{replay}/gradients.json",),
            stdout=f"{replay}/gradients.json",
            job="rescue replay gradients (P1, P2)",
        ),
        Stage(
            "report",
            (
                *RESCUE,
                "report",
                f"{replay}/advantages.json",
                f"{replay}/gradients.json",
                "--out",
                s.path("report"),
                "--no-progress",
            ),
            inputs=(f"{replay}/advantages.json", f"{replay}/gradients.json"),
            outputs=(s.path("report", "report.json"),),
            job="rescue report",
        ),
    ]
    return stages


def q3(s: Settings) -> list[Stage]:
    tasks, train_data = s.path("data", "tasks.jsonl"), s.path("data", "train.jsonl")
    pilot = s.path("pilot")
    source = str(FIXTURES / "swe_smith_rows.jsonl")
    stages = [
        Stage(
            "prepare",
            (
                *RESCUE,
                "swe",
                "prepare",
                "--out",
                tasks,
                *(("--source", source) if s.rehearsal else ()),
            ),
            inputs=(source,) if s.rehearsal else (),
            outputs=(tasks,),
            job="rescue swe prepare",
        ),
    ]
    if s.rehearsal:
        stages.append(
            Stage(
                "pilot",
                (*REHEARSE, "pilot", "--tasks", tasks, "--out", pilot),
                inputs=(tasks,),
                outputs=(f"{pilot}/subset.txt",),
                job="the pilot's subset rule on drawn trial outcomes",
                note="SIMULATED: no SWE trial runs on the CPU here; trial outcomes "
                "are drawn per task and `rescue swe pilot --summarize-only` chooses "
                "the [0.2, 0.5] subset from them",
            )
        )
    else:
        stages.append(
            Stage(
                "pilot",
                _make("pilot", PROMPT_DATA=tasks, PILOT_OUT=pilot),
                inputs=(tasks,),
                outputs=(f"{pilot}/subset.txt",),
                job="make pilot",
            )
        )
    checked = s.path("validate")
    if s.rehearsal:
        stages.append(
            Stage(
                "validate",
                (*REHEARSE, "validate", "--tasks", tasks, "--subset", f"{pilot}/subset.txt",
                 "--out", checked),
                inputs=(tasks, f"{pilot}/subset.txt"),
                outputs=(f"{checked}/subset.txt",),
                job="rescue swe validate through the stand-in docker",
                note="SIMULATED: each task's image is the tiny calc repository under the "
                "task's id and its reference that repository's bug patch; `rescue swe "
                "validate` and the grader are real",
            )
        )  # fmt: skip
    else:
        stages.append(
            Stage(
                "validate",
                _make("swe-validate", TASKS_JSONL=tasks, SUBSET_FILE=f"{pilot}/subset.txt",
                      VALIDATE_OUT=checked),
                inputs=(tasks, f"{pilot}/subset.txt"),
                outputs=(f"{checked}/subset.txt",),
                job="make swe-validate",
            )
        )  # fmt: skip
    stages.append(
        Stage(
            "subset",
            (
                *RESCUE,
                "swe",
                "prepare",
                "--out",
                train_data,
                "--subset",
                f"{checked}/subset.txt",
                *(("--source", source) if s.rehearsal else ()),
            ),
            inputs=(f"{checked}/subset.txt",),
            outputs=(train_data,),
            job="rescue swe prepare --subset (the training prompts)",
        )
    )
    stages.append(training_stage("q3", s, (train_data,)))
    oracle = s.path("oracle")
    record = s.path("record")
    if s.rehearsal:
        stages.append(
            Stage(
                "record",
                (*REHEARSE, "dumps", "--out", record, "--steps", "2", "--recorded"),
                outputs=(record,),
                job="a never-drop recording's dumps (synthetic, gate-tagged)",
                note="SIMULATED: the recorded cohort is drawn by rescue.replay.synthetic "
                "and tagged by rescue's own gate; the oracle stages are real",
            )
        )
    else:
        stages.append(
            Stage(
                "record",
                (
                    *REHEARSE,
                    "link",
                    s.path("out", "swe-never-drop*-seed1", "dumps"),
                    "--out",
                    record,
                ),
                inputs=(s.path("train"),),
                outputs=(record,),
                job="the never-drop run's dumps",
            )
        )
    model = s.model or ("tiny-gpt2" if s.rehearsal else "")
    stages += [
        Stage(
            "oracle-build",
            (*RESCUE, "oracle", "build", record, "--out", oracle, "--no-progress"),
            inputs=(record,),
            outputs=(f"{oracle}/rollout_data",),
            job="rescue oracle build",
        ),
    ]
    if s.rehearsal:
        stages.append(
            Stage(
                "oracle-grad",
                (
                    *RESCUE,
                    "replay",
                    "gradients",
                    f"{oracle}/rollout_data/*.pt",
                    "--model",
                    model,
                    "--trained",
                    f"{oracle}/gradients",
                ),
                inputs=(f"{oracle}/rollout_data",),
                outputs=(f"{oracle}/gradients",),
                job="rescue replay gradients --trained (the CPU's oracle replay)",
            )
        )
    else:
        stages.append(
            Stage(
                "oracle-grad",
                _make("oracle", DUMPS=record, ORACLE_DIR=oracle),
                inputs=(f"{oracle}/rollout_data",),
                outputs=(f"{oracle}/gradients",),
                job="make oracle",
            )
        )
    stages.append(
        Stage(
            "oracle-compare",
            (*RESCUE, "oracle", "compare", oracle),
            inputs=(f"{oracle}/gradients",),
            outputs=(f"{oracle}/compare.json",),
            job="rescue oracle compare",
        )
    )
    runs = s.path("train") if s.rehearsal else s.path("out", "swe-*", "wandb")
    report = s.path("report")
    stages.append(
        Stage(
            "report",
            (*RESCUE, "report", runs, "--out", report, "--no-progress"),
            inputs=(s.path("train"), f"{oracle}/compare.json"),
            outputs=(f"{report}/report.json",),
            job="rescue report (P5, P6)",
        )
    )
    if s.force:
        gate = str(s.q2_dir / "gate.json") if s.q2_dir else ""
        stages.append(
            Stage(
                "force-note",
                (*REHEARSE, "force-note", report, "--gate", gate),
                inputs=(f"{report}/report.json",),
                job="record FORCE=1 in the report",
            )
        )
    return stages


QUESTIONS = {"q1": q1, "q2": q2, "q3": q3}
