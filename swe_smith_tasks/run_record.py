"""A run's record next to its checkpoints, and what a launch checks before it submits.

Specification
-------------
``record(command, env, data)`` is what makes two runs of an arm different: the trainer's
flags (``flag -> values``, from its command line), the Ray job's ``RESCUE_*`` and
``SGLANG_*`` settings (the arm, the agent and its sandbox, the watchdog, pace; not where the
job runs: ``MASTER_ADDR``, ``PYTHONPATH``), the prompt data's path and SHA-256 (the task
data), the Miles commit when known, and rescue's version (kept, not compared).

``check_save_dir(save_dir, record, resume=...)`` decides whether a launch may use
``save_dir`` (Miles' ``--save`` and ``--load``):

- nothing there (missing or empty): a new run; the record is written to ``RECORD`` there;
- something there and ``resume`` false: refused (Miles would resume silently from the old
  checkpoint under the same name);
- ``resume`` true: refused when there is no record (nothing to compare with) or when any
  compared key differs, each differing key named with both values; else the run resumes.

A refusal is an ``InputError`` naming the setting to change. ``dry_run`` checks without
writing. Each launch that writes is kept in the record's ``launches`` (its time, whether it
resumed): the run's record says when it was resumed (``rescue status SAVE_DIR``, which adds
from the ledger of the run's lives, ``rescue.restart``, from which step and how many groups
the restart lost).

The wandb run: ``wandb_run_id(save_dir)`` is the id recorded for the run in ``save_dir`` (a
new one when there is none), which the launcher gives the job as ``WANDB_RUN_ID`` with
``WANDB_RESUME=allow``: every life of a resumed run logs to the same wandb run (offline, to
folders of one run id, which ``rescue report`` joins, reading each step once). The record
keeps it (``wandb_run_id``, not compared).

``version_warnings(miles_commit, sglang_version)`` names what differs from the versions
rescue is tested against (``rescue.frameworks``): the Miles checkout's commit and the
installed SGLang, each with both versions; an unknown version is said to be unknown.

``python -m swe_smith_tasks.run_record check|versions|wandb-id ...`` is what the launchers
call.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.frameworks import MILES, SGLANG_VERSION

#: The record's file name in the save directory.
RECORD = "rescue-run.json"
#: Keys of a record that are kept but never compared.
NOT_COMPARED = frozenset({"rescue_version", "command", "wandb_run_id", "launches"})
#: The job's environment variables that name its wandb run (``wandb_run_id``).
WANDB_ID, WANDB_RESUME = "WANDB_RUN_ID", "WANDB_RESUME"
#: Prefixes of the job's environment variables that are settings of the run.
SETTING_PREFIXES = ("RESCUE_", "SGLANG_")


def flags_of(words: Sequence[str]) -> dict[str, list[str]]:
    """``--a 1 2 --b`` -> ``{"--a": ["1", "2"], "--b": []}`` (a repeated flag keeps all values)."""
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for word in words:
        if word.startswith("--"):
            current = word
            flags.setdefault(word, [])
        elif current is not None:
            flags[current].append(word)
    return flags


def sha256(path: str | os.PathLike[str]) -> str | None:
    """The file's SHA-256, ``None`` when there is no such file."""
    p = Path(path)
    if not p.is_file():
        return None
    digest = hashlib.sha256()
    with p.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def miles_commit(miles_dir: str | os.PathLike[str]) -> str | None:
    """The commit of a Miles git checkout (``None``: not a git checkout, or no git)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(miles_dir), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def record(
    command: Sequence[str],
    env: Mapping[str, str],
    data: str | os.PathLike[str],
    *,
    commit: str | None = None,
) -> dict[str, Any]:
    """The record of a launch (module docstring)."""
    from rescue import __version__

    return {
        "flags": flags_of(command),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(SETTING_PREFIXES)},
        "data": {"path": str(data), "sha256": sha256(data)},
        "miles_commit": commit,
        "rescue_version": __version__,
        "command": list(command),
        "wandb_run_id": env.get(WANDB_ID),
    }


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for every compared key that differs (nested keys dotted)."""

    def flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if not prefix and k in NOT_COMPARED:
                continue
            if isinstance(v, Mapping):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat(old), flat(new)
    missing = object()
    return [
        f"{key}: {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}"
        for key in sorted(set(a) | set(b))
        if a.get(key, missing) != b.get(key, missing)
    ]


