"""The stand-in docker under concurrent calls: a container another call is creating or
removing never breaks a call on a different container (a real daemon does not)."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rescue.rehearsal.standins import docker as stand_in
from rescue.rehearsal.standins.tasks import IMAGE, docker_state, make_task_image, write_docker_shim


def test_exec_and_ps_survive_containers_coming_and_going(tmp_path):
    root = docker_state(tmp_path / "docker")
    make_task_image(root / "images")
    shim = str(write_docker_shim(tmp_path / "bin"))
    env = {**os.environ, "FAKE_DOCKER_ROOT": str(root)}

    def docker(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([shim, *args], env=env, capture_output=True, text=True, timeout=60)

    keep = docker("run", "-d", "--name", "keep", IMAGE, "sleep", "1").stdout.strip()
    assert keep

    def churn(k: int) -> list[int]:
        codes = []
        for j in range(3):
            cid = docker("run", "-d", "--name", f"churn-{k}-{j}", IMAGE).stdout.strip()
            codes.append(docker("rm", "-f", cid).returncode)
        return codes

    def use(_: int) -> list[int]:
        return [docker("exec", "keep", "git", "status", "--short").returncode for _ in range(3)]

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(churn, k) for k in range(3)] + [
            pool.submit(use, k) for k in range(3)
        ]
        codes = [c for f in futures for c in f.result()]
    assert codes and all(c == 0 for c in codes)
    assert docker("ps", "-a", "--format", "{{.Names}}").stdout.split() == ["keep"]
    assert not list((root / "staging").glob("rm-*"))


def test_a_container_removed_while_listed_is_skipped_not_an_error(tmp_path, monkeypatch):
    for cid in ("a", "b"):
        (tmp_path / "containers" / cid).mkdir(parents=True)
        (tmp_path / "containers" / cid / "name").write_text(f"name-{cid}")
    monkeypatch.setattr(stand_in, "ROOT", tmp_path)
    read = Path.read_text

    def removed_meanwhile(self: Path, *args, **kwargs) -> str:
        if self.parent.name == "b":  # listed, then removed by a concurrent `docker rm`
            raise FileNotFoundError(self)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", removed_meanwhile)
    assert set(stand_in._containers()) == {"a", "name-a"}
