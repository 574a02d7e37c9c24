"""The pinned Miles and slime commits (``rescue.frameworks``) and the integration tests'
check of the sources they are given: which commit a folder is at, the warning on another
commit, and the failure when a package the framework imports is missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import miles_env
import pytest
from miles_env import FrameworkCommitWarning, commit_mismatch, source_commit

from rescue.frameworks import MILES, SLIME, PinnedFramework

ROOT = Path(__file__).resolve().parents[1]
OTHER = "0123abcd"


def git_checkout(path: Path) -> str:
    """A git repository at ``path`` with one commit; its commit."""
    path.mkdir(parents=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    (path / "setup.py").write_text("")
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "c"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env)
    done = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


# ── the pinned commits ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("framework", [MILES, SLIME], ids=lambda f: f.package)
def test_pinned_commits_are_full_commits_and_name_the_archives(framework):
    assert re.fullmatch(r"[0-9a-f]{40}", framework.commit)
    assert framework.archive == f"{framework.package}-{framework.commit[:8]}.tar.gz"


def test_the_docs_state_the_pinned_commits():
    readme = (ROOT / "docs" / "development.md").read_text()
    for framework in (MILES, SLIME):
        assert f"{framework.repository}@{framework.commit}" in readme


# ── which commit a source folder is at ───────────────────────────────────────────────────


@needs_git
def test_a_git_checkout_is_at_its_head(tmp_path):
    head = git_checkout(tmp_path / "miles")
    assert source_commit(tmp_path / "miles") == (head, "git rev-parse HEAD")
    pinned_here = PinnedFramework("Miles", "miles", "radixark/miles", head)
    assert commit_mismatch(pinned_here, tmp_path / "miles") is None


@needs_git
def test_a_git_checkout_at_another_commit_names_both_commits(tmp_path):
    # Named like the pinned archive, but git knows better.
    src = tmp_path / f"miles-{MILES.short}"
    head = git_checkout(src)
    message = commit_mismatch(MILES, src)
    assert message is not None
    assert head in message and MILES.commit in message and "git rev-parse HEAD" in message


@pytest.mark.parametrize("name", [f"miles-{MILES.short}", f"miles-{MILES.commit}"])
def test_an_unpacked_archive_is_at_the_commit_in_its_folder_name(tmp_path, name):
    (tmp_path / name).mkdir()
    assert commit_mismatch(MILES, tmp_path / name) is None


def test_an_unpacked_archive_of_another_commit_names_both_commits(tmp_path):
    src = tmp_path / f"slime-{OTHER}"
    src.mkdir()
    assert source_commit(src) == (OTHER, f"its folder name slime-{OTHER}")
    message = commit_mismatch(SLIME, src)
    assert message is not None and OTHER in message and SLIME.commit in message


@needs_git
def test_a_folder_without_a_commit_cannot_be_told_even_inside_a_git_repository(tmp_path):
    git_checkout(tmp_path / "project")
    src = tmp_path / "project" / "miles"
    src.mkdir()
    commit, _ = source_commit(src)
    assert commit is None
    message = commit_mismatch(MILES, src)
    assert message is not None and message.startswith("cannot tell which Miles commit")
    assert MILES.commit in message


# ── what the integration tests do with a source ─────────────────────────────────────────


@pytest.fixture
def fresh_checks(monkeypatch):
    """No source checked yet in this process, and sys.path restored afterwards."""
    monkeypatch.setattr(miles_env, "_checked", set())
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_the_warning_is_given_once_per_source(tmp_path, fresh_checks):
    src = tmp_path / f"miles-{OTHER}"
    src.mkdir()
    with pytest.warns(FrameworkCommitWarning, match=f"{OTHER}.*{MILES.commit}"):
        miles_env.warn_unless_pinned(MILES, str(src))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        miles_env.warn_unless_pinned(MILES, str(src))


def test_require_miles_warns_on_sources_at_another_commit(tmp_path, monkeypatch, fresh_checks):
    src = tmp_path / f"miles-{OTHER}"
    src.mkdir()
    monkeypatch.setattr(miles_env, "MILES_SRC", str(src))
    monkeypatch.setattr(miles_env, "_require_dependencies", lambda variable: None)
    monkeypatch.setattr(miles_env, "stub_sglang_for_miles", lambda: None)
    with pytest.warns(FrameworkCommitWarning, match=MILES.commit):
        assert miles_env.require_miles() == str(src)


def test_require_slime_is_silent_on_sources_at_the_pinned_commit(
    tmp_path, monkeypatch, fresh_checks
):
    src = tmp_path / f"slime-{SLIME.short}"
    src.mkdir()
    monkeypatch.setattr(miles_env, "SLIME_SRC", str(src))
    monkeypatch.setattr(miles_env, "_require_dependencies", lambda variable: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert miles_env.require_slime() == str(src)


@pytest.mark.parametrize(
    ("variable", "require"),
    [("MILES_SRC", miles_env.require_miles), ("SLIME_SRC", miles_env.require_slime)],
)
def test_a_source_given_with_a_package_missing_fails_naming_it(
    tmp_path, monkeypatch, fresh_checks, variable, require
):
    monkeypatch.setattr(miles_env, variable, str(tmp_path))
    monkeypatch.setattr(miles_env, "FRAMEWORK_DEPENDENCIES", ("os", "no_such_package_0123"))
    with pytest.raises(BaseException) as raised:  # a skip would pass unnoticed
        require()
    assert raised.type is pytest.fail.Exception
    assert f"{variable} is set but no_such_package_0123 not installed" in str(raised.value)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("variable", ["MILES_SRC", "SLIME_SRC"])
def test_make_integration_rejects_a_source_that_is_not_a_folder(tmp_path, variable):
    venv = tmp_path / "venv"
    venv.mkdir()
    # Up-to-date stamps, so the target checks its variables without installing anything.
    makefile = (ROOT / "Makefile").read_text()
    (extras,) = re.findall(r"^INTEGRATION_EXTRAS := (\S+)$", makefile, re.M)
    assert re.search(r"^integration: \$\(VENV\)/\.stamp-\$\(INTEGRATION_EXTRAS\)$", makefile, re.M)
    target = f".stamp-{extras}"
    for stamp in (".stamp-base", target):
        (venv / stamp).touch()
    # a make of its own, as typed (under `make test-all` the environment says MAKELEVEL=1,
    # and make checks a make run by a make no more)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "integration", f"VENV={venv}",
         f"{variable}={tmp_path / 'absent'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    # refused while make reads the Makefile, before any prerequisite is installed
    said = f"{variable}={tmp_path / 'absent'} is not a directory"
    assert said in result.stderr and "nothing was installed" in result.stderr, result.stderr
