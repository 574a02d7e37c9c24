"""The small commands the question chains need between the existing ones.

Run as ``python -m rescue.questions.rehearsal COMMAND``. Each does one hand-off and holds
no decision of its own: calibration, training, replay and judging are the existing
commands' code, called as they are.

- ``calibrate``: ``rescue rlvr calibrate`` against the rehearsal's stand-in SGLang engine
  (``rescue.rehearsal.standins.engine``) serving the taught tiny model (``--model``), started here
  on a free port: every response is sampled from the model, so the truncation rates are
  the model's own.
- ``wait``: checks that the training rehearsal ran every arm x seed and each passed its
  checks (its ``summary.json``).
- ``collect``: lists the runs the report will read (``runs.json``), an error when none.
- ``gate``: reads q2's report, prints P3's verdict and interval, writes ``gate.json``.
- ``pilot``: drawn trial outcomes per task, then ``rescue swe pilot --summarize-only``.
- ``validate``: ``rescue swe validate`` of the pilot's subset through the stand-in docker
  (``rescue.rehearsal.standins.docker``), each task's image the tiny calc repository
  (``rescue.rehearsal.standins.tasks``) under the task's own id and image, its reference solution
  that repository's bug patch.
- ``swe-runs``: ``make swe-arm`` for every (arm, seed), one after another (cluster).
- ``link``: a symlink to the one folder a glob matches (cluster).
- ``force-note``: writes into a report that it was made with FORCE=1.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

from rescue.errors import InputError
from rescue.output import staged, write_text
from rescue.stages import write_progress


def _cli(argv: list[str]) -> int:
    from rescue.cli import main

    return main(argv)


#: The rehearsal calibration's candidate caps and window (the window is the launcher's
#: default, CAL_LOW and CAL_HIGH of launch/rlvr_config.sh), prompts and responses per prompt.
CAL_CAPS = "16 24 32 48 64 96"
CAL_WINDOW = ("0.2", "0.4")
CAL_PROMPTS, CAL_N = 16, 8


def calibrate(args: argparse.Namespace) -> int:
    """``rescue rlvr calibrate`` against the stand-in engine serving the taught model
    (``rescue.rehearsal.tiny.singleturn``): the engine samples every response from the model
    itself, so the truncation rates are the model's own and the window is the launcher's."""
    from rescue.rehearsal.standins.engine import Engine, Model
    from rescue.rehearsal.tiny.policy import Policy

    model_dir = Path(args.model)
    if not (model_dir / "model.safetensors").is_file():
        raise InputError(f"--model={model_dir}: no model.safetensors (a taught model folder)")
    prompts = sum(1 for line in Path(args.data).read_text().splitlines() if line.strip())
    engine = Engine(Model(model_dir, policy=Policy(model_dir, seed=args.seed)), port=0).start()
    try:
        return _cli(
            ["rlvr", "calibrate", "--data", args.data, "--model", str(model_dir),
             "--base-url", f"http://127.0.0.1:{engine.port}", "--caps", args.caps,
             "--out", args.out, "--prompts", str(min(prompts, CAL_PROMPTS)), "--n", str(CAL_N),
             "--low", CAL_WINDOW[0], "--high", CAL_WINDOW[1], "--concurrency", "4",
             "--seed", str(args.seed)]
        )  # fmt: skip
    finally:
        engine.close()


def wait(args: argparse.Namespace) -> int:
    summary = Path(args.train) / "summary.json"
    if not summary.is_file():
        print(f"no {summary}: the training stage wrote no run", file=sys.stderr)
        return 1
    runs = {r["run"]: r for r in json.loads(summary.read_text())["runs"]}
    want = [
        f"{arm}-seed{seed}" for arm in args.arms.split(",") for seed in range(1, args.seeds + 1)
    ]
    missing = [name for name in want if name not in runs]
    failed = [
        f"{name} ({runs[name]['status']})" for name in want if name in runs and not runs[name]["ok"]
    ]
    if missing or failed:
        print(f"runs missing: {', '.join(missing) or 'none'}; runs failing their checks: "
              f"{', '.join(failed) or 'none'}", file=sys.stderr)  # fmt: skip
        return 1
    print(f"every run trained and passed its checks: {len(args.arms.split(','))} arms x "
          f"{args.seeds} seeds")  # fmt: skip
    return 0


def collect(args: argparse.Namespace) -> int:
    paths = sorted(glob.glob(args.runs)) if glob.has_magic(args.runs) else [args.runs]
    paths = [p for p in paths if Path(p).exists()]
    if not paths:
        raise InputError(f"no runs at {args.runs}: did the training stage write them?")
    write_text(args.out, json.dumps({"runs": paths}, indent=1))
    print(f"{len(paths)} run folder(s) for the report: {', '.join(paths)}")
    return 0


def p3_results(report: dict) -> list[dict]:
    """Every P3 result of a report.json, with its cohort."""
    out = []
    for cohort in report.get("cohorts", []):
        for r in cohort.get("results", []):
            if r.get("id") == "P3":
                out.append(r)
    return out


def gate_decision(report: dict) -> dict:
    """go when some P3 result is ``as predicted`` (the mask drifts relative to R = 0 and
    the control of the update's size does not reproduce it: the step-size control when it
    ran, else the matched control, ``rescue.judge.rules.p3``), with the deciding checks'
    intervals and the control the clause was read against (``control``)."""
    results = p3_results(report)
    checks = [
        {"name": c["name"], "verdict": c.get("verdict"), "estimate": c.get("estimate")}
        for r in results
        for c in r.get("checks", [])
        if c.get("decides")
    ]
    verdicts = [r.get("verdict") for r in results]
    names = " ".join(c["name"] for c in checks)
    control = (
        "step-control" if "step-size control" in names
        else "matched" if "matched control" in names
        else None
    )  # fmt: skip
    return {"go": "as predicted" in verdicts, "verdicts": verdicts, "checks": checks,
            "control": control}  # fmt: skip


def gate(args: argparse.Namespace) -> int:
    report = json.loads(Path(args.report).read_text())
    decision = gate_decision(report)
    decision["report"] = str(args.report)
    if not decision["verdicts"]:
        print("gate: P3 was not judged (the report has no P3 result): no go")
    if decision["control"] == "step-control":
        print("gate: P3's control clause read against the step-size control (step-control); "
              "the matched control (arm iii) is its reported direction check")  # fmt: skip
    elif decision["control"] == "matched":
        print("gate: no step-size control ran: P3's control clause read against the matched "
              "control (arm iii), as the plan's sentences are written (docs/judge.md)")  # fmt: skip
    for r, c in zip(
        decision["verdicts"] * len(decision["checks"]), decision["checks"], strict=False
    ):
        est = c["estimate"] or {}
        print(
            f"gate: P3 {r}; {c['name']}: {c['verdict']}, estimate {_num(est.get('value'))} "
            f"[{_num(est.get('lo'))}, {_num(est.get('hi'))}] (n={est.get('n')})"
        )
    print(
        f"gate: {'GO' if decision['go'] else 'NO GO'} for q3"
        + ("" if decision["go"] else " (make q3 FORCE=1 overrides, and its report says so)")
    )
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(decision, indent=1))
    os.replace(tmp, args.out)
    return 0


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def pilot(args: argparse.Namespace) -> int:
    rows = [json.loads(x) for x in Path(args.tasks).read_text().splitlines() if x.strip()]
    with staged(args.out) as stage:
        return _pilot(rows, args.tasks, stage.path)


def _pilot(rows: list[dict], tasks: str, out: Path) -> int:
    import random

    rng = random.Random(1)
    lines = []
    for i, row in enumerate(rows):
        iid = row["metadata"]["instance_id"]
        p = (0.0, 0.35, 0.9)[i % 3]  # one task in three inside the window
        for t in range(8):
            outcome = "solved" if rng.random() < p else "submitted_failure"
            lines.append(
                json.dumps(
                    {
                        "instance_id": iid,
                        "trial": t,
                        "outcome": outcome,
                        "reward": float(outcome == "solved"),
                        "model": "rehearsal",
                    }
                )
            )
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    code = _cli(["swe", "pilot", "--tasks", tasks, "--out", str(out), "--summarize-only"])
    if code != 0:  # nothing replaces the earlier pilot folder
        raise SystemExit(code)
    return code


def validate(args: argparse.Namespace) -> int:
    with staged(args.out) as stage:
        code = _validate(args, stage.path)
        if code != 0:  # nothing replaces the earlier folder
            raise SystemExit(code)
    return code


def _validate(args: argparse.Namespace, out: Path) -> int:
    from rescue.rehearsal.standins import tasks as tiny

    rows = [json.loads(x) for x in Path(args.tasks).read_text().splitlines() if x.strip()]
    root = tiny.docker_state(out / "docker")
    shim = tiny.write_docker_shim(out / "bin", sys.executable)
    stand_in, references = [], []
    # every task gets its image and reference; `rescue swe validate --subset` picks the subset
    for row in rows:
        meta = row["metadata"]
        iid = meta["instance_id"]
        folder = tiny.image_folder(root / "images", meta["image"])
        if not folder.exists():
            tiny.make_task_image(root / "images", meta["image"], iid)
        else:  # tasks of one repository share its image: each has its own branch there
            first = next(
                r["metadata"]["instance_id"]
                for r in rows
                if r["metadata"]["image"] == meta["image"]
            )
            subprocess.run(
                ["git", "branch", "-f", iid, first], cwd=folder, check=True, capture_output=True
            )
        # the tiny repository's tests stand for the task's: the grader runs them
        meta = {**meta, "FAIL_TO_PASS": list(tiny.F2P), "PASS_TO_PASS": list(tiny.P2P)}
        stand_in.append(json.dumps({**row, "metadata": meta}))
        references.append(json.dumps({"instance_id": iid, "patch": tiny.BUG_PATCH}))
    tasks = out / "tasks.jsonl"
    refs = out / "tasks.reference.jsonl"
    tasks.write_text("\n".join(stand_in) + "\n")
    refs.write_text("\n".join(references) + "\n")
    os.environ.update(FAKE_DOCKER_ROOT=str(root), MSWEA_DOCKER_EXECUTABLE=str(shim))
    return _cli(
        ["swe", "validate", "--tasks", str(tasks), "--subset", args.subset,
         "--references", str(refs), "--out", str(out), "--concurrency", "2", "--no-progress"]
    )  # fmt: skip


def swe_runs(args: argparse.Namespace) -> int:
    runs = [r.split(":") for r in args.runs.split()]
    total = len(runs) * args.seeds
    done = 0
    for spec in runs:
        for seed in range(1, args.seeds + 1):
            env = {
                "ARM": spec[0],
                "SEED": str(seed),
                "PROMPT_DATA": args.prompt_data,
                "OUTPUT_DIR": args.output_dir,
                "DUMP_STEPS": "50",
            }
            if len(spec) > 1:
                env["A"] = spec[1]
            if args.steps:
                env["NUM_ROLLOUT"] = str(args.steps)
            write_progress(done, total, "runs", f"running {' '.join(spec)} seed {seed}")
            argv = [
                "make",
                "--no-print-directory",
                "swe-arm",
                *(f"{k}={v}" for k, v in env.items()),
            ]
            print("+ " + " ".join(argv), flush=True)
            code = subprocess.call(argv)
            if code != 0:
                print(f"swe-arm {' '.join(spec)} seed {seed} failed (exit {code})", file=sys.stderr)
                return code
            done += 1
    write_progress(done, total, "runs", "every run done")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return 0


def link(args: argparse.Namespace) -> int:
    found = sorted(glob.glob(args.pattern))
    if len(found) != 1:
        raise InputError(f"{args.pattern}: expected one folder, found {found or 'none'}")
    tmp = f"{args.out}.partial-{os.getpid()}"
    os.symlink(os.path.abspath(found[0]), tmp)
    os.replace(tmp, args.out)  # the link is replaced, never missing
    return 0


def force_note(args: argparse.Namespace) -> int:
    folder = Path(args.report)
    note = "FORCE=1: q3 was started without q2's gate saying go" + (
        f" (gate file: {args.gate})" if args.gate else " (no q2 gate file)"
    )
    data = json.loads((folder / "report.json").read_text())
    if data.get("forced"):
        print(note + " (already recorded)")
        return 0
    data.setdefault("notes", []).insert(0, note)
    data["forced"] = True
    md = folder / "report.md"
    text = f"> **{note}**\n\n" + md.read_text()
    write_text(folder / "report.json", json.dumps(data, indent=1))
    write_text(md, text)
    print(note)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rescue.questions.rehearsal")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("--data", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--caps", default=CAL_CAPS)
    c.add_argument("--seed", type=int, default=1)
    c.set_defaults(fn=calibrate)
    w = sub.add_parser("wait")
    w.add_argument("train")
    w.add_argument("--arms", required=True)
    w.add_argument("--seeds", type=int, required=True)
    w.set_defaults(fn=wait)
    k = sub.add_parser("collect")
    k.add_argument("runs")
    k.add_argument("--out", required=True)
    k.set_defaults(fn=collect)
    g = sub.add_parser("gate")
    g.add_argument("report")
    g.add_argument("--out", required=True)
    g.set_defaults(fn=gate)
    q = sub.add_parser("pilot")
    q.add_argument("--tasks", required=True)
    q.add_argument("--out", required=True)
    q.set_defaults(fn=pilot)
    v = sub.add_parser("validate")
    for name in ("--tasks", "--subset", "--out"):
        v.add_argument(name, required=True)
    v.set_defaults(fn=validate)
    r = sub.add_parser("swe-runs")
    for name in ("--runs", "--prompt-data", "--output-dir", "--out"):
        r.add_argument(name, required=True)
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--steps", type=int, default=0)
    r.set_defaults(fn=swe_runs)
    m = sub.add_parser("link")
    m.add_argument("pattern")
    m.add_argument("--out", required=True)
    m.set_defaults(fn=link)
    f = sub.add_parser("force-note")
    f.add_argument("report")
    f.add_argument("--gate", default="")
    f.set_defaults(fn=force_note)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