def check_save_dir(
    save_dir: str | os.PathLike[str],
    new: Mapping[str, Any],
    *,
    resume: bool,
    dry_run: bool = False,
) -> str:
    """Whether a launch may use ``save_dir`` (module docstring); returns one line saying
    what happens, or raises ``InputError``."""
    folder = Path(save_dir)
    path = folder / RECORD
    used = folder.is_dir() and any(folder.iterdir())
    if not used:
        if not dry_run:
            folder.mkdir(parents=True, exist_ok=True)
            _write(path, {**new, "launches": [_launch(resume=False)]})
        return f"new run: its settings are recorded in {path}"
    if not resume:
        raise InputError(
            f"SAVE_DIR={folder} already holds a run (Miles would resume from it silently): "
            "set RESUME=1 to continue that run with the same settings, or set another "
            "RUN_NAME or SAVE_DIR"
        )
    if not path.is_file():
        raise InputError(
            f"RESUME=1: SAVE_DIR={folder} has no {RECORD}, so its settings cannot be compared: "
            "resume it by hand, or start a new run with another RUN_NAME or SAVE_DIR"
        )
    old = json.loads(path.read_text())
    if diff := differences(old, new):
        raise InputError(
            f"RESUME=1: the settings differ from the run in SAVE_DIR={folder}: "
            + "; ".join(diff)
            + ": launch it as it was, or start a new run with another RUN_NAME or SAVE_DIR"
        )
    if not dry_run:
        _write(path, {**old, "launches": [*old.get("launches", []), _launch(resume=True)]})
    return f"resuming the run in {folder} with the settings recorded in {path}"


def _launch(*, resume: bool) -> dict[str, Any]:
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resume": resume}


def _write(path: Path, data: Mapping[str, Any]) -> None:
    """The record, replaced whole (a temporary sibling renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def read_record(save_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record in ``save_dir`` (None when there is none or it does not parse)."""
    try:
        data = json.loads((Path(save_dir) / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def wandb_run_id(save_dir: str | os.PathLike[str]) -> str:
    """The wandb run id of the run in ``save_dir``: the recorded one, else a new one (8
    lowercase hex digits, as wandb's ids are letters and digits)."""
    recorded = (read_record(save_dir) or {}).get("wandb_run_id")
    return str(recorded) if recorded else secrets.token_hex(4)


def version_warnings(commit: str | None, sglang: str | None) -> list[str]:
    """What differs from the versions rescue is tested against, one line each."""
    lines = []
    if commit is None:
        lines.append(
            f"cannot tell the Miles checkout's commit (not a git checkout?); rescue is tested "
            f"against {MILES.repository} {MILES.short}"
        )
    elif commit != MILES.commit:
        lines.append(
            f"the Miles checkout is at {commit[:8]}, rescue is tested against "
            f"{MILES.repository} {MILES.short}"
        )
    if sglang is None:
        lines.append(f"cannot tell the installed SGLang; rescue is tested against {SGLANG_VERSION}")
    elif sglang != SGLANG_VERSION:
        lines.append(f"the installed SGLang is {sglang}, rescue is tested against {SGLANG_VERSION}")
    return lines


def installed_version(python: str, package: str) -> str | None:
    """``package``'s version in the interpreter ``python`` (``None`` when not installed)."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swe_smith_tasks.run_record")
    sub = parser.add_subparsers(dest="step", required=True)
    c = sub.add_parser("check", help="the save directory against this launch's settings")
    c.add_argument("--save-dir", required=True)
    c.add_argument("--data", required=True, help="the prompt data file")
    c.add_argument("--env-json", required=True, help="the Ray runtime env JSON")
    c.add_argument("--miles-dir", required=True)
    c.add_argument("--resume", action="store_true")
    c.add_argument("--dry-run", action="store_true")
    c.add_argument("command", nargs=argparse.REMAINDER, help="-- the trainer's flags")
    v = sub.add_parser("versions", help="the Miles checkout and SGLang against the pins")
    v.add_argument("--miles-dir", required=True)
    v.add_argument("--python", required=True, help="the job's interpreter")
    w = sub.add_parser("wandb-id", help="the wandb run id of the run in the save directory")
    w.add_argument("--save-dir", required=True)
    args = parser.parse_args(argv)
    if args.step == "wandb-id":
        print(wandb_run_id(args.save_dir))
        return 0
    if args.step == "versions":
        for line in version_warnings(
            miles_commit(args.miles_dir), installed_version(args.python, "sglang")
        ):
            print(line)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = json.loads(args.env_json).get("env_vars", {})
    new = record(command, env, args.data, commit=miles_commit(args.miles_dir))
    try:
        print(check_save_dir(args.save_dir, new, resume=args.resume, dry_run=args.dry_run))
    except InputError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
