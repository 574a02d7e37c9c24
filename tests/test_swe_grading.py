"""Grading with the SWE-smith harness: from captured logs, and in a fresh stand-in container."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("swesmith")

from swe_stubs import (
    BUG_PATCH,
    GOLD_PATCH,
    IMAGE,
    METADATA,
    install_fake_docker,
    make_task_image,
)

from rescue.outcomes import Outcome, classify_exit_status
from swe_smith_tasks.grading import grade_from_log, grade_patch, task_instance
from swe_smith_tasks.sandbox import DockerContainer, ExecResult, SandboxError

ROWS = [
    json.loads(line)
    for line in (Path(__file__).parent / "fixtures" / "swe_smith_rows.jsonl")
    .read_text()
    .splitlines()
]
PATCH = "diff --git a/x.py b/x.py\n"


def harness_log(statuses: dict[str, str]) -> str:
    """A test_output.txt as the harness writes it: the ``set -x`` trace around pytest -v."""
    lines = [f"{test} {status}" for test, status in statuses.items()]
    return "\n".join(
        [
            "+ cd /testbed",
            "+ : '>>>>> Start Test Output'",
            "+ pytest --disable-warnings --color=no --tb=no --verbose",
            "============================= test session starts ==============================",
            *lines,
            "+ : '>>>>> End Test Output'",
            "",
        ]
    )


def verdict(grade):
    c = classify_exit_status(
        "Submitted",
        resolved=grade.resolved,
        eval_status=grade.status,
        patch_apply_failed=grade.patch_apply_failed,
    )
    return c.outcome


@pytest.mark.parametrize("row", ROWS[:2], ids=lambda r: r["instance_id"].split(".")[0])
def test_log_where_every_f2p_and_p2p_test_passes_is_resolved(row):
    log = harness_log({t: "PASSED" for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]})
    grade = grade_from_log(row, PATCH, log)
    assert (grade.status, grade.resolved) == ("completed", True)
    assert grade.report["f2p_passed"] == len(row["FAIL_TO_PASS"])
    assert grade.report["p2p_passed"] == len(row["PASS_TO_PASS"])
    assert verdict(grade) is Outcome.SOLVED


def test_one_failing_p2p_test_or_a_missing_test_is_unresolved():
    row = ROWS[0]
    statuses = {t: "PASSED" for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]}
    broken = {**statuses, row["PASS_TO_PASS"][0]: "FAILED"}
    grade = grade_from_log(row, PATCH, harness_log(broken))
    assert not grade.resolved and grade.report["failed_tests"] == [row["PASS_TO_PASS"][0]]
    assert verdict(grade) is Outcome.SUBMITTED_FAILURE
    missing = dict(statuses)
    del missing[row["FAIL_TO_PASS"][1]]
    grade = grade_from_log(row, PATCH, harness_log(missing))
    assert not grade.resolved and grade.report["f2p_failed"] == 1


def test_apply_failure_and_test_timeout_in_the_log_are_scored_failures():
    row = ROWS[1]
    apply_failed = grade_from_log(row, PATCH, ">>>>> Patch Apply Failed:\nerror: corrupt patch")
    assert (apply_failed.status, apply_failed.patch_apply_failed) == ("error", True)
    timed_out = grade_from_log(
        row, PATCH, harness_log({}) + "\n\n>>>>> Tests Timed Out: 90 seconds exceeded"
    )
    assert timed_out.status == "timeout" and not timed_out.resolved
    assert verdict(apply_failed) is verdict(timed_out) is Outcome.SUBMITTED_FAILURE
    grader_error = classify_exit_status("Submitted", resolved=False, eval_status="error")
    assert grader_error.outcome is Outcome.INFRA_NO_RESULT


def test_log_without_the_harness_markers_is_no_verdict_not_a_failure():
    """The tests never ran (the container died, the script was missing): no result."""
    row = ROWS[0]
    grade = grade_from_log(row, PATCH, "Error response from daemon: No such container: c1\n")
    assert (grade.status, grade.resolved, grade.patch_apply_failed) == ("error", False, False)
    assert grade.reason == "no_test_output" and "No such container" in grade.report["error"]
    assert verdict(grade) is Outcome.INFRA_NO_RESULT
    unfinished = harness_log({}).split("+ : '>>>>> End")[0]  # killed before the end marker
    assert verdict(grade_from_log(row, PATCH, unfinished)) is Outcome.INFRA_NO_RESULT


def test_captured_log_file_and_json_string_test_lists_are_accepted(tmp_path):
    row = ROWS[0]
    path = tmp_path / "test_output.txt"
    path.write_text(harness_log({t: "PASSED" for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]}))
    as_strings = {**row, "FAIL_TO_PASS": json.dumps(row["FAIL_TO_PASS"])}
    assert grade_from_log(as_strings, PATCH, path).resolved
    with pytest.raises(ValueError, match="instance_id"):
        task_instance({"repo": row["repo"]})


@pytest.fixture
def container(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    shim, root = install_fake_docker(tmp_path, monkeypatch)
    make_task_image(root / "images")
    c = DockerContainer(IMAGE, role="eval", executable=shim)
    yield c
    c.close()


def test_gold_patch_resolves_in_a_fresh_container_and_the_log_regrades_the_same(
    container, tmp_path
):
    grade = grade_patch(container, METADATA, GOLD_PATCH, log_dir=tmp_path / "logs")
    assert (grade.status, grade.resolved) == ("completed", True)
    assert grade.report["f2p_passed"] == 1 and grade.report["p2p_passed"] == 1
    log = tmp_path / "logs" / "test_output.txt"
    assert grade_from_log(METADATA, GOLD_PATCH, log).resolved


def test_edits_to_test_files_are_reverted_before_grading(container):
    # Rewrites the restored FAIL_TO_PASS test to pass with the bug still in place.
    hack = """diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -2,4 +2,4 @@ from calc import add


 def test_add():
