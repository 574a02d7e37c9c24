"""The container reaper, against a stand-in ``docker`` executable that records its calls."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from swe_smith_tasks import cli as swe_cli
from swe_smith_tasks.reaper import (
    DEFAULT_PREFIXES,
    DockerUnavailable,
    docker_command,
    list_containers,
    reap,
)
from swe_smith_tasks.sandbox import container_name

STAND_IN = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_DOCKER_DOWN"):
    sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                     "Is the docker daemon running?\\n")
    sys.exit(1)
if args[0] == "ps":
    sys.stdout.write(open(os.environ["FAKE_DOCKER_PS"]).read())
elif args[0] == "rm":
    bad = [a for a in args[2:] if a in os.environ.get("FAKE_DOCKER_RM_FAIL", "").split(",")]
    gone = [a for a in args[2:] if a in os.environ.get("FAKE_DOCKER_RM_GONE", "").split(",")]
    if bad or gone:
        sys.stderr.write("Error response from daemon: " + (
            "removal of container %s is already in progress" % bad[0] if bad
            else "No such container: %s" % gone[0]) + "\\n")
        sys.exit(1)
"""

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
PS = [
    ("aaa111", "rescue-swe-oauthlib-0-3f2a", "2026-01-01 11:00:00 +0000 UTC"),  # 1 h old
    (
        "bbb222",
        "swesmith.eval.run7.oauthlib__oauthlib.1fd52536.x__y",
        "2026-01-01 11:59:30 +0000 UTC",
    ),
    ("ccc333", "minisweagent-1a2b3c4d", "2026-01-01 10:00:00 +0000 UTC"),  # not ours
    ("ddd444", "postgres", "2025-12-01 10:00:00 +0000 UTC"),
    ("eee555", "my-rescue-swe-copy", "2025-12-01 10:00:00 +0000 UTC"),  # prefix, not substring
]


@pytest.fixture
def docker(tmp_path, monkeypatch):
    """Path of the stand-in; its calls are read back with ``calls()``."""
    exe = tmp_path / "docker"
    exe.write_text(STAND_IN.format(python=sys.executable))
    exe.chmod(0o755)
    log, ps = tmp_path / "docker.log", tmp_path / "ps.txt"
    ps.write_text("".join("\t".join(row) + "\n" for row in PS))
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    monkeypatch.setenv("FAKE_DOCKER_PS", str(ps))
    for var in ("RESCUE_DOCKER", "MSWEA_DOCKER_EXECUTABLE", "FAKE_DOCKER_DOWN"):
        monkeypatch.delenv(var, raising=False)
    return exe


def calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "docker.log"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_reap_removes_only_containers_with_our_prefixes(docker, tmp_path):
    report = reap(docker=str(docker))
    assert report.removed == [PS[0][1], PS[1][1]]
    assert report.failed == {}
    ps_call, rm_call = calls(tmp_path)
    assert ps_call[:2] == ["ps", "-a"] and "{{.Names}}" in ps_call[-1]
    assert rm_call == ["rm", "-f", "aaa111", "bbb222"]


def test_dry_run_lists_and_removes_nothing(docker, tmp_path):
    report = reap(docker=str(docker), dry_run=True)
    assert [c.name for c in report.matched] == [PS[0][1], PS[1][1]]
    assert report.removed == []
    assert [c[0] for c in calls(tmp_path)] == ["ps"]
    assert "would remove 2 container(s)" in report.render()


def test_custom_prefixes(docker, tmp_path):
    found = list_containers(("minisweagent-",), docker=str(docker))
    assert [(c.id, c.name) for c in found] == [("ccc333", "minisweagent-1a2b3c4d")]
    with pytest.raises(ValueError, match="non-empty name prefix"):
        list_containers(("",), docker=str(docker))


def test_older_than_keeps_young_containers(docker, tmp_path):
    report = reap(docker=str(docker), older_than=600, now=NOW)
    assert report.removed == [PS[0][1]]  # the 30 s old eval container stays
    assert report.too_young == 1


def test_docker_command_comes_from_the_environment(docker, tmp_path, monkeypatch):
    env = {"RESCUE_DOCKER": "sudo docker", "MSWEA_DOCKER_EXECUTABLE": "podman"}
    assert docker_command(env=env) == ["sudo", "docker"]
    assert docker_command(env={"MSWEA_DOCKER_EXECUTABLE": "podman"}) == ["podman"]
    assert docker_command(env={}) == ["docker"]
    assert docker_command("x y", env=env) == ["x", "y"]
    monkeypatch.setenv("MSWEA_DOCKER_EXECUTABLE", str(docker))
    assert reap().removed == [PS[0][1], PS[1][1]]  # no argument: the stand-in from the env


def test_unreachable_engine_is_a_clear_error(docker, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_DOWN", "1")
    with pytest.raises(DockerUnavailable, match="Cannot connect to the Docker daemon"):
        reap(docker=str(docker))
    with pytest.raises(DockerUnavailable, match="not found"):
        reap(docker=str(tmp_path / "no-such-docker"))


def test_failed_removal_is_reported_per_container(docker, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_RM_FAIL", "aaa111")
    monkeypatch.setenv("FAKE_DOCKER_RM_GONE", "bbb222")
    report = reap(docker=str(docker))
    assert report.removed == [PS[1][1]]  # already gone counts as removed
    assert list(report.failed) == [PS[0][1]]
    assert "already in progress" in report.failed[PS[0][1]]


def test_many_containers_are_removed_in_batches(docker, tmp_path):
    rows = [(f"id{i:03d}", f"rescue-swe-t{i}", "2026-01-01 11:00:00 +0000 UTC") for i in range(120)]
    Path(os.environ["FAKE_DOCKER_PS"]).write_text("".join("\t".join(r) + "\n" for r in rows))
    report = reap(docker=str(docker))
    assert len(report.removed) == 120
    assert [len(c) - 2 for c in calls(tmp_path) if c[0] == "rm"] == [50, 50, 20]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    swe_cli.configure(parser)
    return parser.parse_args(list(argv))


def test_cli_reap(docker, tmp_path, monkeypatch, capsys):
    assert swe_cli.main(_parse("reap", "--docker", str(docker), "--dry-run")) == 0
    assert "would remove 2" in capsys.readouterr().out
    args = _parse(
        "reap", "--docker", str(docker), "--prefix", "postgres", "--prefix", "minisweagent-"
    )
    assert swe_cli.main(args) == 0
    assert calls(tmp_path)[-1] == ["rm", "-f", "ccc333", "ddd444"]
    monkeypatch.setenv("FAKE_DOCKER_DOWN", "1")
    assert swe_cli.main(_parse("reap", "--docker", str(docker))) == 1
    assert "Cannot connect to the Docker daemon" in capsys.readouterr().err


def test_default_prefixes_match_the_containers_trials_start():
    for role in ("agent", "eval"):
        assert container_name(role).startswith(DEFAULT_PREFIXES)
