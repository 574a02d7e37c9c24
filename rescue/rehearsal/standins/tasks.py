"""Tiny SWE-smith-shaped tasks for the stand-in ``docker`` (``rescue.rehearsal.standins.docker``).

- ``make_task_image(images, image, instance_id)`` writes a git repository as the image
  ``image`` (``<images>/<image as folder>/testbed``): ``main`` holds the correct code and
  both test files; the branch ``instance_id`` has the bug commit and then the commit that
  deletes the FAIL_TO_PASS test file, as SWE-smith task branches do.
- ``write_docker_shim(folder)`` writes an executable ``docker`` that runs the stand-in
  with this interpreter; its state root is ``$FAKE_DOCKER_ROOT``.
- ``task_metadata(...)`` is the prompt metadata ``swe_smith_tasks.agent.run`` reads.

The bug: ``calc.add`` subtracts. ``FIX`` repairs it, ``WRONG_FIX`` replaces it by a
multiplication (a patch that applies but does not resolve the task).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

INSTANCE_ID = "pallets__click.fde47b4b.func_pm_op_swap__tiny0001"
REPO = "swesmith/pallets__click.fde47b4b"
IMAGE = "swebench/swesmith.x86_64.pallets_1776_click.fde47b4b"
F2P = ["tests/test_calc.py::test_add"]
P2P = ["tests/test_other.py::test_mul"]
PROBLEM = "calc.add(2, 3) returns -1 instead of 5."

FIX = "sed -i 's/return a - b/return a + b/' calc.py"
WRONG_FIX = "sed -i 's/return a - b/return a * b/' calc.py"
RUN_TESTS = "python -m pytest -q tests"
MAKE_PATCH = "git diff -- calc.py > patch.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"
GOLD_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b
+    return a + b


 def mul(a, b):
"""

#: The task's ``patch`` field as SWE-smith ships it: the bug (its reverse is the reference fix).
BUG_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a + b
+    return a - b


 def mul(a, b):
"""


def task_metadata(
    instance_id: str = INSTANCE_ID, image: str = IMAGE, repo: str = REPO
) -> dict[str, Any]:
    """The prompt metadata of one task (the fields ``rescue swe prepare`` writes)."""
    return {
        "instance_id": instance_id,
        "repo": repo,
        "image": image,
        "FAIL_TO_PASS": list(F2P),
        "PASS_TO_PASS": list(P2P),
    }


METADATA = task_metadata()


def image_folder(images: Path, image: str) -> Path:
    """Where the stand-in keeps the work tree of ``image``."""
    return Path(images) / image.replace("/", "_").replace(":", "_") / "testbed"


def _git(cwd: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def make_task_image(images: Path, image: str = IMAGE, instance_id: str = INSTANCE_ID) -> Path:
    """Write the tiny task repository as ``image``; returns its work tree."""
    repo = image_folder(images, image)
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
    )
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    (repo / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (repo / "tests" / "test_other.py").write_text(
        "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
    )
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "checkout", "-q", "-b", instance_id)
    (repo / "calc.py").write_text((repo / "calc.py").read_text().replace("a + b", "a - b"))
    _git(repo, "commit", "-qam", "bug")
    _git(repo, "rm", "-q", "tests/test_calc.py")
    _git(repo, "commit", "-qm", "remove F2P tests")
    _git(repo, "checkout", "-q", "main")
    return repo


def write_docker_shim(folder: Path, python: str = sys.executable) -> Path:
    """An executable ``folder/docker`` running the stand-in with ``python``."""
    script = Path(__file__).with_name("docker.py")
    shim = Path(folder) / "docker"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec "{python}" "{script}" "$@"\n')
    shim.chmod(0o755)
    return shim


def docker_state(root: Path) -> Path:
    """Create the stand-in's state folders under ``root`` (images/, containers/)."""
    (Path(root) / "images").mkdir(parents=True, exist_ok=True)
    (Path(root) / "containers").mkdir(exist_ok=True)
    return Path(root)


def live_containers(root: Path) -> list[str]:
    """Names of the stand-in's containers that still exist."""
    return [
        (c / "name").read_text() for c in (root / "containers").glob("*") if (c / "name").exists()
    ]


def docker_calls(root: Path) -> list[list[str]]:
    """Every call made to the stand-in, in order."""
    log = root / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
