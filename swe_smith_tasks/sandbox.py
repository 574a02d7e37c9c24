"""Containers of a SWE-smith task image: the agent's sandbox and the grader's fresh container.

Specification
-------------
- Every container this package starts is named ``CONTAINER_PREFIX + <role>-<12 hex>``
  (``rescue-swe-agent-…``, ``rescue-swe-eval-…``) and labelled ``CONTAINER_LABEL``, so a
  reaper finds what a crashed trainer left behind by name prefix. Containers run
  ``sleep <lifetime>`` without ``--rm``: a container that dies stays, so ``docker inspect``
  can say why (``State.OOMKilled``); ``close`` removes it, and an orphan stops by itself at
  the end of its sleep for the reaper (``rescue swe reap``) to remove.
- ``Container.close`` removes the container synchronously (``docker rm -f``) and is
  idempotent; callers call it in ``finally``.
- ``checkout_task`` puts the task state in the work tree (``git checkout <instance_id>``:
  the bug, with the FAIL_TO_PASS test files removed) and, with ``hide_history``, replaces
  the repository by a one-commit repository holding exactly the tracked files. The branch
  history (``git show HEAD~1``, ``git log -p``) would give the agent the bug diff and the
  removed tests; ``git diff`` still works for the submission.
- ``cut_network`` disconnects the container from every network once the task is checked
  out (``docker network disconnect``; a checkout may need ``git fetch``): the agent's
  commands cannot reach the network (to fetch the upstream fix), and it is checked that no
  network is left. The grader's container is a fresh one and keeps its network.
- Every step runs through one executable (``docker``, or what ``MSWEA_DOCKER_EXECUTABLE``
  names): the stand-in used by the tests exercises the same code path.
- ``LocalContainer`` is the same interface on a copy of a directory (no isolation, no
  network cut): for development without Docker and for the tests, where images are
  directories ``<images>/<image name with / and : as _>/testbed``.

- ``state()`` says whether the container runs (``docker inspect``), died of its memory
  limit (``oom``), stopped otherwise, or is gone. A command that fails with a daemon error
  (``DAEMON_ERROR``: no such container, not running, daemon unreachable) in a container
  that no longer runs is a lost container (``loss_reason``): ``sandbox_oom`` when the
  container died of its fixed memory limit (its processes exhausted it: the agent's doing,
  a scored failure), else ``container_lost`` (removed, the daemon down or restarted:
  infrastructure). The agent's own commands cannot kill PID 1 (the kernel ignores signals
  a namespace's processes send its init unless it handles them, and SIGKILL always), and a
  full disk fails the agent's commands, which it sees as observations; so the memory limit
  is how an agent breaks its own sandbox.
- ``limits`` are the ``docker run`` resource flags every container gets
  (``AgentSettings.docker_limits``: fixed ``--cpus``, ``--memory`` and ``--pids-limit``,
  the same in the pilot, every arm and the grader); ``run_args`` come after them and win.

Failures to start a container (``image_pull`` when the image is missing and cannot be
pulled, else ``container_start``), check out the task or cut its network, and a lost
container, raise ``SandboxError``; the agent books it by its reason
(``rescue.outcomes.REASONS``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Name prefix of every container this package starts (the reaper's filter).
CONTAINER_PREFIX = "rescue-swe-"
#: Label on every container this package starts.
CONTAINER_LABEL = "rescue-swe=1"
#: Work tree of the task inside a SWE-smith image.
WORKDIR = "/testbed"
#: Scratch folder for the grader's files inside a container.
SCRATCH = "/rescue"
#: What ``docker run`` prints when the image is not there and cannot be pulled.
PULL_ERROR = re.compile(
    r"Unable to find image|pull access denied|manifest unknown|repository does not exist"
)
#: What the docker client prints when the container or the daemon is gone.
DAEMON_ERROR = re.compile(
    r"No such container|is not running|Cannot connect to the Docker daemon"
    r"|Error response from daemon"
)


class SandboxError(RuntimeError):
    """A container could not be started or prepared, or was lost; ``reason`` is a label of
    ``rescue.outcomes.REASONS`` (infrastructure, except ``sandbox_oom``)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class ExecResult:
    """Exit code and combined stdout/stderr of one command; ``timed_out`` if it was killed."""

    returncode: int
    output: str
    timed_out: bool = False


def container_name(role: str) -> str:
    """A fresh container name ``rescue-swe-<role>-<12 hex>``."""
    return f"{CONTAINER_PREFIX}{role}-{uuid.uuid4().hex[:12]}"


