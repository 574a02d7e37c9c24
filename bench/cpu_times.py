"""The times the docs state for the CPU commands, measured on this machine.

Measures, each as a new user meets it (wall-clock seconds):

- ``install``: a fresh virtual environment and what ``make test`` installs into it (the
  ``TEST_EXTRAS`` of the Makefile; pip's cache as it is on this machine, said in the record);
- ``make test``: the newcomer's test tier, in that environment;
- ``make demo``: the demo's recipe (read from the Makefile), into a temporary folder; and
  ``make demo``'s install, what a fresh clone's first ``make demo`` installs before it (a
  fresh virtual environment with the ``[sim]`` extra);
- ``make q1 REHEARSAL=1``, ``make q2 REHEARSAL=1``, ``make q3 REHEARSAL=1 FORCE=1``: each
  question's rehearsal into a temporary run folder (q3 forced: q2's rehearsal says no go),
  after the extras these targets install (not timed); every training stage trains through
  Miles' own loop, so they need ``MILES_SRC`` and ``MEGATRON_SRC`` (``--miles-src``,
  ``--megatron-src``, default the environment's);
- ``make agent-arm ENV=cooking ARM=zero|mask|turn REHEARSAL=1``: the text-game arms in
  that order, into a temporary inputs folder (``AGENT_REHEARSAL_INPUTS``): the first makes
  the games and teaches the tiny model, the others reuse them;
- ``make rehearsal KILL_AT=1``: the SWE protect arm killed mid-step 1 after a checkpoint and
  resumed (two lives and the report), into a temporary folder.

Each figure is recorded in ``bench/cpu_times.json`` with when and on what machine (cores,
CPU, the 1-minute load average when the command started and when it ended: other work on
the machine slows every figure); ``--only`` measures some of them and keeps the
others' records. The docs quote these records (``tests/test_docs.py`` checks every time
they state for these commands against them) and ``docs/performance.md`` lists them.

Run: ``.venv/bin/python bench/cpu_times.py [--only demo,demo-install,q1,q2,q3,install,test,...]``
(``--venv DIR``: the environment for everything but ``install``, default ``.venv``; the
``install`` figure builds its own in a temporary folder, which ``make test`` then uses).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "bench" / "cpu_times.json"
#: Figure name -> the command the docs name it by.
COMMANDS = {
    "install": "make test's install",
    "test": "make test",
    "demo": "make demo",
    "demo-install": "make demo's install",
    "q1": "make q1 REHEARSAL=1",
    "q2": "make q2 REHEARSAL=1",
    "q3": "make q3 REHEARSAL=1 FORCE=1",
    "agent-zero": "make agent-arm ENV=cooking ARM=zero REHEARSAL=1",
    "agent-mask": "make agent-arm ENV=cooking ARM=mask REHEARSAL=1",
    "agent-turn": "make agent-arm ENV=cooking ARM=turn REHEARSAL=1",
    "kill-resume": "make rehearsal KILL_AT=1",
}
#: The figures that train through Miles (they need the framework sources).
TRAINING = ("q1", "q2", "q3", "agent-zero", "agent-mask", "agent-turn", "kill-resume")
#: Figures whose record says how warm pip's cache was (an install).
INSTALLS = ("install", "demo-install")


def display(seconds: float) -> str:
    """``41 s``, ``2 min 6 s``: how the docs write a measured time."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}"


def env() -> dict[str, str]:
    """This environment as a user's shell has it: not inside another make."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}


#: The 1-minute load average when each timed command started and ended (other work on the
#: machine slows every figure; the record says how busy it was).
LOADS: list[tuple[float, float]] = []


def load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def timed(argv: list[str], cwd: Path = ROOT) -> float:
    print("+ " + " ".join(argv), flush=True)
    start = load()
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env())
    seconds = time.monotonic() - t0
    LOADS.append((start, load()))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {done.returncode}): nothing recorded")
    return seconds


def test_extras() -> str:
    makefile = (ROOT / "Makefile").read_text()
    return re.search(r"^TEST_EXTRAS := (\S+)$", makefile, re.M)[1]


def demo_argv(python: str, out: Path) -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo: .*\n\t\$\(PY\) -m rescue (.*)$", makefile, re.M)[1].split()
    return [python, "-m", "rescue", *recipe, "--out", str(out)]


class Figures(dict):
    """The figures measured so far, each written to ``bench/cpu_times.json`` as soon as it is
    measured: a later figure that fails (which records nothing of its own) loses none."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.strftime("%Y-%m-%d")
        self.pip = (
            "pip's cache warm" if (Path.home() / ".cache" / "pip").is_dir() else "no pip cache"
        )

    def __setitem__(self, name: str, value: tuple[float, tuple[float, float]]) -> None:
        super().__setitem__(name, value)
        seconds, (before, after) = value
        record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        record[name] = {
            "command": COMMANDS[name],
            "seconds": round(seconds, 1),
            "display": display(seconds),
            "when": self.started,
            "machine": machine(),
            "load_average": [round(before, 1), round(after, 1)],
            **({"pip": self.pip} if name in INSTALLS else {}),
        }
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {display(seconds)} recorded in {RECORD.relative_to(ROOT)}", flush=True)


