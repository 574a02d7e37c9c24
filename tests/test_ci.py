"""CI's integration step (``.ci/integration``) and its rule on skipped tests
(``.ci/skips.py``), short of running the integration tests themselves."""

from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rescue.frameworks import MILES

ROOT = Path(__file__).resolve().parents[1]
SKIPS = runpy.run_path(str(ROOT / ".ci" / "skips.py"))

needs_bash_and_git = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("git") is None, reason="needs bash and git"
)


def integration_step(vendor: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "integration")],
        env={**os.environ, "VENDOR_DIR": str(vendor), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_bash_and_git
def test_without_the_archives_folder_the_step_says_it_did_not_run(tmp_path):
    result = integration_step(tmp_path / "absent")
    assert result.returncode == 0, result.stderr
    assert f"integration tests not run: no framework archives at {tmp_path / 'absent'}" in (
        result.stdout
    )


@needs_bash_and_git
def test_a_missing_archive_of_a_pinned_commit_fails_naming_it(tmp_path):
    result = integration_step(tmp_path)
    assert result.returncode == 1
    assert f"{tmp_path / MILES.archive} not found" in result.stdout
    assert MILES.commit in result.stdout


def test_ci_runs_every_test_and_the_integration_step():
    """CI runs make test-all (every tier: no marker left out), then the integration step."""
    run = (ROOT / ".ci" / "run").read_text()
    assert "\nmake test-all " in run and "\nbash .ci/integration\n" in run
    makefile = (ROOT / "Makefile").read_text()
    test_all = re.search(r"^test-all: (.*)\n\t(.*)$", makefile, re.M)
    assert test_all[1].endswith("+agent") and test_all[2] == "$(PY) -m pytest $(PYTEST_ARGS)"
    test = re.search(r"^test: .*\n\t(.*)$", makefile, re.M)[1]
    assert '-m "not slow and not agent"' in test


def junit(tmp_path: Path, cases: str) -> str:
    path = tmp_path / "junit.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return str(path)


def case(test: str, body: str = "") -> str:
    classname, name = test.split("::")
    return f'<testcase classname="{classname}" name="{name}" time="0.1">{body}</testcase>'


def skip(reason: str) -> str:
    return f'<skipped type="pytest.skip" message="{reason}">{reason}</skipped>'


def test_a_run_with_every_test_passed_passes(tmp_path, capsys):
    assert SKIPS["main"]([junit(tmp_path, case("tests.a::test_x") + case("tests.a::test_y"))]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "integration: 2 passed, 0 failed, 0 skipped"


def test_any_skip_fails_and_prints_its_reason(tmp_path, capsys):
    xml = junit(tmp_path, case("tests.a::test_x") + case("tests.b::test_y", skip("no shellcheck")))
    assert SKIPS["main"]([xml]) == 1
    out = capsys.readouterr().out
    assert "ci: skipped: tests.b::test_y: no shellcheck" in out
    assert out.splitlines()[-1] == "integration: 1 passed, 0 failed, 1 skipped"


def test_a_run_where_no_test_ran_fails(tmp_path, capsys):
    assert SKIPS["main"]([junit(tmp_path, case("tests.a::test_x", skip("no Miles")))]) == 1
    assert "no integration test ran" in capsys.readouterr().out


def test_a_failed_test_fails(tmp_path):
    xml = junit(tmp_path, case("tests.a::test_x", '<failure message="boom"/>'))
    assert SKIPS["main"]([xml]) == 1


def test_a_hung_test_fails_after_the_configured_timeout(request):
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) == 300


def fake_vendor(tmp_path: Path) -> Path:
    """Archives named like the pinned ones, each holding one folder with a file."""
    from rescue.frameworks import MEGATRON, SLIME

    vendor = tmp_path / "vendor"
    vendor.mkdir()
    for fw in (MILES, SLIME, MEGATRON):
        folder = tmp_path / fw.archive.removesuffix(".tar.gz")
        folder.mkdir()
        (folder / "README").write_text(fw.package)
        subprocess.run(
            ["tar", "czf", str(vendor / fw.archive), "-C", str(tmp_path), folder.name], check=True
        )
    return vendor


def fake_make(tmp_path: Path, body: str = "") -> tuple[Path, Path]:
    """A `make` on PATH that records its arguments and writes a passing JUnit file (``body``:
    shell run first, with the target in ``$1``)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "make-calls"
    bin_dir.mkdir()
    script = bin_dir / "make"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        f"{body}\n"
        'for a in "$@"; do case $a in PYTEST_ARGS=--junitxml=*) x=${a#PYTEST_ARGS=--junitxml=};\n'
        "  x=${x%% *}\n"
        '  echo \'<testsuites><testsuite><testcase classname="t" name="x"/></testsuite>'
        '</testsuites>\' > "$x";; esac; done\n'
    )
    script.chmod(0o755)
    return bin_dir, calls


@needs_bash_and_git
@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_integration_step_runs_the_rehearsal_unless_ci_rehearsal_is_0(tmp_path, setting):
    vendor = fake_vendor(tmp_path)
    bin_dir, calls = fake_make(tmp_path)
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "integration")],
        env={
            **os.environ,
            "VENDOR_DIR": str(vendor),
            "CI_REHEARSAL": setting,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = calls.read_text().splitlines()
    targets = [line.split()[0] for line in lines]
    if setting == "1":  # the rehearsal's environment installs beside the integration tests
        assert targets[0] == "integration-env" and targets[-1] == "rehearsal-test"
        assert sorted(targets[1:3]) == ["integration", "rehearsal-env"] and len(targets) == 4
        integration, rehearsal = (line.split() for line in lines if not line.endswith("-env"))
        assert rehearsal[1] == integration[1]  # the same unpacked Miles
        assert rehearsal[1].startswith("MILES_SRC=") and "/miles-" in rehearsal[1]
        assert rehearsal[2].startswith("MEGATRON_SRC=") and "/megatron-" in rehearsal[2]
        assert Path(rehearsal[2].split("=", 1)[1]).name.startswith("megatron-")
    else:
        assert targets == ["integration-env", "integration"]
        assert "rehearsal not run: CI_REHEARSAL=0" in result.stdout


def ci_integration(tmp_path: Path, make_body: str) -> subprocess.CompletedProcess:
    bin_dir, _ = fake_make(tmp_path, make_body)
    return integration_step(fake_vendor(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")


@needs_bash_and_git
def test_a_failed_install_of_the_rehearsal_environment_fails_the_step_with_its_log(tmp_path):
    result = ci_integration(
        tmp_path, '[ "$1" = rehearsal-env ] && { echo "pip: no matching sglang"; exit 2; }'
    )
    assert result.returncode == 2
    assert "pip: no matching sglang" in result.stdout
    assert "ci: the rehearsal environment's install failed (make rehearsal-env, exit 2)" in (
        result.stdout
    )
    assert "rehearsal-test" not in (tmp_path / "make-calls").read_text()


@needs_bash_and_git
def test_a_failing_integration_run_stops_the_install_beside_it(tmp_path):
    pid_file = tmp_path / "install.pid"
    result = ci_integration(
        tmp_path,
        f'[ "$1" = rehearsal-env ] && {{ sleep 120 & echo $! > {pid_file}; wait; }}\n'
        f'[ "$1" = integration ] && {{ while [ ! -s {pid_file} ]; do sleep 0.1; done; exit 1; }}',
    )
    assert result.returncode == 1 and "ci: make integration failed (exit 1)" in result.stdout
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the install's process outlived the step"


@needs_bash_and_git
def test_an_archive_of_another_commit_than_the_pinned_one_fails_naming_both(tmp_path):
    from rescue.frameworks import MEGATRON

    vendor = fake_vendor(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "README").write_text("another tree")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    other = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    archive = subprocess.run([*git, "archive", "--prefix=megatron-x/", "HEAD"], capture_output=True,
                             check=True).stdout  # fmt: skip
    import gzip

    (vendor / MEGATRON.archive).write_bytes(gzip.compress(archive))
    bin_dir, _ = fake_make(tmp_path)
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "integration")],
        env={**os.environ, "VENDOR_DIR": str(vendor), "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"records commit {other.strip()}, not the pinned megatron commit {MEGATRON.commit}" in (
        result.stdout
    )
