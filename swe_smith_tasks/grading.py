"""Grading a submitted patch with the SWE-smith harness, in a fresh container or from a log.

Specification
-------------
``grade_patch`` follows the SWE-smith evaluation (``swesmith.harness.utils.
run_patch_in_container``) step by step, through the same docker executable as the sandbox
so that one stand-in covers both, in a container that never saw the agent:

1. ``git checkout <instance_id>`` (fetched first if the image lacks the branch) then
   ``git checkout HEAD~1``: the bug with the FAIL_TO_PASS test files restored.
2. The patch applied with the harness' commands in order (``git apply``, ``--reject``,
   ``patch --fuzz=5``); when all fail the patch did not apply (the agent's fault).
3. Every FAIL_TO_PASS and PASS_TO_PASS test file reverted (``git checkout -- files``):
   test edits do not count.
4. The profile's test command between the harness' start/end markers, under the
   profile's timeout.
5. The log graded by ``swesmith.harness.grading.get_eval_report``: resolved means every
   FAIL_TO_PASS and PASS_TO_PASS test passed (a test missing from the log failed).

``Grade.status`` is the harness' vocabulary: ``completed`` (a verdict), ``timeout`` (the
tests ran past the profile timeout: unresolved, a scored failure) and ``error`` (no
verdict: ``patch_apply_failed`` tells the agent's fault from a grader fault). A log
without both start/end markers (the eval container was lost, the script never ran) is an
``error`` with reason ``no_test_output``, never an unresolved verdict: swesmith's grader
would call it unresolved. An empty patch is graded unresolved without running anything:
the bug is still there.

What is the grader's fault, not the agent's (``SandboxError``, no verdict): a checkout
or a file copy that fails; a ``docker exec`` that fails while applying the patch
(``grader_exec_failed``: the exec could not run, or its container is gone) rather than
the patch not applying; a test run killed before the profile's timeout (exit 137) by
something else than the container's memory limit (``eval_killed``), or whose container
is gone (``eval_container_lost``). A test run that the container's fixed memory limit
killed (the container's cgroup counts an ``oom_kill``, or the container itself died of
it) is the patch's doing: unresolved, reason ``tests_oom``.

A patch that applies only in reverse (the tree already holds the change it describes) does
not apply: ``patch_apply_failed``, reason ``patch_already_applied``. swesmith's third
command (``patch --batch``) assumes such a patch was reversed by mistake and reverses it,
so the bug patch itself, submitted forward, would resolve its own task; rescue refuses it
before swesmith's commands run (checked with ``git apply --check``, both ways).

``reverse=True`` applies the patch in reverse, as the SWE-smith harness applies a
task's reference solution (its ``patch`` field is the bug; ``swesmith.harness.utils.
_apply_patch`` adds ``--reverse``): what ``rescue swe validate`` grades.

A task without FAIL_TO_PASS tests is refused (``ValueError``): with no test to fail, an
empty log would grade ``resolved``.
"""

from __future__ import annotations

import re
import shlex
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from swe_smith_tasks.sandbox import Container, SandboxError, checkout_command, loss_reason, lost

#: Failing test names kept in a grade's report (the full lists can hold hundreds).
MAX_LISTED_FAILURES = 20


@dataclass(frozen=True)
class Grade:
    """Verdict on one patch: harness status, resolved flag, and a compact report."""

    status: str
    resolved: bool
    patch_apply_failed: bool = False
    reason: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def as_eval_report(self) -> dict[str, Any]:
        """The ``eval_report`` the agent returns (what ``rescue.outcomes.classify`` reads)."""
        return {
            "status": self.status,
            "resolved": self.resolved,
            "patch_apply_failed": self.patch_apply_failed,
            "reason": self.reason,
            **self.report,
        }


