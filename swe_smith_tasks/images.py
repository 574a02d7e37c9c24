"""The task images, present before any trial: pulled, and reported per task.

Specification
-------------
``pull_images(tasks, ...)`` takes the distinct images of the tasks (``metadata.image``,
else ``image_name``), checks each with ``docker image inspect`` and pulls a missing one
with ``docker pull`` (one at a time, each under ``timeout_s``, default 1800 s), with a
progress bar. Every task gets exactly one ``ImageStatus``: ``present``, ``pulled`` or
``failed`` with Docker's message. ``write_report`` writes them to ``images.jsonl`` (one a
line); ``unavailable`` reads that file back as ``instance_id -> error`` for the failed ones.

The pilot skips a task whose image failed (decision ``no_image``): a pull that fails is
the registry's or the network's, reported per task, never booked as a trial's fault. An
implicit pull inside a trial's ``docker run`` is thereby never needed.

The Docker command is the reaper's (``reaper.docker_command``: ``$RESCUE_DOCKER``, else
``$MSWEA_DOCKER_EXECUTABLE``, else ``docker``; it may carry words, ``sudo docker``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from swe_smith_tasks.reaper import docker_command

#: The report's file name in the pilot directory.
REPORT = "images.jsonl"
STATUSES = ("present", "pulled", "failed")


@dataclass(frozen=True)
class ImageStatus:
    """One task's image and what became of it."""

    instance_id: str
    image: str
    status: str
    error: str = ""


def task_image(metadata: Mapping[str, Any]) -> str:
    """The image of a task's metadata (``image``, else ``image_name``; empty when none)."""
    return str(metadata.get("image") or metadata.get("image_name") or "")


def pull_images(
    tasks: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    docker: str | Sequence[str] | None = None,
    timeout_s: float = 1800,
    progress: bool = True,
) -> list[ImageStatus]:
    """Check and pull the images of ``tasks`` (``(instance_id, metadata)`` pairs), in order.

    A task without an image is ``failed`` ("no image in the task's metadata").
    """
    cmd = docker_command(docker)
    by_image: dict[str, list[str]] = {}
    statuses: dict[str, ImageStatus] = {}
    for iid, metadata in tasks:
        image = task_image(metadata)
        if image:
            by_image.setdefault(image, []).append(iid)
        else:
            statuses[iid] = ImageStatus(iid, "", "failed", "no image in the task's metadata")
    bar = _bar(len(by_image), progress)
    for image, iids in by_image.items():
        status, error = _ensure(cmd, image, timeout_s)
        for iid in iids:
            statuses[iid] = ImageStatus(iid, image, status, error)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return [statuses[iid] for iid, _ in tasks]


def _ensure(cmd: list[str], image: str, timeout_s: float) -> tuple[str, str]:
    if _call([*cmd, "image", "inspect", image], 120)[0] == 0:
        return "present", ""
    code, output = _call([*cmd, "pull", image], timeout_s)
    if code == 0:
        return "pulled", ""
    return "failed", " ".join(output.split())[-500:] or f"docker pull exited {code}"


def _call(argv: list[str], timeout_s: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return -1, f"no answer within {timeout_s:g} s"
    except OSError as e:
        return -1, f"{type(e).__name__}: {e}"
    return proc.returncode, (proc.stderr or "") + (proc.stdout or "")


def _bar(total: int, enabled: bool) -> Any:
    if not enabled or not total:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="images", unit="image", file=sys.stderr)


def write_report(path: str | os.PathLike[str], statuses: Sequence[ImageStatus]) -> Path:
    """Write ``images.jsonl`` (one status a line); returns its path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(asdict(s)) + "\n" for s in statuses))
    return p


def unavailable(path: str | os.PathLike[str]) -> dict[str, str]:
    """``instance_id -> error`` of the tasks whose image failed, from an ``images.jsonl``
    (``{}`` when the file does not exist)."""
    p = Path(path)
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("status") == "failed":
                out[str(row["instance_id"])] = str(row.get("error", ""))
    return out


def render(statuses: Sequence[ImageStatus]) -> str:
    """A few lines for the terminal: counts, then each failed task with Docker's message."""
    images: dict[str, str] = {}
    for s in statuses:
        images.setdefault(s.image, s.status)
    counts = {k: sum(v == k for v in images.values()) for k in STATUSES}
    failed = [s for s in statuses if s.status == "failed"]
    lines = [
        f"{len(images)} image(s) for {len(statuses)} task(s): {counts['present']} present, "
        f"{counts['pulled']} pulled, {counts['failed']} failed"
    ]
    lines += [f"  {s.instance_id}: {s.image or '-'}: {s.error}" for s in failed[:20]]
    if len(failed) > 20:
        lines.append(f"  ... and {len(failed) - 20} more (see {REPORT})")
    return "\n".join(lines)


def main(args: Any) -> int:
    """``rescue swe pull`` (``swe_smith_tasks.cli``): pull, write the report, print it; 1 when
    no task's image is available."""
    from swe_smith_tasks import pilot

    tasks = pilot.sample_tasks(pilot.load_tasks(args.tasks), args.max_tasks, args.seed)
    statuses = pull_images(
        [(t.instance_id, t.metadata) for t in tasks],
        docker=args.docker,
        timeout_s=args.timeout,
        progress=not args.no_progress,
    )
    path = write_report(f"{args.out}/{REPORT}", statuses)
    print(render(statuses))
    failed = sum(s.status == "failed" for s in statuses)
    if statuses and failed == len(statuses):
        print(f"rescue swe pull: no task image is available ({path})", file=sys.stderr)
        return 1
    if failed:
        print(f"{failed} task(s) will be skipped by the pilot (their image failed; {path})")
    return 0
