"""A stand-in ``docker`` executable for the rehearsal and the tests (no Docker daemon needed).

Run as ``python -m rescue.rehearsal.standins.docker ARGS`` (``tasks.write_docker_shim`` writes an
executable that does so).

State lives under ``$FAKE_DOCKER_ROOT``: an image ``NAME`` is the folder
``images/<NAME with / and : as _>/testbed`` (``registry/`` holds the images a ``pull`` can
fetch); a container is ``containers/<id>/`` holding a copy of it (``testbed/``), its
``name``, its ``state.json`` (``running``, ``oom_killed``), its ``networks`` (one a line),
a ``rescue/`` scratch folder and ``cgroup/memory.events``, built under ``staging/`` and
moved in whole, so concurrent calls never see half a container. Paths ``/testbed``,
``/rescue`` and ``/sys/fs/cgroup`` in ``exec`` commands and ``-w`` map into the container
folder.

What it mirrors of the docker CLI (and the daemon behind it):

- ``run -d --name N [-w D] [--network NET] [--label L] [other flags] IMAGE CMD…`` prints the
  id; an unknown image exits 125 like a failed implicit pull ("Unable to find image …
  pull access denied"). Without ``--rm`` a container stays until ``rm``; ``--network
  none`` starts it without a network, otherwise it is on ``bridge``.
- ``exec [-i] [-w D] [-e K=V]… ID CMD…`` runs the command; an unknown container prints
  docker's "Error response from daemon: No such container: ID" and a stopped one "Error
  response from daemon: container ID is not running", both exit 1. A container without
  any network runs the command in a network namespace of its own (``unshare -rn``), as a
  disconnected container has only a loopback that nothing listens on (where user
  namespaces are not allowed, it runs the command as it is: ``can_isolate()`` says which).
- ``inspect --format F ID`` fills ``{{.State.Running}}``, ``{{.State.OOMKilled}}`` and a
  ``range`` over ``.NetworkSettings.Networks`` (the names, space-separated); an unknown
  container exits 1 with docker's "Error: No such object: ID".
- ``network disconnect [--force] NET ID`` takes the container off ``NET``.
- ``image inspect IMAGE`` exits 0 when the image is present, 1 ("Error: No such image");
  ``pull IMAGE`` copies it from ``registry/`` or exits 1 with "Error response from daemon:
  pull access denied …".
- ``rm -f ID…``, ``stop ID``, ``ps -a --format {{.Names}}`` (``--filter name=P``).

Tests make a container die as docker reports it by writing its ``state.json``
(``{"running": false, "oom_killed": true}`` is a container its memory limit killed).
Every call is appended to ``calls.log`` (one JSON list per line), and its wall time to
``timing.log``. ``BASH_ENV`` is dropped.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(os.environ.get("FAKE_DOCKER_ROOT", "/nonexistent"))
_VALUE_FLAGS = {
    *("--name", "-w", "--label", "--cpus", "--memory", "-m", "-e", "--platform", "-v"),
    *("--network", "--pids-limit", "--shm-size"),
}
_CGROUP = "/sys/fs/cgroup"


def _named() -> list[tuple[str, str, Path]]:
    """(id, name, folder) of each container. One another call is removing is skipped:
    calls run concurrently, as against a real daemon."""
    out = []
    for folder in (ROOT / "containers").glob("*"):
        try:
            name = (folder / "name").read_text().strip()
        except OSError:
            continue
        out.append((folder.name, name, folder))
    return out


def _containers() -> dict[str, Path]:
    """Container id and name -> folder."""
    out = {}
    for cid, name, folder in _named():
        out[cid] = out[name] = folder
    return out


def _state(folder: Path) -> dict:
    try:
        return json.loads((folder / "state.json").read_text())
    except (OSError, ValueError):
        return {"running": True, "oom_killed": False}


def _networks(folder: Path) -> list[str]:
    try:
        return (folder / "networks").read_text().split()
    except OSError:
        return []


def _map(text: str, folder: Path) -> str:
    return (
        text.replace("/testbed", str(folder / "testbed"))
        .replace("/rescue", str(folder / "rescue"))
        .replace(_CGROUP, str(folder / "cgroup"))
    )


def can_isolate() -> bool:
    """Whether a disconnected container's commands really run without a network here."""
    return _can_unshare()


@functools.cache
def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def _image_dir(base: str, image: str) -> Path:
    return ROOT / base / image.replace("/", "_").replace(":", "_") / "testbed"


