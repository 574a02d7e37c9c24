"""A stand-in ``docker`` executable for the rehearsal and the tests (no Docker daemon needed).

Run as ``python -m rescue.rehearsal.docker ARGS`` (``tasks.write_docker_shim`` writes an
executable that does so).

State lives under ``$FAKE_DOCKER_ROOT``: an image ``NAME`` is the folder
``images/<NAME with / and : as _>/testbed``; a container is ``containers/<id>/`` holding a
copy of it (``testbed/``), its ``name`` and a ``rescue/`` scratch folder, built under
``staging/`` and moved in whole, so concurrent calls never see half a container. Paths ``/testbed``
and ``/rescue`` in ``exec`` commands and ``-w`` map into the container folder.

Supported: ``run -d --name N [-w D] [--rm] [--label L] [other flags] IMAGE CMD…`` (prints
the id; an unknown image exits 125 like a failed pull), ``exec [-i] [-w D] [-e K=V]… ID
CMD…``, ``rm -f ID…``, ``stop ID``, ``ps -a --format {{.Names}}`` (``--filter name=P``),
``inspect --format {{.State.Running}} ID`` (``true``; an unknown container exits 1 as docker's
"No such object").
Every call is appended to ``calls.log`` (one JSON list per line). ``BASH_ENV`` is dropped.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(os.environ.get("FAKE_DOCKER_ROOT", "/nonexistent"))
_VALUE_FLAGS = {"--name", "-w", "--label", "--cpus", "--memory", "-m", "-e", "--platform", "-v"}


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


def _map(text: str, folder: Path) -> str:
    return text.replace("/testbed", str(folder / "testbed")).replace(
        "/rescue", str(folder / "rescue")
    )


def main(argv: list[str]) -> int:
    with open(ROOT / "calls.log", "a") as log:
        log.write(json.dumps(argv) + "\n")
    command, args = argv[0], argv[1:]
    if command == "run":
        name, i = "", 0
        while args[i].startswith("-"):
            if args[i] in _VALUE_FLAGS:
                name = args[i + 1] if args[i] == "--name" else name
                i += 2
            else:
                i += 1
        image = args[i]
        source = ROOT / "images" / image.replace("/", "_").replace(":", "_") / "testbed"
        if not source.is_dir():
            print(f"Unable to find image '{image}' locally: pull access denied", file=sys.stderr)
            return 125
        cid = uuid.uuid4().hex
        staging = ROOT / "staging" / cid  # built aside, then appears whole (one rename)
        staging.parent.mkdir(exist_ok=True)
        shutil.copytree(source, staging / "testbed", symlinks=True)
        (staging / "rescue").mkdir()
        (staging / "name").write_text(name or cid)
        staging.rename(ROOT / "containers" / cid)
        print(cid)
        return 0
    if command == "exec":
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
        cmd = [_map(a, folder) for a in args[i + 1 :]]
        return subprocess.run(cmd, cwd=_map(cwd, folder), env=env, stdin=stdin).returncode
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
        ref = args[-1]
        if ref not in _containers():
            print(f"Error: No such object: {ref}", file=sys.stderr)
            return 1
        print("true")
        return 0
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