def measure(names: list[str], venv: Path, sources: list[str] = ()) -> Figures:
    """Seconds, and the load average at the start and the end, of each figure, each recorded
    when measured; ``sources``: ``MILES_SRC=...``, ``MEGATRON_SRC=...`` for the training
    figures."""
    got = Figures()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "install" in names or "test" in names:
            fresh = work / "venv"
            stamp = fresh / f".stamp-{test_extras()}"
            seconds = timed(["make", "--no-print-directory", f"VENV={fresh}", str(stamp)])
            if "install" in names:
                got["install"] = seconds, LOADS[-1]
            if "test" in names:
                argv = ["make", "--no-print-directory", "test", f"VENV={fresh}", "PYTEST_ARGS=-q"]
                got["test"] = timed(argv), LOADS[-1]
        if "demo-install" in names:
            fresh = work / "demo-venv"
            argv = ["make", "--no-print-directory", f"VENV={fresh}", f"{fresh}/.stamp-sim"]
            got["demo-install"] = timed(argv), LOADS[-1]
        python = str(venv / "bin" / "python")
        if "demo" in names:
            got["demo"] = timed(demo_argv(python, work / "sim")), LOADS[-1]
        if {"q1", "q2", "q3"} & set(names):  # their install first, not timed
            timed(["make", "--no-print-directory", f"VENV={venv}",
                   f"{venv}/.stamp-sim+replay+rlvr+swe"])  # fmt: skip
        for q, extra in (("q1", []), ("q2", []), ("q3", ["FORCE=1"])):
            if q in names:
                argv = ["make", "--no-print-directory", f"VENV={venv}", q, "REHEARSAL=1",
                        f"RUN_DIR={work / q}", *sources, *extra]  # fmt: skip
                if q == "q3":  # its gate is q2's rehearsal's: read from the one just run
                    argv.append(f"Q2_DIR={work / 'q2'}")
                got[q] = timed(argv), LOADS[-1]
        for arm in ("zero", "mask", "turn"):  # in this order: zero makes the inputs
            if f"agent-{arm}" in names:
                argv = ["make", "--no-print-directory", f"VENV={venv}", "agent-arm", "ENV=cooking",
                        f"ARM={arm}", "REHEARSAL=1", f"AGENT_REHEARSAL_INPUTS={work / 'agent'}",
                        f"REHEARSAL_ARGS=--out {work / arm}", *sources]  # fmt: skip
                got[f"agent-{arm}"] = timed(argv), LOADS[-1]
        if "kill-resume" in names:
            argv = ["make", "--no-print-directory", "rehearsal", "KILL_AT=1",
                    f"REHEARSAL_ARGS=--out {work / 'kill-resume'}", *sources]  # fmt: skip
            got["kill-resume"] = timed(argv), LOADS[-1]
    return got


def table(record: dict) -> str:
    """The markdown table of the recorded figures (docs/performance.md has it)."""
    rows = [
        "| command | time | measured on | machine | load average, start / end |",
        "|---|---|---|---|---|",
    ]
    for name in COMMANDS:
        if name in record:
            r = record[name]
            before, after = r["load_average"]
            pip = f" ({r['pip']})" if "pip" in r else ""
            rows.append(
                f"| `{r['command']}`{pip} | {r['display']} | {r['when']} | {r['machine']} "
                f"| {before:g} / {after:g} |"
            )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(COMMANDS), help="comma-separated figures")
    p.add_argument("--venv", default=str(ROOT / ".venv"), help="environment (default .venv)")
    p.add_argument("--miles-src", default=os.environ.get("MILES_SRC", ""),
                   help="Miles checkout for the training figures (default $MILES_SRC)")  # fmt: skip
    p.add_argument("--megatron-src", default=os.environ.get("MEGATRON_SRC", ""),
                   help="Megatron-LM checkout for them (default $MEGATRON_SRC)")  # fmt: skip
    args = p.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(COMMANDS))
    if unknown:
        raise SystemExit(f"--only: {', '.join(unknown)}; allowed: {', '.join(COMMANDS)}")
    if shutil.which("make") is None:
        raise SystemExit("needs make")
    training = [n for n in names if n in TRAINING]
    if training and not (args.miles_src and args.megatron_src):
        raise SystemExit(
            f"--miles-src and --megatron-src (or MILES_SRC, MEGATRON_SRC): {', '.join(training)} "
            "train through Miles"
        )
    sources = [f"MILES_SRC={args.miles_src}", f"MEGATRON_SRC={args.megatron_src}"]
    measure(names, Path(args.venv), sources if training else [])
    record = json.loads(RECORD.read_text())
    print(table(record))
    print(f"recorded in {RECORD.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
