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
launchers' sweep (q2) or ``make swe-arm`` run after run (q3); in rehearsal the training
rehearsal (``python -m rescue.rehearsal.miles`` in the rehearsal's environment): the
launcher's exact command run through Miles' own loop on the CPU with the tiny model, every
arm x seed a Ray job, two at a time (a Ray head per lane). q1's rehearsal trains one never-drop
run the same way, and replays its dumps and the checkpoint it wrote. A rehearsal stage
that still cannot run on a CPU says what stands in for it, and why, in its note.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rescue import arms
from rescue.errors import InputError
from rescue.stages import Stage

PY = sys.executable
RESCUE = (PY, "-m", "rescue")
REHEARSE = (PY, "-m", "rescue.questions.rehearsal")

#: The single-turn arms of q2 (``rescue.arms``' questions column; launch/rlvr_config.sh ARMS).
Q2_ARMS: tuple[str, ...] = arms.names(question="q2")
#: The SWE arms of q3: arm name and RESCUE_A (``rescue.arms.question_runs``).
Q3_ARMS: tuple[tuple[str, float | None], ...] = arms.question_runs("q3")
#: The arm whose run q1's rehearsal replays (the arm that records on the cluster).
(Q1_ARM,) = arms.names(question="q1")
#: Rehearsal defaults: seeds per arm, trained steps per run (the driver makes one more
#: rollout) unless SEEDS / STEPS say others, and runs at once (each lane a Ray head). q2
#: runs two seeds (the judge's pairing of seeds, its gate); q3 one: below three seeds its
#: judge decides nothing either way, and each SWE run is four minutes of this CPU.
REHEARSAL_SEEDS = {"q1": 1, "q2": 2, "q3": 1}
REHEARSAL_STEPS = {"q1": 3, "q2": 2, "q3": 2}
PARALLEL = 2
#: The chat template the rehearsal's tiny tokenizer gets (the Qwen3 family's, from Miles).
TEMPLATE = "miles/utils/chat_template_utils/templates/qwen3_fixed.jinja"
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
    steps: int = 0  # 0: the launchers' own default (REHEARSAL_STEPS in rehearsal)
    force: bool = False
    q2_dir: Path | None = None
    dumps: str = ""
    model: str = ""
    #: The rehearsal's Python (its own environment) and the framework sources it runs.
    rehearsal_python: str = ""
    miles_src: str = ""
    megatron_src: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def path(self, *parts: str) -> str:
        return str(self.run_dir.joinpath(*parts))

    def rehearse(self, *argv: str) -> tuple[str, ...]:
        """A command of the rehearsal's environment: ``REHEARSAL_PY -m ARGV``."""
        return (self.rehearsal_python or PY, "-m", *argv)

    def trainer(self, launcher: str, arms: str, seeds: int, out: str, *more: str) -> tuple:
        """The training rehearsal's command: ``arms`` x ``seeds`` through Miles' loop."""
        steps = self.steps or REHEARSAL_STEPS["q2" if launcher == "rlvr" else "q3"]
        return (
            *self.rehearse("rescue.rehearsal.miles"), "--launcher", launcher, "--arm", arms,
            *(("--seeds", str(seeds)) if seeds > 1 else ("--seed", "1")),
            "--parallel", str(PARALLEL), "--steps", str(steps), "--miles-src", self.miles_src,
            "--megatron-src", self.megatron_src, *more, "--replace", "--out", out,
        )  # fmt: skip


def _make(target: str, **variables: str) -> tuple[str, ...]:
    return ("make", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items()))