-    assert add(2, 3) == 5
+    assert add(2, 3) == -1
"""
    grade = grade_patch(container, METADATA, hack)
    assert grade.status == "completed" and not grade.resolved
    assert grade.report["failed_tests"] == ["tests/test_calc.py::test_add"]


def test_patch_that_does_not_apply_and_empty_patch_are_scored_failures(container):
    bad = GOLD_PATCH.replace("return a - b", "return a ** b")
    grade = grade_patch(container, METADATA, bad)
    assert (grade.status, grade.patch_apply_failed) == ("error", True)
    assert verdict(grade) is Outcome.SUBMITTED_FAILURE
    empty = grade_patch(container, METADATA, "  \n")
    assert (empty.status, empty.resolved, empty.reason) == ("completed", False, "empty_patch")


def test_tests_running_past_the_timeout_are_a_scored_timeout(container):
    slow = GOLD_PATCH.replace(
        "+    return a + b", "+    __import__('time').sleep(30)\n+    return a + b"
    ).replace("@@ -1,5 +1,5 @@", "@@ -1,5 +1,6 @@")
    grade = grade_patch(container, METADATA, slow, timeout_s=2)
    assert (grade.status, grade.resolved) == ("timeout", False)
    assert verdict(grade) is Outcome.SUBMITTED_FAILURE


def test_eval_container_lost_before_the_tests_is_no_result(container, monkeypatch):
    real_exec = container.exec

    def exec_then_lost(command, **kwargs):
        if "eval.sh 2>&1" in command:  # the test run: the container is gone by now
            return ExecResult(1, "Error response from daemon: No such container: c1\n")
        return real_exec(command, **kwargs)

    monkeypatch.setattr(container, "exec", exec_then_lost)
    grade = grade_patch(container, METADATA, GOLD_PATCH)
    assert (grade.status, grade.reason) == ("error", "no_test_output")
    assert verdict(grade) is Outcome.INFRA_NO_RESULT


def test_eval_script_that_cannot_be_written_raises_sandbox_error(container, monkeypatch):
    real_exec = container.exec

    def exec_without_disk(command, **kwargs):
        if "> " in command and "eval.sh" in command:
            return ExecResult(1, "bash: /rescue/eval.sh: No space left on device\n")
        return real_exec(command, **kwargs)

    monkeypatch.setattr(container, "exec", exec_without_disk)
    with pytest.raises(SandboxError) as err:
        grade_patch(container, METADATA, GOLD_PATCH)
    assert err.value.reason == "grader_copy_failed"


def test_missing_task_branch_in_the_grader_raises_sandbox_error(container):
    with pytest.raises(SandboxError) as err:
        grade_patch(
            container, {**METADATA, "instance_id": METADATA["instance_id"] + "x"}, GOLD_PATCH
        )
    assert err.value.reason == "grader_checkout_failed"


@pytest.mark.parametrize("f2p", [None, []])
def test_a_task_without_fail_to_pass_tests_is_never_graded(f2p):
    row = {k: v for k, v in ROWS[0].items() if k != "FAIL_TO_PASS"}
    if f2p is not None:
        row["FAIL_TO_PASS"] = f2p
    log = harness_log({t: "PASSED" for t in row["PASS_TO_PASS"]})
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        grade_from_log(row, PATCH, log)
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        grade_patch(None, row, PATCH)


def test_a_docker_exec_failure_while_applying_is_the_graders_fault(container, monkeypatch):
    real_exec = container.exec

    def exec_then_daemon_restart(command, **kwargs):
        if "patch.diff" in command and "cat >" not in command:  # the first apply attempt
            container.close()  # the daemon restarted: the container is gone
        return real_exec(command, **kwargs)

    monkeypatch.setattr(container, "exec", exec_then_daemon_restart)
    with pytest.raises(SandboxError) as err:
        grade_patch(container, METADATA, GOLD_PATCH)
    assert err.value.reason == "grader_exec_failed" and "No such container" in str(err.value)


def test_an_apply_exec_that_cannot_run_is_the_graders_fault(container, monkeypatch):
    real_exec = container.exec

    def exec_fails(command, **kwargs):
        if "patch.diff" in command and "cat >" not in command:
            return ExecResult(-1, "OSError: [Errno 12] Cannot allocate memory")
        return real_exec(command, **kwargs)

    monkeypatch.setattr(container, "exec", exec_fails)
    with pytest.raises(SandboxError) as err:
        grade_patch(container, METADATA, GOLD_PATCH)
    assert err.value.reason == "grader_exec_failed"


def test_tests_killed_before_the_timeout_are_the_graders_fault(container):
    """Exit 137 long before the profile timeout: the OOM killer or the daemon, not the agent."""
    killer = (
        "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/conftest.py\n@@ -0,0 +1,2 @@\n+import os, signal\n"
        "+os.kill(os.getppid(), signal.SIGKILL)\n"
    )
    with pytest.raises(SandboxError) as err:
        grade_patch(container, METADATA, GOLD_PATCH + killer, timeout_s=60)
    assert err.value.reason == "eval_killed"
    assert classify_exit_status("Submitted", eval_status="error").outcome is Outcome.INFRA_NO_RESULT


KILLER = (
    "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/conftest.py\n@@ -0,0 +1,2 @@\n+import os, signal\n"
    "+os.kill(os.getppid(), signal.SIGKILL)\n"
)


def test_tests_the_containers_memory_limit_killed_are_the_patchs_failure(container):
    """Exit 137 before the timeout, and the container's memory cgroup counts an OOM kill:
    the tests under the patch exhausted the fixed memory (``memory.events``, cgroup v2)."""
    folder = next(p for p in (Path(os.environ["FAKE_DOCKER_ROOT"]) / "containers").iterdir())
    (folder / "cgroup" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    grade = grade_patch(container, METADATA, GOLD_PATCH + KILLER, timeout_s=60)
    assert (grade.status, grade.resolved, grade.reason) == ("completed", False, "tests_oom")
    c = classify_exit_status(
        "Submitted", resolved=False, eval_status=grade.status, grader_reason=grade.reason
    )
    assert (c.outcome, c.reason) == (Outcome.SUBMITTED_FAILURE, "tests_oom")


def test_an_eval_container_its_memory_limit_killed_is_the_patchs_failure(container, monkeypatch):
    real_exec = container.exec
    folder = next(p for p in (Path(os.environ["FAKE_DOCKER_ROOT"]) / "containers").iterdir())

    def exec_then_oom(command, **kwargs):
        if "eval.sh 2>&1" in command:  # docker stops the container: PID 1 was the victim
            (folder / "state.json").write_text('{"running": false, "oom_killed": true}')
        return real_exec(command, **kwargs)

    monkeypatch.setattr(container, "exec", exec_then_oom)
    grade = grade_patch(container, METADATA, GOLD_PATCH)
    assert (grade.status, grade.resolved, grade.reason) == ("completed", False, "tests_oom")


def test_the_reference_solution_is_the_bug_patch_in_reverse(container):
    """What ``rescue swe validate`` grades: SWE-smith's ``patch`` field applied reversed."""
    grade = grade_patch(container, METADATA, BUG_PATCH, reverse=True)
    assert (grade.status, grade.resolved) == ("completed", True)


def test_the_bug_patch_applied_forward_does_not_resolve(container):
    """The bug patch is already in the buggy tree: swesmith's `patch --batch` would reverse
    it (fixing the bug); rescue grades it as a patch that does not apply."""
    grade = grade_patch(container, METADATA, BUG_PATCH)
    assert not grade.resolved
    assert (grade.status, grade.patch_apply_failed, grade.reason) == (
        "error",
        True,
        "patch_already_applied",
    )