def _run(args: list[str]) -> int:
    name, networks, i = "", ["bridge"], 0
    while args[i].startswith("-"):
        if args[i] in _VALUE_FLAGS:
            if args[i] == "--name":
                name = args[i + 1]
            elif args[i] == "--network":
                networks = [] if args[i + 1] == "none" else [args[i + 1]]
            i += 2
        else:
            i += 1
    image = args[i]
    source = _image_dir("images", image)
    if not source.is_dir():
        print(f"Unable to find image '{image}' locally: pull access denied", file=sys.stderr)
        return 125
    cid = uuid.uuid4().hex
    staging = ROOT / "staging" / cid  # built aside, then appears whole (one rename)
    staging.parent.mkdir(exist_ok=True)
    shutil.copytree(source, staging / "testbed", symlinks=True)
    (staging / "rescue").mkdir()
    (staging / "cgroup").mkdir()
    (staging / "cgroup" / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    (staging / "name").write_text(name or cid)
    (staging / "state.json").write_text(json.dumps({"running": True, "oom_killed": False}))
    (staging / "networks").write_text("".join(f"{n}\n" for n in networks))
    staging.rename(ROOT / "containers" / cid)
    print(cid)
    return 0


def _exec(args: list[str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != "BASH_ENV"}
    cwd, stdin, i = "/testbed", subprocess.DEVNULL, 0
    while args[i].startswith("-"):
        if args[i] == "-i":
            stdin, i = None, i + 1
        elif args[i] == "-w":
            cwd, i = args[i + 1], i + 2
        elif args[i] == "-e":
            key, _, value = args[i + 1].partition("=")
            if key != "BASH_ENV":
                env[key] = value
            i += 2
        else:
            i += 1
    folder = _containers().get(args[i])
    if folder is None:
        print(f"Error response from daemon: No such container: {args[i]}", file=sys.stderr)
        return 1
    if not _state(folder).get("running", True):
        print(f"Error response from daemon: container {args[i]} is not running", file=sys.stderr)
        return 1
    cmd = [_map(a, folder) for a in args[i + 1 :]]
    if not _networks(folder) and _can_unshare():
        cmd = ["unshare", "-rn", *cmd]
    return subprocess.run(cmd, cwd=_map(cwd, folder), env=env, stdin=stdin).returncode


def _inspect(args: list[str]) -> int:
    ref = args[-1]
    folder = _containers().get(ref)
    if folder is None:
        print(f"Error: No such object: {ref}", file=sys.stderr)
        return 1
    fmt = args[args.index("--format") + 1] if "--format" in args else "{{.State.Running}}"
    if ".NetworkSettings.Networks" in fmt:
        print(" ".join(_networks(folder)))
        return 0
    state = _state(folder)
    text = fmt.replace("{{.State.Running}}", str(state.get("running", True)).lower())
    print(text.replace("{{.State.OOMKilled}}", str(state.get("oom_killed", False)).lower()))
    return 0


def _network(args: list[str]) -> int:
    words = [a for a in args[1:] if not a.startswith("-")]
    if args[0] != "disconnect" or len(words) != 2:
        print(f"fake docker: unsupported network call {args!r}", file=sys.stderr)
        return 2
    network, ref = words
    folder = _containers().get(ref)
    if folder is None:
        print(f"Error response from daemon: No such container: {ref}", file=sys.stderr)
        return 1
    (folder / "networks").write_text("".join(f"{n}\n" for n in _networks(folder) if n != network))
    return 0


def _pull(image: str) -> int:
    source = _image_dir("registry", image)
    if not source.is_dir():
        print(
            f"Error response from daemon: pull access denied for {image}, repository does not "
            "exist or may require 'docker login'",
            file=sys.stderr,
        )
        return 1
    target = _image_dir("images", image)
    if not target.is_dir():
        shutil.copytree(source, target, symlinks=True)
    print(f"Status: Downloaded newer image for {image}")
    return 0


def main(argv: list[str]) -> int:
    with open(ROOT / "calls.log", "a") as log:
        log.write(json.dumps(argv) + "\n")
    command, args = argv[0], argv[1:]
    if command == "run":
        return _run(args)
    if command == "exec":
        return _exec(args)
    if command in ("rm", "stop"):
        known = _containers()
        for ref in [a for a in args if not a.startswith("-")]:
            if ref in known:
                gone = ROOT / "staging" / f"rm-{uuid.uuid4().hex}"
                gone.parent.mkdir(exist_ok=True)
                try:
                    known[ref].rename(gone)  # leaves containers/ whole, in one step
                except OSError:
                    continue  # removed by a concurrent call
                shutil.rmtree(gone, ignore_errors=True)
        return 0
    if command == "inspect":
        return _inspect(args)
    if command == "network":
        return _network(args)
    if command == "image" and args[:1] == ["inspect"]:
        if _image_dir("images", args[-1]).is_dir():
            print("[{}]")
            return 0
        print(f"Error: No such image: {args[-1]}", file=sys.stderr)
        return 1
    if command == "pull":
        return _pull(args[-1])
    if command == "ps":
        prefix = ""
        for a, b in itertools.pairwise(args):
            if a == "--filter" and b.startswith("name="):
                prefix = b[len("name=") :]
        for _, name, _ in _named():
            if name.startswith(prefix):
                print(name)
        return 0
    print(f"fake docker: unsupported command {command!r}", file=sys.stderr)
    return 2


def timed(argv: list[str]) -> int:
    """``main``, with its wall time appended to ``timing.log`` (command, seconds and, for
    ``exec``, the start of the command run): the rehearsal's profile reads it."""
    start = time.monotonic()
    try:
        return main(argv)
    finally:
        what = argv[0] if argv else ""
        if what == "exec" and argv[-1:]:
            what = f"exec {argv[-1][:60]}"
        with open(ROOT / "timing.log", "a") as log:
            log.write(json.dumps({"call": what, "s": round(time.monotonic() - start, 4)}) + "\n")


if __name__ == "__main__":
    sys.exit(timed(sys.argv[1:]))