def training_stage(question: str, s: Settings, inputs: tuple[str, ...]) -> Stage:
    """The one place the training of a question is chosen (see the module docstring)."""
    out = s.path("train")
    progress = s.path("progress", "train.json")
    if s.rehearsal and question == "q2":
        cmd = s.trainer(
            "rlvr", ",".join(Q2_ARMS), s.seeds, out, "--model", s.path("model"),
            "--prompt-data", s.path("data", "prompts.jsonl"), "--cap-file", s.path("cap.json"),
        )  # fmt: skip
        return Stage(
            "train",
            cmd,
            inputs=inputs,
            outputs=(s.path("train", "summary.json"),),
            progress=progress,
            job="the single-turn arms x seeds through Miles' train.py on the CPU "
            "(python -m rescue.rehearsal.miles --launcher rlvr)",
        )
    if s.rehearsal:
        q3_arms = ",".join(f"{arm}{'' if a is None else f':{a}'}" for arm, a in Q3_ARMS)
        cmd = s.trainer(
            "swe", q3_arms, s.seeds, out, "--prompt-data", s.path("data", "train.jsonl")
        )
        return Stage(
            "train",
            cmd,
            inputs=inputs,
            outputs=(s.path("train", "summary.json"),),
            progress=progress,
            job="the SWE arms x seeds through Miles' train_async.py on the CPU against the "
            "stand-in docker (python -m rescue.rehearsal.miles --launcher swe)",
            note="the SWE agent is a scripted one (a random tiny model never writes a tool "
            "call) whose replies carry the tiny model's log-probs; the sandboxes are the "
            "stand-in docker's folder copies (no Docker daemon here)",
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
        task, model = s.path("data", "task.jsonl"), s.path("model")
        stages = [
            Stage(
                "task",
                (*s.rehearse("rescue.rehearsal.tiny.singleturn"), "--rows", "40", "--out", task),
                outputs=(task,),
                job="the rehearsal's single-turn task (box a digit, in GSM8K's schema)",
                note="a task the tiny model can learn on a CPU instead of GSM8K: its digit in "
                "a \\boxed{}, graded by Miles' math grader",
            ),
            Stage(
                "prepare",
                (*RESCUE, "rlvr", "prepare", "--dataset", "gsm8k", "--source", task,
                 "--out", data),
                inputs=(task,),
                outputs=(data,),
                job="rescue rlvr prepare (the task's rows)",
            ),
            Stage(
                "model",
                (*s.rehearse("rescue.rehearsal.tiny.singleturn"), "--out", model, "--template",
                 str(Path(s.miles_src) / TEMPLATE), "--seed", "1"),
                outputs=(f"{model}/model.safetensors",),
                job="the tiny Qwen3 taught the task (rescue.rehearsal.tiny.singleturn)",
                note="a tiny model of the Qwen3 family taught the task's format on the CPU "
                "stands in for the pretrained Qwen3-1.7B",
            ),
        ]  # fmt: skip
        calibrate = Stage(
            "calibrate",
            (*s.rehearse("rescue.questions.rehearsal"), "calibrate", "--data", data,
             "--model", model, "--out", cap),
            inputs=(data, f"{model}/model.safetensors"),
            outputs=(cap,),
            job="rescue rlvr calibrate against the stand-in engine serving the taught model",
        )  # fmt: skip
        train = training_stage("q2", s, (data, cap, f"{model}/model.safetensors"))
        wait = Stage(
            "wait",
            (*REHEARSE, "wait", s.path("train"), "--arms", ",".join(Q2_ARMS),
             "--seeds", str(s.seeds)),
            inputs=(s.path("train", "summary.json"),),
            job="check every arm x seed trained and passed its rehearsal checks",
        )  # fmt: skip
        runs = s.path("train", "*", "runs", "*", "wandb")
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
        stages = [prepare]
    collect = Stage(
        "collect",
        (*REHEARSE, "collect", runs, "--out", s.path("runs.json")),
        inputs=(s.path("train", "summary.json" if s.rehearsal else "plan.jsonl"),),
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
    return [*stages, calibrate, train, wait, collect, judge, gate]


def q1(s: Settings) -> list[Stage]:
    stages: list[Stage] = []
    dumps, model = s.dumps, s.model
    if s.rehearsal:
        train = s.path("train")
        stages.append(
            Stage(
                "train",
                (*s.rehearse("rescue.rehearsal.miles"), "--launcher", "swe", "--arm", Q1_ARM,
                 "--steps", str(s.steps or REHEARSAL_STEPS["q1"]), "--miles-src", s.miles_src,
                 "--megatron-src", s.megatron_src, "--replace", "--out", train),
                outputs=(f"{train}/report.json", f"{train}/checkpoint-hf"),
                progress=s.path("progress", "train.json"),
                job=f"a {Q1_ARM} run through Miles' train_async.py on the CPU, with its dumps and "
                "its last checkpoint (python -m rescue.rehearsal.miles)",
                note="the SWE agent is a scripted one (a random tiny model never writes a tool "
                "call) whose replies carry the tiny model's log-probs; the sandboxes are the "
                "stand-in docker's folder copies (no Docker daemon here)",
            )
        )  # fmt: skip
        dumps = s.path("train", "runs", f"swe-{Q1_ARM}-seed1", "dumps", "rollout_data")
        model = model or s.path("train", "checkpoint-hf")
    elif not dumps:
        raise InputError("q1 needs DUMPS=DIR, the debug dumps of a finished run (rollout_*.pt)")
    pattern = str(Path(dumps) / "*.pt")
    if not model:
        raise InputError("q1 needs MODEL=PATH, the Hugging Face checkpoint the run started from")
    replay = s.path("replay")
    inputs = (s.path("train", "report.json"),) if s.rehearsal else (dumps,)
    stages += [
        Stage(
            "census",
            (*RESCUE, "replay", "census", pattern, "--json"),
            inputs=inputs,
            outputs=(f"{replay}/census.json",),
            stdout=f"{replay}/census.json",
            job="rescue replay census",
        ),
        Stage(
            "advantages",
            (*RESCUE, "replay", "advantages", pattern, "--json"),
            inputs=inputs,
            outputs=(f"{replay}/advantages.json",),
            stdout=f"{replay}/advantages.json",
            job="rescue replay advantages (arms (a)-(e), offline P7)",
        ),
        Stage(
            "gradients",
            (*RESCUE, "replay", "gradients", pattern, "--model", model, "--json"),
            inputs=inputs,
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
    never_drop = s.path("train", "never-drop-seed1") if s.rehearsal else ""
    recorded = (
        f"{never_drop}/runs/swe-never-drop*-seed1/dumps"
        if s.rehearsal
        else s.path("out", "swe-never-drop*-seed1", "dumps")
    )
    stages.append(
        Stage(
            "record",
            (*REHEARSE, "link", recorded, "--out", record),
            inputs=(s.path("train", "summary.json") if s.rehearsal else s.path("train"),),
            outputs=(record,),
            job="the never-drop run's dumps",
        )
    )
    model = s.model or (f"{never_drop}/checkpoint-hf" if s.rehearsal else "")
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
    runs = (
        s.path("train", "*", "runs", "*", "wandb")
        if s.rehearsal
        else s.path("out", "swe-*", "wandb")
    )
    report = s.path("report")
    stages.append(
        Stage(
            "report",
            (*RESCUE, "report", runs, "--out", report, "--no-progress"),
            inputs=(
                s.path("train", "summary.json") if s.rehearsal else s.path("train"),
                f"{oracle}/compare.json",
            ),
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