class DockerContainer:
    """A running container of ``image``, driven through the docker command line.

    ``executable`` defaults to ``$MSWEA_DOCKER_EXECUTABLE`` or ``docker``; ``run_args`` are
    extra ``docker run`` arguments (e.g. ``--cpus 2 --memory 8g``); ``lifetime_s`` bounds
    how long an orphan lives; ``start_timeout_s`` bounds ``docker run`` including an
    implicit pull.
    """

    workdir = WORKDIR
    scratch = SCRATCH

    def __init__(
        self,
        image: str,
        *,
        role: str,
        executable: str | None = None,
        run_args: tuple[str, ...] = (),
        limits: tuple[str, ...] = (),
        lifetime_s: float = 7200,
        start_timeout_s: float = 300,
    ) -> None:
        self.image = image
        self.executable = executable or os.environ.get("MSWEA_DOCKER_EXECUTABLE") or "docker"
        self.name = container_name(role)
        self.id: str | None = None
        cmd = [
            self.executable,
            *("run", "-d", "--name", self.name, "--label", CONTAINER_LABEL),
            *("-w", WORKDIR, *limits, *run_args, image, "sleep", f"{int(lifetime_s)}s"),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=start_timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.close()
            raise SandboxError("container_start", f"{image}: {e}") from e
        if proc.returncode != 0 or not proc.stdout.strip():
            self.close()
            said = (proc.stderr or proc.stdout)[-500:]
            reason = "image_pull" if PULL_ERROR.search(said) else "container_start"
            raise SandboxError(reason, f"{image}: {said}")
        self.id = proc.stdout.strip().splitlines()[-1]

    def exec(
        self,
        command: str,
        *,
        timeout_s: float,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``bash -c command`` in the work tree; ``input`` goes to its stdin."""
        cmd = [self.executable, "exec", *(["-i"] if input is not None else []), "-w", WORKDIR]
        for key, value in (env or {}).items():
            cmd += ["-e", f"{key}={value}"]
        cmd += [self.id or self.name, "bash", "-c", command]
        return _run(cmd, timeout_s=timeout_s, input=input)

    def state(self) -> str:
        """``running``, ``oom`` (stopped, killed by its memory limit), ``exited`` or ``gone``
        (``docker inspect``; ``gone`` when it cannot say)."""
        result = _run(
            [
                self.executable,
                *("inspect", "--format", "{{.State.Running}} {{.State.OOMKilled}}"),
                self.id or self.name,
            ],
            timeout_s=60,
        )
        words = result.output.split()
        if result.returncode != 0 or len(words) != 2:
            return "gone"
        if words[0] == "true":
            return "running"
        return "oom" if words[1] == "true" else "exited"

    def alive(self) -> bool:
        """Whether the container still runs."""
        return self.state() == "running"

    def cut_network(self) -> None:
        """Disconnect the container from every network; ``SandboxError("network_cut_failed")``
        when one is left."""
        ref = self.id or self.name
        networks = self._networks()
        for network in networks:
            _run([self.executable, "network", "disconnect", "--force", network, ref], timeout_s=60)
        left = self._networks()
        if left:
            raise SandboxError("network_cut_failed", f"still connected to {', '.join(left)}")

    def _networks(self) -> list[str]:
        fmt = "{{range $name, $net := .NetworkSettings.Networks}}{{$name}} {{end}}"
        result = _run(
            [self.executable, "inspect", "--format", fmt, self.id or self.name], timeout_s=60
        )
        if result.returncode != 0:
            raise SandboxError("network_cut_failed", result.output[-500:])
        return [n for n in result.output.split() if n]

    def mini_environment(self, *, timeout_s: int, env: dict[str, str]) -> Any:
        """mini-swe-agent's ``DockerEnvironment`` bound to this container (it starts none)."""
        return _bound_docker_environment()(
            image=self.image,
            cwd=WORKDIR,
            timeout=timeout_s,
            executable=self.executable,
            env=env,
            interpreter=["bash", "-c"],
            container_id=self.id,
            sandbox=self,
        )

    def close(self) -> None:
        """Remove the container (``rm -f``); safe to call twice or after a failed start."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        # On failure the container still dies with its sleep, and the reaper finds it.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [self.executable, "rm", "-f", self.name], capture_output=True, timeout=60
            )


class LocalContainer:
    """The container interface on a private copy of ``<images>/<image>/testbed`` (no isolation)."""

    def __init__(self, image: str, *, role: str, images: str | os.PathLike[str]) -> None:
        self.image = image
        self.name = container_name(role)
        source = Path(images) / image_dir_name(image) / "testbed"
        if not source.is_dir():
            raise SandboxError("container_start", f"no local image {image!r} at {source}")
        self.root = Path(tempfile.mkdtemp(prefix=self.name + "-"))
        self.workdir = str(self.root / "testbed")
        self.scratch = str(self.root / "rescue")
        shutil.copytree(source, self.workdir, symlinks=True)

    def exec(
        self,
        command: str,
        *,
        timeout_s: float,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``bash -c command`` in the copy's work tree."""
        return _run(
            ["bash", "-c", command],
            timeout_s=timeout_s,
            input=input,
            cwd=self.workdir,
            env={**os.environ, **(env or {})},
        )

    def state(self) -> str:
        """``running`` while the copy exists, else ``gone``."""
        return "running" if Path(self.workdir).is_dir() else "gone"

    def alive(self) -> bool:
        """Whether the copy still exists."""
        return self.state() == "running"

    def cut_network(self) -> None:
        """Nothing to cut: a local copy has no isolation."""

    def mini_environment(self, *, timeout_s: int, env: dict[str, str]) -> Any:
        """mini-swe-agent's ``LocalEnvironment`` in the copy's work tree."""
        from minisweagent.environments.local import LocalEnvironment

        env = {k: v for k, v in env.items() if k != "BASH_ENV"}  # the image's rc file
        return LocalEnvironment(cwd=self.workdir, timeout=timeout_s, env=env)

    def close(self) -> None:
        """Delete the copy."""
        shutil.rmtree(self.root, ignore_errors=True)


Container = DockerContainer | LocalContainer


def loss_reason(container: Container, result_output: str, returncode: int) -> str | None:
    """Why a failed command failed with its container (rule in the docstring): ``None`` when
    the container still runs (the failure is the command's), ``sandbox_oom`` or
    ``container_lost``."""
    if returncode == 0 or not DAEMON_ERROR.search(result_output):
        return None
    state = container.state()
    if state == "running":
        return None
    return "sandbox_oom" if state == "oom" else "container_lost"


def lost(container: Container, result_output: str, returncode: int) -> bool:
    """Whether a failed command failed because its container no longer runs."""
    return loss_reason(container, result_output, returncode) is not None


def image_dir_name(image: str) -> str:
    """Folder name of a local image: ``/`` and ``:`` replaced by ``_``."""
    return image.replace("/", "_").replace(":", "_")


def checkout_command(instance_id: str) -> str:
    """Shell command that checks out the task branch, fetching it first when it is missing."""
    iid = shlex.quote(instance_id)
    return (
        f"git checkout -q -f {iid} 2>&1 || "
        f"{{ git fetch -q origin {iid} 2>&1 && git checkout -q -f {iid} 2>&1; }}"
    )


def checkout_task(
    container: Container, instance_id: str, *, hide_history: bool = True, timeout_s: float = 300
) -> None:
    """Check out the task branch and, by default, replace the git history by one commit.

    Raises ``SandboxError("checkout_failed")`` when the branch cannot be checked out (a
    fetch is tried first when it is missing) and ``SandboxError("hide_history_failed")``.
    """
    result = container.exec(checkout_command(instance_id), timeout_s=timeout_s)
    if result.returncode != 0:
        raise SandboxError("checkout_failed", f"{instance_id}: {result.output[-500:]}")
    if not hide_history:
        return
    # One commit holding exactly the tracked files: no branches, reflog, objects or remote.
    script = (
        'set -e; list=$(mktemp); git ls-files -z > "$list"; rm -rf .git; '
        'git init -q; git add -f --pathspec-from-file="$list" --pathspec-file-nul; '
        'rm -f "$list"; git -c user.name=task -c user.email=task@localhost '
        "commit -q --no-verify --allow-empty -m task"
    )
    result = container.exec(script, timeout_s=timeout_s)
    if result.returncode != 0:
        raise SandboxError("hide_history_failed", result.output[-500:])


def _run(
    cmd: list[str],
    *,
    timeout_s: float,
    input: str | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> ExecResult:
    try:
        proc = subprocess.run(
            cmd,
            input=input,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout_s,
            cwd=cwd,
            env=env,
        )
    except subprocess.TimeoutExpired as e:
        out = e.output.decode("utf-8", "replace") if isinstance(e.output, bytes) else e.output
        return ExecResult(-1, out or "", timed_out=True)
    except OSError as e:
        return ExecResult(-1, f"{type(e).__name__}: {e}")
    return ExecResult(proc.returncode, proc.stdout)


@functools.cache
def _bound_docker_environment() -> type:
    """``DockerEnvironment`` that attaches to a container started here and never removes it."""
    from minisweagent.environments.docker import DockerEnvironment, DockerEnvironmentConfig

    class BoundDockerEnvironmentConfig(DockerEnvironmentConfig):
        container_id: str

    class BoundDockerEnvironment(DockerEnvironment):
        def __init__(self, *, sandbox: DockerContainer, **kwargs: Any) -> None:
            self.sandbox = sandbox
            super().__init__(config_class=BoundDockerEnvironmentConfig, **kwargs)

        def _start_container(self) -> None:
            self.container_id = self.config.container_id

        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
            """mini-swe-agent's ``execute``; a command that failed in a lost container raises
            (``container_lost``, or ``sandbox_oom`` when its memory limit killed it)."""
            output = super().execute(action, cwd, timeout=timeout)
            text = str(output.get("output", ""))
            if reason := loss_reason(self.sandbox, text, int(output["returncode"])):
                raise SandboxError(reason, text[-500:])
            return output

        def cleanup(self) -> None:
            """The container belongs to ``DockerContainer``, which removes it."""

    return BoundDockerEnvironment
