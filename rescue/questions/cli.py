"""``rescue question q1|q2|q3``: a research question's stages, run (or resumed) in RUN_DIR.

The stages are ``rescue.questions.chains``'; the runner is ``rescue.stages.Runner``: a
done stage with unchanged inputs is skipped, a failed or interrupted one restarted, and a
failure names the stage, its job and its log (exit status 1). ``--rehearsal`` runs the
same chain on a CPU, every training stage through Miles' own loop with a tiny model
(``rescue.rehearsal.miles``, in the rehearsal's environment, with the Miles and Megatron-LM
sources given: ``--miles-src``, ``--megatron-src``, each refused with one line when it is
not a checkout).

q3 starts only when q2's gate (``Q2_DIR/gate.json``) says go, or with ``--force``, which
the settings and q3's report record.

Everything is checked before the run folder is touched or a stage starts: the cluster
chains of q2 and q3 need GPUs (``nvidia-smi`` lists one) and a Miles checkout
(``MILES_DIR``, default ``/root/miles``, holding ``train_async.py``), else they stop with
one line saying how to run the rehearsal instead, before any download; q1 needs ``DUMPS``
to be a folder of dumps and ``MODEL`` a checkpoint folder or file, or ``tiny-gpt2`` /
``tiny-llama``. The run's settings record the steps the training runs for (``STEPS``,
the rehearsal's default resolved), not 0. q3 ends with P6's cost per unit of reward
improvement (reported without a verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rescue import flags
from rescue.errors import InputError

#: The Miles checkout the launchers use when MILES_DIR is unset (launch/config.sh).
MILES_DIR_DEFAULT = "/root/miles"
#: The models q1's replay builds without a checkpoint (rescue.replay.model).
BUILT_IN_MODELS = ("tiny-gpt2", "tiny-llama")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", choices=("q1", "q2", "q3"), help="the research question")
    parser.add_argument(
        "--run-dir", required=True, help="the run folder (created; resumed when it exists)"
    )
    parser.add_argument(
        "--rehearsal",
        action="store_true",
        help="the chain on a CPU, training through Miles' loop with a tiny model (default "
        "off; needs --miles-src and --megatron-src)",
    )
    parser.add_argument(
        "--rehearsal-python",
        default="",
        help="rehearsal: the Python of the rehearsal's environment (default this one)",
    )
    parser.add_argument(
        "--miles-src", default="", help="rehearsal: a Miles checkout (MILES_SRC; required)"
    )
    parser.add_argument(
        "--megatron-src",
        default="",
        help="rehearsal: a Megatron-LM checkout (MEGATRON_SRC; required)",
    )
    parser.add_argument(
        "--seeds",
        type=flags.COUNT,
        default=None,
        help="seeds per arm (default 3 on the cluster; in rehearsal 2 for q2, 1 for q3)",
    )
    parser.add_argument(
        "--steps",
        type=flags.NON_NEGATIVE,
        default=0,
        help="training steps per run (default: the launchers' own; in rehearsal 2 for q2 and "
        "q3, 3 for q1)",
    )
    parser.add_argument("--q2-dir", default=None, help="q3: q2's run folder (default runs/q2)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="q3: start without q2's go; q2, q3: run with fewer seeds than the judge needs to "
        "decide anything; recorded (default off)",
    )
    parser.add_argument(
        "--power-noise",
        choices=("sim", "synthetic"),
        default=None,
        help="q2, q3: the noise of the power line printed before anything runs (rescue power "
        "--noise): sim, simulated runs of the question's regime (cached after the first "
        "time), or synthetic (quick) (default: sim on the cluster, synthetic in a rehearsal, "
        "whose tiny model's runs a simulated pool does not describe)",
    )
    parser.add_argument("--dumps", default="", help="q1: the dumps folder of a finished run")
    parser.add_argument(
        "--model",
        default="",
        help="q1/q3: the model replay differentiates (default in rehearsal: the checkpoint "
        "the training stage wrote)",
    )


def check_gate(q2_dir: Path, force: bool) -> str:
    """q3's precondition: '' when q2's gate says go, else why not (an error unless force)."""
    path = q2_dir / "gate.json"
    if not path.is_file():
        why = f"no q2 gate at {path}: run make q2 first"
    else:
        decision = json.loads(path.read_text())
        why = (
            ""
            if decision.get("go")
            else f"q2's gate at {path} says no go (P3: {decision.get('verdicts')})"
        )
    if why and not force:
        raise InputError(f"{why}; or make q3 FORCE=1 (recorded in the report)")
    return why


def power_first(question: str, seeds: int, args: argparse.Namespace) -> bool:
    """Before anything runs: the power line for ``seeds`` per arm of the question's cluster
    arms (``rescue power``), and the refusal of a seed count at which the judge decides
    nothing for a prediction those arms compare, unless ``--force`` (a rehearsal spends no
    cluster time: it prints the line and goes on). Returns whether it ran forced."""
    from rescue.judge import power as pw
    from rescue.sim.power_cli import line_plan, noise_of, question_arms

    arms = question_arms(question)
    why = pw.refusal(arms, seeds)
    if why and not args.rehearsal and not args.force:
        raise InputError(f"{why}: set SEEDS >= 3, or FORCE=1 to run anyway (recorded)")
    if seeds < pw.MIN_SEEDS:  # the judge's minimum: nothing to simulate
        table = pw.Power(tuple(arms), 0, (seeds,), (0.0,))
    else:
        counts, effects = line_plan([seeds], arms)
        chosen = args.power_noise or ("synthetic" if args.rehearsal else "sim")
        null, noise = noise_of(chosen, arms, max(counts))
        table = pw.power(
            arms, seeds=counts, effects=effects, replicates=pw.LINE_REPLICATES,
            null=null, noise=noise,
        )  # fmt: skip
    said = pw.line(table, seeds, arms=arms)
    print(f"{question}: power of the report on the cluster's arms: {said}")
    if why and not args.rehearsal:
        print(f"{question}: FORCE=1: {why}; running anyway")
        return True
    return False


def gpu_count() -> int:
    """GPUs ``nvidia-smi -L`` lists (0 without the command or a driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return (
        sum(line.startswith("GPU ") for line in out.stdout.splitlines())
        if out.returncode == 0
        else 0
    )


def check_cluster(question: str) -> None:
    """The cluster chains of q2 and q3 need GPUs and a Miles checkout: an error saying how
    to run the rehearsal on this machine instead, before anything is written or fetched."""
    miles = os.environ.get("MILES_DIR") or MILES_DIR_DEFAULT
    why = []
    if gpu_count() == 0:
        why.append("no GPU here (nvidia-smi lists none)")
    if not (Path(miles) / "train_async.py").is_file():
        why.append(f"no Miles checkout at MILES_DIR={miles} (train_async.py missing)")
    if why:
        forced = " FORCE=1" if question == "q3" else ""
        raise InputError(
            f"{question} trains on a GPU cluster through Miles: {'; '.join(why)}; on this "
            f"machine run its rehearsal, make {question} REHEARSAL=1{forced}"
        )


def check_sources(miles_src: str, megatron_src: str) -> None:
    """A rehearsal's framework sources are checkouts (one line naming the variable)."""
    for name, value, what, marker in (
        ("MILES_SRC", miles_src, "a Miles checkout", "train_async.py"),
        ("MEGATRON_SRC", megatron_src, "a Megatron-LM checkout", "megatron/training"),
    ):
        if not value or not (Path(value) / marker).exists():
            raise InputError(
                f"{name}={value!r}: REHEARSAL=1 trains through Miles' loop and needs {what} "
                f"(with {marker}): set {name}=/path"
            )


def p6_costs(report: dict) -> list[str]:
    """P6's cost checks of a report.json (per unit of reward improvement, reported without a
    verdict), one line each with its estimate and interval, for q3's closing summary."""
    lines = []
    for cohort in report.get("cohorts", []):
        for r in cohort.get("results", []):
            if r.get("id") != "P6":
                continue
            for c in r.get("checks", []):
                if "per unit of reward improvement" not in str(c.get("name")):
                    continue
                e = c.get("estimate") or {}
                value = _num(e.get("value"))
                where = f"{value} [{_num(e.get('lo'))}, {_num(e.get('hi'))}] (n={e.get('n')})"
                why = f"; {c['reason']}" if c.get("reason") else ""
                lines.append(f"q3: P6 cost: {c['name']}: {where if e else 'n/a'}{why}")
    return lines


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def machine_refusal(question: str) -> int:
    """``check_cluster`` as a command's exit status: 0, or 2 after its one line (``make q2``
    runs it with the system's Python before installing anything)."""
    try:
        check_cluster(question)
    except InputError as e:
        print(f"rescue question: error: {e}", file=sys.stderr)
        return 2
    return 0


def check_q1(dumps: str, model: str, rehearsal: bool) -> None:
    """q1's inputs exist (DUMPS a folder of *.pt, MODEL a path or a built-in name)."""
    if not rehearsal and dumps:
        folder = Path(dumps)
        if not folder.is_dir():
            raise InputError(f"DUMPS={dumps}: no such folder: the debug dumps of a finished run")
        if not any(folder.glob("*.pt")):
            raise InputError(f"DUMPS={dumps}: no *.pt dump in it (Miles' rollout_*.pt)")
    if model and model not in BUILT_IN_MODELS and not Path(model).exists():
        raise InputError(
            f"MODEL={model}: no such checkpoint folder or file; allowed: a path, or "
            f"{' / '.join(BUILT_IN_MODELS)}"
        )


def main(args: argparse.Namespace) -> int:
    from rescue.questions.chains import QUESTIONS, REHEARSAL_SEEDS, REHEARSAL_STEPS, REPO, Settings
    from rescue.stages import Runner

    run_dir = Path(args.run_dir).resolve()
    seeds = (
        args.seeds
        if args.seeds is not None
        else (REHEARSAL_SEEDS[args.question] if args.rehearsal else 3)
    )
    if args.question in ("q2", "q3") and not args.rehearsal:
        check_cluster(args.question)
    if args.question == "q1":
        check_q1(args.dumps, args.model, args.rehearsal)
    if args.rehearsal:
        check_sources(args.miles_src, args.megatron_src)
    q2_dir = Path(args.q2_dir or "runs/q2").resolve()
    settings = Settings(
        run_dir,
        rehearsal=args.rehearsal,
        seeds=seeds,
        steps=args.steps,
        force=args.force,
        q2_dir=q2_dir,
        dumps=args.dumps,
        model=args.model,
        rehearsal_python=args.rehearsal_python,
        miles_src=str(Path(args.miles_src).resolve()) if args.miles_src else "",
        megatron_src=str(Path(args.megatron_src).resolve()) if args.megatron_src else "",
    )
    steps: int | str = args.steps or (
        REHEARSAL_STEPS[args.question] if args.rehearsal else "NUM_ROLLOUT of the launchers"
    )
    recorded = {"REHEARSAL": int(args.rehearsal), "SEEDS": seeds, "STEPS": steps}
    if args.question == "q1":  # q1 replays dumps: its rehearsal trains the run it replays
        recorded = {"REHEARSAL": int(args.rehearsal)}
        if args.rehearsal:
            recorded["STEPS"] = steps
    if args.question in ("q2", "q3") and power_first(args.question, seeds, args):
        recorded["FORCE"] = 1
    if args.question == "q3":
        why = check_gate(q2_dir, args.force)
        recorded.update(Q2_DIR=str(q2_dir), FORCE=int(args.force))
        if why:
            print(f"q3: FORCE=1: starting although {why}")
    stages = QUESTIONS[args.question](settings)
    if args.rehearsal:
        standing = [st.name for st in stages if st.note]
        print(
            f"{args.question}: REHEARSAL=1: every training stage through Miles' own loop on this "
            f"CPU with a tiny model; {', '.join(standing) or 'no stage'} stand(s) in for the "
            "cluster's (each says what and why when it starts)"
        )
    code = Runner(run_dir, stages, question=args.question, settings=recorded, cwd=REPO).run()
    if code == 0:
        if args.question == "q2":  # the gate's verdict, as its stage printed it
            log = run_dir / "logs" / "gate.log"
            print("\n".join(x for x in log.read_text().splitlines() if x.startswith("gate:")))
        if args.question == "q3":  # P6's cost, reported without a verdict
            report = json.loads((run_dir / "report" / "report.json").read_text())
            print("\n".join(p6_costs(report)) or "q3: P6's cost was not measured (no P6 result)")
        print(f"{args.question}: report {run_dir / 'report' / 'report.md'}")
    return code
