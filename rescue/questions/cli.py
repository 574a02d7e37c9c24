"""``rescue question q1|q2|q3``: a research question's stages, run (or resumed) in RUN_DIR.

The stages are ``rescue.questions.chains``'; the runner is ``rescue.stages.Runner``: a
done stage with unchanged inputs is skipped, a failed or interrupted one restarted, and a
failure names the stage, its job and its log (exit status 1). ``--rehearsal`` runs the
same chain on a CPU in minutes, the training stage simulated (it says so).

q3 starts only when q2's gate (``Q2_DIR/gate.json``) says go, or with ``--force``, which
the settings and q3's report record.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rescue.errors import InputError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", choices=("q1", "q2", "q3"), help="the research question")
    parser.add_argument(
        "--run-dir", required=True, help="the run folder (created; resumed when it exists)"
    )
    parser.add_argument(
        "--rehearsal",
        action="store_true",
        help="the chain on a CPU in minutes, training simulated (default off)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="seeds per arm (default 3 on the cluster, 2 in rehearsal)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        help="training steps per run (default: the launchers' own; 40 in rehearsal)",
    )
    parser.add_argument("--q2-dir", default=None, help="q3: q2's run folder (default runs/q2)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="q3: start without q2's go; q2, q3: run with fewer seeds than the judge needs to "
        "decide anything; recorded (default off)",
    )
    parser.add_argument("--dumps", default="", help="q1: the dumps folder of a finished run")
    parser.add_argument(
        "--model",
        default="",
        help="q1/q3: the model replay differentiates (default tiny-gpt2 in rehearsal)",
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
    from rescue.judge.power_cli import question_arms

    arms = question_arms(question)
    why = pw.refusal(arms, seeds)
    if why and not args.rehearsal and not args.force:
        raise InputError(f"{why}: set SEEDS >= 3, or FORCE=1 to run anyway (recorded)")
    if seeds < pw.MIN_SEEDS:  # the judge's minimum: nothing to simulate
        table = pw.Power(tuple(arms), 0, (seeds,), (0.0,))
    else:
        table = pw.power(
            arms, seeds=(seeds,), effects=(pw.LINE_EFFECT,), replicates=pw.LINE_REPLICATES
        )
    said = pw.line(table, seeds, arms=arms)
    print(f"{question}: power of the report on the cluster's arms: {said}")
    if why and not args.rehearsal:
        print(f"{question}: FORCE=1: {why}; running anyway")
        return True
    return False


def main(args: argparse.Namespace) -> int:
    from rescue.questions.chains import QUESTIONS, REPO, Settings
    from rescue.stages import Runner

    run_dir = Path(args.run_dir).resolve()
    seeds = args.seeds if args.seeds is not None else (2 if args.rehearsal else 3)
    if seeds < 1 or args.steps < 0:
        raise InputError(f"--seeds {seeds} --steps {args.steps}: allowed seeds >= 1, steps >= 0")
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
    )
    recorded = {"REHEARSAL": int(args.rehearsal), "SEEDS": seeds, "STEPS": args.steps}
    if args.question in ("q2", "q3") and power_first(args.question, seeds, args):
        recorded["FORCE"] = 1
    if args.question == "q3":
        why = check_gate(q2_dir, args.force)
        recorded.update(Q2_DIR=str(q2_dir), FORCE=int(args.force))
        if why:
            print(f"q3: FORCE=1: starting although {why}")
    stages = QUESTIONS[args.question](settings)
    if args.rehearsal:
        print(
            f"{args.question}: REHEARSAL=1: the training stage is SIMULATED (rescue sim); "
            "every other stage runs its real command"
        )
    code = Runner(run_dir, stages, question=args.question, settings=recorded, cwd=REPO).run()
    if code == 0:
        if args.question == "q2":  # the gate's verdict, as its stage printed it
            log = run_dir / "logs" / "gate.log"
            print("\n".join(x for x in log.read_text().splitlines() if x.startswith("gate:")))
        print(f"{args.question}: report {run_dir / 'report' / 'report.md'}")
    return code
