"""Remove the Docker containers SWE-smith trials left behind.

Specification
-------------
A container is *ours* when its name starts with one of the prefixes (default
``sandbox.CONTAINER_PREFIX``, ``rescue-swe-``: the agent's sandboxes and the grader's
fresh containers; and ``swesmith.eval.``, the containers of swesmith's own harness,
``swesmith.eval.<run_id>.<instance_id>``). ``reap`` lists every container (``docker ps -a``),
keeps ours (optionally only those created at least ``older_than`` seconds ago) and removes
them with ``docker rm -f``, in batches. Nothing else is touched.

The Docker command is, first found: the ``docker`` argument, ``$RESCUE_DOCKER``,
``$MSWEA_DOCKER_EXECUTABLE`` (the one mini-swe-agent uses), ``docker``. It may carry
arguments (``"sudo docker"``). An engine that cannot be reached, or a command that is
not there, raises ``DockerUnavailable`` with Docker's own message; a container that
fails to be removed is reported, not raised.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from rescue.errors import InputError
from swe_smith_tasks.sandbox import CONTAINER_PREFIX

#: Name prefixes of the containers this package (and swesmith's harness) starts.
DEFAULT_PREFIXES = (CONTAINER_PREFIX, "swesmith.eval.")
#: Environment variables naming the Docker command, in order of precedence.
DOCKER_ENV_VARS = ("RESCUE_DOCKER", "MSWEA_DOCKER_EXECUTABLE")
#: Containers removed per ``docker rm -f`` call.
BATCH = 50


class DockerUnavailable(RuntimeError):
    """The Docker command is missing or its engine cannot be reached."""


@dataclass(frozen=True)
class Container:
    """One listed container."""

    id: str
    name: str
    created: datetime | None = None


@dataclass
class ReapReport:
    """What ``reap`` found and did."""

    matched: list[Container] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> Docker's message
    too_young: int = 0
    dry_run: bool = False

    def render(self) -> str:
        """A few lines for the terminal."""
        verb = "would remove" if self.dry_run else "removed"
        names = [c.name for c in self.matched] if self.dry_run else self.removed
        lines = [f"{verb} {len(names)} container(s)"]
        lines += [f"  {n}" for n in names]
        if self.too_young:
            lines.append(f"kept {self.too_young} container(s) younger than --older-than")
        for name, msg in self.failed.items():
            lines.append(f"failed to remove {name}: {msg}")
        return "\n".join(lines)


def docker_command(
    docker: str | Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> list[str]:
    """The Docker command as argv: ``docker``, else ``$RESCUE_DOCKER``, ``$MSWEA_DOCKER_EXECUTABLE``, ``docker``."""
    if docker is None:
        env = os.environ if env is None else env
        docker = next((env[v] for v in DOCKER_ENV_VARS if env.get(v)), "docker")
    argv = shlex.split(docker) if isinstance(docker, str) else list(docker)
    if not argv:
        raise InputError("docker command is empty; set RESCUE_DOCKER or pass --docker")
    return argv


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise DockerUnavailable(
            f"docker command {argv[0]!r} not found; set RESCUE_DOCKER (or "
            "MSWEA_DOCKER_EXECUTABLE) or pass --docker"
        ) from None
    except subprocess.TimeoutExpired:
        raise DockerUnavailable(
            f"'{shlex.join(argv[:3])} …' did not answer within {timeout:g}s; is the Docker engine up?"
        ) from None


def _parse_created(text: str) -> datetime | None:
    """Docker's ``{{.CreatedAt}}`` (``2025-01-31 12:00:00 +0000 UTC``) as an aware datetime."""
    try:
        return datetime.strptime(" ".join(text.split()[:3]), "%Y-%m-%d %H:%M:%S %z")
    except ValueError:
        return None


def list_containers(
    prefixes: Sequence[str] = DEFAULT_PREFIXES,
    *,
    docker: str | Sequence[str] | None = None,
    timeout: float = 60.0,
) -> list[Container]:
    """Containers (running or not) whose name starts with one of ``prefixes``.

    ``prefixes`` default: ``DEFAULT_PREFIXES``. ``timeout``: seconds for ``docker ps``
    (default 60). Raises ``DockerUnavailable`` when the engine cannot be reached.
    """
    if not prefixes or any(not p for p in prefixes):
        raise InputError(f"prefixes={list(prefixes)!r}: give at least one non-empty name prefix")
    argv = [
        *docker_command(docker),
        "ps",
        "-a",
        "--no-trunc",
        "--format",
        "{{.ID}}\t{{.Names}}\t{{.CreatedAt}}",
    ]
    proc = _run(argv, timeout)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        raise DockerUnavailable(f"cannot list containers with {argv[0]!r}: {msg}")
    found = []
    for line in proc.stdout.splitlines():
        parts = line.strip().split("\t")
        if len(parts) < 2:
            continue
        cid, names = parts[0], parts[1]
        created = _parse_created(parts[2]) if len(parts) > 2 else None
        for name in names.split(","):
            name = name.strip().lstrip("/")
            if name.startswith(tuple(prefixes)):
                found.append(Container(cid, name, created))
                break
    return found


def reap(
    prefixes: Sequence[str] = DEFAULT_PREFIXES,
    *,
    docker: str | Sequence[str] | None = None,
    dry_run: bool = False,
    older_than: float = 0.0,
    now: datetime | None = None,
    timeout: float = 120.0,
) -> ReapReport:
    """Remove our containers; returns what was matched, removed and not removed.

    ``prefixes``: name prefixes (default ``rescue-swe-``, ``swesmith.eval.``).
    ``dry_run``: list only (default False). ``older_than``: seconds; keep containers
    created less long ago, and those whose age Docker did not report (default 0: remove
    all). ``timeout``: seconds per Docker call (default 120).
    """
    if older_than < 0:
        raise InputError(f"older_than={older_than}: must be >= 0 seconds")
    report = ReapReport(dry_run=dry_run)
    now = now or datetime.now(timezone.utc)
    for c in list_containers(prefixes, docker=docker, timeout=timeout):
        if older_than > 0 and (c.created is None or (now - c.created).total_seconds() < older_than):
            report.too_young += 1
            continue
        report.matched.append(c)
    if dry_run:
        return report
    argv = docker_command(docker)
    for i in range(0, len(report.matched), BATCH):
        batch = report.matched[i : i + BATCH]
        proc = _run([*argv, "rm", "-f", *(c.id for c in batch)], timeout)
        if proc.returncode == 0:
            report.removed += [c.name for c in batch]
            continue
        # One call failed: retry one by one to tell which containers are left.
        for c in batch:
            one = _run([*argv, "rm", "-f", c.id], timeout)
            msg = (one.stderr or one.stdout).strip()
            if one.returncode == 0 or "no such container" in msg.lower():  # gone is gone
                report.removed.append(c.name)
            else:
                report.failed[c.name] = msg or f"exit status {one.returncode}"
    return report