def task_instance(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The SWE-smith instance dict the harness expects, from a prompt's metadata.

    Needs ``instance_id`` and a non-empty ``FAIL_TO_PASS``; ``repo`` defaults to the
    instance id's repo part; ``FAIL_TO_PASS``/``PASS_TO_PASS`` may be lists or JSON strings
    (``PASS_TO_PASS`` default empty).
    """
    import json

    if not metadata.get("instance_id"):
        raise InputError("metadata['instance_id'] is required (a SWE-smith instance id)")
    instance = dict(metadata)
    instance_id = str(instance["instance_id"])
    instance.setdefault("repo", "swesmith/" + instance_id.rsplit(".", 1)[0])
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        tests = instance.get(key) or []
        if isinstance(tests, str):
            tests = json.loads(tests)
        if not isinstance(tests, list):
            raise InputError(f"metadata[{key!r}] must be a list of test names, got {tests!r}")
        instance[key] = [str(t) for t in tests]
    if not instance["FAIL_TO_PASS"]:
        raise InputError(
            f"metadata['FAIL_TO_PASS'] of {instance_id} is missing or empty: a task needs at "
            "least one failing test to be graded (rescue swe prepare skips such rows)"
        )
    return instance


def profile_of(instance: Mapping[str, Any]) -> Any:
    """The SWE-smith repo profile of an instance (test command, test files, timeout, parser)."""
    from swesmith.profiles import registry

    try:
        return registry.get_from_inst(dict(instance))
    except KeyError as e:
        raise InputError(
            f"metadata['repo']={instance.get('repo')!r} has no SWE-smith profile"
        ) from e


def grade_from_log(instance: Mapping[str, Any], patch: str | None, log: str | Path) -> Grade:
    """Grade a captured test log (text or path) with ``get_eval_report``.

    The log is the harness' ``test_output.txt``: the ``set -x`` trace with the start/end
    markers. A log that says the patch failed to apply gives status ``error`` with
    ``patch_apply_failed``; one that says the tests timed out gives status ``timeout``; one
    without the start/end markers gives status ``error`` (``no_test_output``).
    """
    from swebench.harness.constants import APPLY_PATCH_FAIL, TESTS_TIMEOUT
    from swesmith.constants import TEST_OUTPUT_END, TEST_OUTPUT_START
    from swesmith.harness.grading import get_eval_report

    inst = task_instance(instance)
    if isinstance(log, Path):
        return grade_from_log(inst, patch, log.read_text(errors="replace"))
    if APPLY_PATCH_FAIL in log:
        return Grade("error", False, patch_apply_failed=True, reason="patch_apply_failed")
    if TESTS_TIMEOUT in log:
        return Grade("timeout", False, reason="tests_timeout")
    if patch and not (TEST_OUTPUT_START in log and TEST_OUTPUT_END in log):
        return Grade("error", False, reason="no_test_output", report={"error": log[-500:]})
    with tempfile.TemporaryDirectory(prefix="rescue-swe-log-") as tmp:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log)
        prediction = {
            "instance_id": inst["instance_id"],
            "model_patch": patch if patch else None,
            "model_name_or_path": "rescue",
        }
        report = get_eval_report(prediction, inst, str(path))
    return Grade(
        "completed",
        bool(report.get("resolved")),
        reason="resolved" if report.get("resolved") else "unresolved",
        report=_compact(report),
    )


def _apply_step(container: Container, command: str) -> Any:
    """One patch-application command; a ``docker exec`` that could not run, or whose
    container is gone, is the grader's fault (``grader_exec_failed``), not the patch's."""
    result = container.exec(f"{command} 2>&1", timeout_s=120)
    if result.returncode != 0 and (
        result.returncode == -1 or lost(container, result.output, result.returncode)
    ):
        raise SandboxError("grader_exec_failed", result.output[-500:])
    return result


def _already_applied(container: Container, path: str) -> bool:
    """Whether the patch at ``path`` applies in reverse and not forward: the tree already
    holds what it makes. swesmith's third apply command (``patch --batch``) would take it for
    a reversed patch and reverse it, undoing the change it describes."""
    if _apply_step(container, f"git apply --check {path}").returncode == 0:
        return False
    return _apply_step(container, f"git apply --check --reverse {path}").returncode == 0


def grade_patch(
    container: Container,
    instance: Mapping[str, Any],
    patch: str,
    *,
    timeout_s: float | None = None,
    log_dir: str | Path | None = None,
    reverse: bool = False,
) -> Grade:
    """Grade ``patch`` in ``container``, a fresh container of the task image (steps above).

    ``timeout_s`` defaults to the profile's timeout (90 s for Python repos). With
    ``log_dir`` the patch, the eval script and the test log are kept there. ``reverse``
    (default False) applies the patch in reverse (a reference solution). A failed
    checkout raises ``SandboxError`` (no verdict); the caller owns the container.
    """
    from swesmith.constants import GIT_APPLY_CMDS, TEST_OUTPUT_END, TEST_OUTPUT_START

    start = time.monotonic()
    inst = task_instance(instance)
    if not patch.strip():
        return Grade("completed", False, reason="empty_patch", report={"patch_exists": False})
    profile = profile_of(inst)
    timeout_s = float(timeout_s if timeout_s is not None else profile.timeout)
    checkout = checkout_command(inst["instance_id"])
    setup = container.exec(f"{{ {checkout}; }} && git checkout -q HEAD~1 2>&1", timeout_s=300)
    if setup.returncode != 0:
        raise SandboxError("grader_checkout_failed", setup.output[-500:])
    scratch = container.scratch
    wrote = container.exec(
        f"mkdir -p {scratch} && cat > {scratch}/patch.diff", timeout_s=60, input=patch
    )
    if wrote.returncode != 0:
        raise SandboxError("grader_copy_failed", wrote.output[-500:])
    if not reverse and _already_applied(container, f"{scratch}/patch.diff"):
        _keep(log_dir, patch=patch, log="the patch is already applied: it applies only in reverse")
        return Grade(
            "error",
            False,
            patch_apply_failed=True,
            reason="patch_already_applied",
            seconds=time.monotonic() - start,
        )
    applied = None
    for apply_cmd in GIT_APPLY_CMDS:
        if reverse:  # patch's -i takes the file: --reverse goes before it
            apply_cmd = (
                apply_cmd[: -len(" -i")] + " --reverse -i"
                if apply_cmd.endswith(" -i")
                else apply_cmd + " --reverse"
            )
        applied = _apply_step(container, f"{apply_cmd} {scratch}/patch.diff")
        if applied.returncode == 0:
            break
    else:
        _keep(log_dir, patch=patch, log=applied.output if applied else "")
        return Grade(
            "error",
            False,
            patch_apply_failed=True,
            reason="patch_apply_failed",
            seconds=time.monotonic() - start,
        )
    f2p_files, p2p_files = profile.get_test_files(inst)
    test_files = [*f2p_files, *p2p_files]
    if test_files:
        quoted = " ".join(shlex.quote(f) for f in test_files)
        container.exec(f"git checkout -q -- {quoted} 2>&1", timeout_s=60)
    test_cmd, _ = profile.get_test_cmd(inst)
    script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {container.workdir}",
            f": '{TEST_OUTPUT_START}'",
            test_cmd,
            f": '{TEST_OUTPUT_END}'",
            "",
        ]
    )
    wrote = container.exec(f"cat > {scratch}/eval.sh", timeout_s=60, input=script)
    if wrote.returncode != 0:
        raise SandboxError("grader_copy_failed", wrote.output[-500:])
    started = time.monotonic()
    run = container.exec(
        f"timeout -s KILL {int(timeout_s)} bash {scratch}/eval.sh 2>&1", timeout_s=timeout_s + 30
    )
    ran_s = time.monotonic() - started
    _keep(log_dir, patch=patch, log=run.output, script=script)
    gone = loss_reason(container, run.output, run.returncode)
    if run.timed_out or run.returncode == 124 or (run.returncode == 137 and ran_s >= timeout_s):
        grade = Grade("timeout", False, reason="tests_timeout")
    elif gone == "sandbox_oom" or (gone is None and run.returncode == 137 and _oom(container)):
        grade = Grade("completed", False, reason="tests_oom")  # the patch's tests, not us
    elif gone is not None:
        raise SandboxError("eval_container_lost", run.output[-500:])
    elif run.returncode == 137:  # killed before our timeout fired, not by its memory limit
        raise SandboxError("eval_killed", f"exit 137 after {ran_s:.0f}s: {run.output[-300:]}")
    else:
        grade = grade_from_log(inst, patch, run.output)
    return Grade(
        grade.status,
        grade.resolved,
        grade.patch_apply_failed,
        grade.reason,
        grade.report,
        seconds=time.monotonic() - start,
    )


#: The container's own memory cgroup: cgroup v2 (private namespace), then v1.
OOM_EVENTS = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"


def _oom(container: Container) -> bool:
    """Whether the container's memory limit killed a process in it (its cgroup's
    ``oom_kill`` count; a container that itself died of it says so to ``state``)."""
    if container.state() == "oom":
        return True
    events = container.exec(OOM_EVENTS, timeout_s=60).output
    return any(int(n) > 0 for n in re.findall(r"^oom_kill (\d+)", events, re.M))


def _compact(report: Mapping[str, Any]) -> dict[str, Any]:
    """Counts per FAIL_TO_PASS / PASS_TO_PASS and the first failing test names."""
    out: dict[str, Any] = {"patch_exists": bool(report.get("patch_exists"))}
    status = report.get("tests_status") or {}
    failures: list[str] = []
    for key, short in (("FAIL_TO_PASS", "f2p"), ("PASS_TO_PASS", "p2p")):
        entry = status.get(key) or {"success": [], "failure": []}
        out[f"{short}_passed"] = len(entry["success"])
        out[f"{short}_failed"] = len(entry["failure"])
        failures += entry["failure"]
    out["failed_tests"] = failures[:MAX_LISTED_FAILURES]
    return out


def _keep(log_dir: str | Path | None, **files: str) -> None:
    if log_dir is None:
        return
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    names = {"patch": "patch.diff", "log": "test_output.txt", "script": "eval.sh"}
    for key, text in files.items():
        (folder / names[key]).write_text(text)
