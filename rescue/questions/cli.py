"""``rescue question q1|q2|q3``: a research question's stages, run (or resumed) in RUN_DIR.

The stages are ``rescue.questions.chains``'; the runner is ``rescue.stages.Runner``: a
done stage with unchanged inputs is skipped, a failed or interrupted one restarted, and a
failure names the stage, its job and its log (exit status 1). ``--rehearsal`` runs the
same chain on a CPU in minutes, every training stage through Miles' own loop with a tiny
model (``rescue.rehearsal.miles``, in the rehearsal's environment, with the Miles and
Megatron-LM sources given).

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
        help="the chain on a CPU in minutes, training through Miles' loop with a tiny model "
        "(default off; needs --miles-src and --megatron-src)",
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
        type=int,
        default=None,
        help="seeds per arm (default 3 on the cluster, 2 in rehearsal)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        help="training steps per run (default: the launchers' own; in rehearsal 2 for q2 and "
        "q3, 3 for q1)",
    )
    parser.add_argument("--q2-dir", default=None, help="q3: q2's run folder (default runs/q2)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="q3: start without q2's go; recorded in the report (default off)",
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


def main(args: argparse.Namespace) -> int:
    from rescue.questions.chains import QUESTIONS, REPO, Settings
    from rescue.stages import Runner

    run_dir = Path(args.run_dir).resolve()
    seeds = args.seeds if args.seeds is not None else (2 if args.rehearsal else 3)
    if seeds < 1 or args.steps < 0:
        raise InputError(f"--seeds {seeds} --steps {args.steps}: allowed seeds >= 1, steps >= 0")
    q2_dir = Path(args.q2_dir or "runs/q2").resolve()
    if args.rehearsal:
        for flag, value, what, marker in (
            ("MILES_SRC", args.miles_src, "a Miles checkout", "train_async.py"),
            ("MEGATRON_SRC", args.megatron_src, "a Megatron-LM checkout", "megatron/training"),
        ):
            if not value or not (Path(value) / marker).exists():
                raise InputError(
                    f"{flag}={value!r}: REHEARSAL=1 trains through Miles' loop and needs {what} "
                    f"(with {marker}): set {flag}=/path"
                )
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
    recorded = {"REHEARSAL": int(args.rehearsal), "SEEDS": seeds, "STEPS": args.steps}
    if args.question == "q3":
        why = check_gate(q2_dir, args.force)
        recorded.update(Q2_DIR=str(q2_dir), FORCE=int(args.force))
        if why:
            print(f"q3: FORCE=1: starting although {why}")
    stages = QUESTIONS[args.question](settings)
    if args.rehearsal:
        print(
            f"{args.question}: REHEARSAL=1: training through Miles' own loop on this CPU with a "
            "tiny model; a stage that stands in for a cluster one says so"
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
