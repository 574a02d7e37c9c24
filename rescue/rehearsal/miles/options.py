"""The flags of ``python -m rescue.rehearsal.miles``, checked (an error names the flag and
what is allowed); its ``--help`` text is the driver's docstring (``rescue.rehearsal.miles.run``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rescue.rehearsal.miles.changes import FAULTS
from rescue.rehearsal.miles.command import ROOT
from rescue.rehearsal.miles.launchers import LAUNCHERS, Launcher

#: The default arm of each launcher.
DEFAULT_ARM = {"swe": "protect", "rlvr": "zero", "agent": "zero"}


def _arm_list(text: str, launcher: Launcher) -> list[tuple[str, str | None]]:
    """``ARM[:A],...`` -> [(arm, a)]; protect's a defaults to 0.5."""
    out = []
    for item in (x for x in text.replace(" ", ",").split(",") if x):
        arm, _, a = item.partition(":")
        if arm not in launcher.arms:
            raise ValueError(f"{arm!r}; allowed: {', '.join(launcher.arms)}")
        if a and arm != "protect":
            raise ValueError(f"{item!r}: a keep probability applies only to protect")
        out.append((arm, a or ("0.5" if arm == "protect" else None)))
    return out


def parse(argv: list[str] | None, description: str | None) -> argparse.Namespace:
    """The rehearsal's flags, checked (an error names the flag and what is allowed);
    ``description``: the --help text (the driver's docstring)."""
    p = argparse.ArgumentParser(prog="python -m rescue.rehearsal.miles", description=description)
    p.add_argument(
        "--launcher",
        default="swe",
        help=f"the launcher rehearsed: {', '.join(LAUNCHERS)} (default swe)",
    )
    p.add_argument(
        "--arm",
        default=None,
        help="the arm, or several as ARM[:A],... (protect's keep probability after the colon); "
        "default protect (swe), zero (rlvr, agent)",
    )
    p.add_argument("--a", default=None, help="keep probability for protect (default 0.5)")
    p.add_argument("--miles-src", default=os.environ.get("MILES_SRC"), help="Miles checkout")
    p.add_argument(
        "--megatron-src",
        default=os.environ.get("MEGATRON_SRC"),
        help="Megatron-LM checkout (megatron.core, megatron.training; default $MEGATRON_SRC)",
    )
    p.add_argument(
        "--offpolicy",
        default=None,
        help="OFFPOLICY of the launcher: swe tis-sc (default) or tis; rlvr none (default), tis "
        "or tis-sc; agent none",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=3,
        help="trained steps checked (default 3); the run makes one more, whose rollout "
        "metrics Miles can lose at exit",
    )
    p.add_argument("--seed", type=int, default=1, help="SEED of the launcher (default 1)")
    p.add_argument(
        "--seeds",
        type=int,
        default=0,
        help="run seeds 1..N of every arm, each its own run (default 0: --seed alone)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs at once, each lane with a Ray head of its own (default 1)",
    )
    p.add_argument("--staleness", type=int, default=None, help="STALENESS K (default 0; pace 1)")
    p.add_argument(
        "--router",
        default="miles",
        help="miles (Miles' own router, default) or sglang (PyPI sglang-router)",
    )
    p.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="FLAG",
        help="rehearse the launcher's command without FLAG, e.g. "
        "--without=--sglang-tool-call-parser (repeatable; default none)",
    )
    p.add_argument("--extra-args", default="", help="EXTRA_ARGS of the launcher (default none)")
    p.add_argument(
        "--fault",
        default=None,
        help=f"break the run on purpose, to see the rehearsal catch it: {', '.join(FAULTS)} "
        "(default none)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="rlvr, agent: a taught model folder to reuse (default: teach one into the inputs)",
    )
    p.add_argument(
        "--prompt-data",
        default=None,
        help="the runs' prompt rows (swe: task rows, e.g. q3's subset; rlvr: rescue rlvr "
        "prepare's; agent: rescue agent prepare's); default: the rehearsal's own",
    )
    p.add_argument(
        "--inputs",
        default=None,
        help="rlvr, agent: the folder of the inputs the runs share (taught model, rows, games, "
        "cap), made there when missing and reused when present (default: in --out)",
    )
    p.add_argument(
        "--cap-file",
        default=None,
        help="rlvr: the cap file of rescue rlvr calibrate (default: calibrate here)",
    )
    p.add_argument(
        "--kill-at",
        type=int,
        default=None,
        metavar="STEP",
        help="swe, one run: SIGKILL the whole run while step STEP is in progress after a "
        "checkpoint, then resume it with the launcher's RESUME=1 path from Miles' checkpoint "
        "and check the two lives (default: no kill)",
    )
    p.add_argument(
        "--kill-engine-at",
        type=int,
        default=None,
        metavar="STEP",
        help="swe: the stand-in engine dies as SGLang dies (connections reset, no reply, "
        "never back) while step STEP's rollout is generated (0: the first); the run must stop "
        "through rescue's watchdog with one line (default: no engine death)",
    )
    p.add_argument(
        "--reference",
        default=None,
        metavar="DIR",
        help="with --kill-at: the folder of the same arm's uninterrupted rehearsal (same seed "
        "and steps), compared with the resumed run (default: none; the uninterrupted step "
        "sequence is known)",
    )
    p.add_argument(
        "--timeout", type=int, default=1200, help="seconds per run from its start (default 1200)"
    )
    p.add_argument("--out", default=None, help="run folder (default runs/rehearsal/ARM-TIME)")
    p.add_argument(
        "--replace",
        action="store_true",
        help="run in OUT.partial and put it in place of OUT only when every run passed (a "
        "failed rehearsal leaves OUT as it was); default: OUT must be new or empty",
    )
    a = p.parse_args(argv)
    if a.launcher not in LAUNCHERS:
        p.error(f"--launcher={a.launcher!r}; allowed: {', '.join(LAUNCHERS)}")
    launcher = LAUNCHERS[a.launcher]
    try:
        a.arm_list = _arm_list(a.arm or DEFAULT_ARM[a.launcher], launcher)
    except ValueError as e:
        p.error(f"--arm={e}")
    if not a.arm_list:
        p.error(f"--arm={a.arm!r}; allowed: {', '.join(launcher.arms)}")
    a.arm = a.arm_list[0][0]
    if a.a is not None:
        if a.arm != "protect" or len(a.arm_list) > 1:
            p.error(f"--a={a.a}; allowed only with --arm protect (or ARM:A in a list)")
        a.arm_list = [("protect", a.a)]
    a.a = a.arm_list[0][1]
    a.offpolicy = a.offpolicy or launcher.offpolicy[0]
    if a.offpolicy not in launcher.offpolicy:
        p.error(f"--offpolicy={a.offpolicy!r}; allowed: {', '.join(launcher.offpolicy)}")
    for flag, value, what in (
        ("--miles-src", a.miles_src, "a Miles checkout with train_async.py"),
        ("--megatron-src", a.megatron_src, "a Megatron-LM checkout with megatron/training"),
    ):
        if not value:
            p.error(f"{flag} (or {flag[2:].upper().replace('-', '_')}) is required: {what}")
    entry = Path(a.miles_src) / launcher.entry
    if not entry.is_file():
        p.error(f"--miles-src={a.miles_src}: no {launcher.entry} there; allowed: a Miles checkout")
    if "__main__" not in entry.read_text(errors="replace"):
        # an emptied entry point runs, prints nothing and succeeds, having trained nothing
        p.error(f"--miles-src={a.miles_src}: {launcher.entry} has no __main__ block (size "
                f"{entry.stat().st_size} bytes): the checkout is damaged; unpack it again")  # fmt: skip
    if not (Path(a.megatron_src) / "megatron" / "training").is_dir():
        p.error(
            f"--megatron-src={a.megatron_src}: no megatron/training there; allowed: a "
            "Megatron-LM checkout (the vendored megatron-2e64d788)"
        )
    if a.fault is not None and a.fault not in FAULTS:
        p.error(f"--fault={a.fault!r}; allowed: {', '.join(FAULTS)}")
    if a.router not in ("miles", "sglang"):
        p.error(f"--router={a.router!r}; allowed: miles, sglang")
    bad = [f for f in a.without if not f.startswith("--")]
    if bad:
        p.error(f"--without={bad[0]!r}; allowed: a flag name such as --sglang-tool-call-parser")
    for flag, value, least in (("--steps", a.steps, 1), ("--timeout", a.timeout, 1),
                               ("--parallel", a.parallel, 1), ("--seeds", a.seeds, 0)):  # fmt: skip
        if value < least:
            p.error(f"{flag}={value}; allowed: an integer >= {least}")
    for flag, value in (("--model", a.model), ("--prompt-data", a.prompt_data),
                        ("--cap-file", a.cap_file)):  # fmt: skip
        if value and not Path(value).exists():
            p.error(f"{flag}={value}: no such file or folder")
    if a.launcher == "swe" and (a.model or a.cap_file or a.inputs):
        p.error("--model, --cap-file and --inputs apply to --launcher rlvr or agent")
    if a.kill_at is not None:
        if a.launcher != "swe":
            p.error(f"--kill-at applies to --launcher swe (the asynchronous trainer, whose "
                    f"buffer counts what a restart loses), not {a.launcher}")  # fmt: skip
        if len(a.arm_list) > 1 or a.seeds or a.parallel > 1:
            p.error("--kill-at kills one run: one arm, one seed, --parallel 1")
        if not 1 <= a.kill_at <= a.steps:
            p.error(f"--kill-at={a.kill_at}; allowed: a step from 1 to --steps={a.steps} (a "
                    "checkpoint of an earlier step comes before it)")  # fmt: skip
    if a.kill_engine_at is not None:
        if a.launcher != "swe":
            p.error(f"--kill-engine-at applies to --launcher swe, not {a.launcher}")
        if a.kill_at is not None or len(a.arm_list) > 1 or a.seeds or a.parallel > 1:
            p.error("--kill-engine-at breaks one run: one arm, one seed, no --kill-at")
        if not 0 <= a.kill_engine_at <= a.steps:
            p.error(f"--kill-engine-at={a.kill_engine_at}; allowed: a step from 0 to "
                    f"--steps={a.steps}")  # fmt: skip
    if a.reference is not None:
        if a.kill_at is None:
            p.error("--reference applies with --kill-at")
        if not (Path(a.reference) / "report.json").is_file():
            p.error(f"--reference={a.reference}: no report.json there; allowed: the folder of "
                    "a finished rehearsal of the same arm")  # fmt: skip
    a.out = a.out or str(
        ROOT / "runs" / "rehearsal" / f"{a.launcher}-{a.arm}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    return a
