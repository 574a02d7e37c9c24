"""The ran-tests rule on crafted mini-swe-agent trajectories (tool-call and text modes)."""

from __future__ import annotations

import pytest

from swe_smith_tasks.ran_tests import is_edit, is_test_invocation, read_test_runs, split_segments

PYTEST_OK = (
    "============ test session starts ============\ncollected 3 items\n\n3 passed in 0.12s\n"
)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"


def trajectory(*steps, text_mode: bool = False) -> list[dict]:
    """Messages for steps of (command, output) pairs; output None means no observation."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for n, step in enumerate(steps):
        actions = [
            {"command": cmd, **({} if text_mode else {"tool_call_id": f"c{n}_{i}"})}
            for i, (cmd, _) in enumerate(step)
        ]
        messages.append({"role": "assistant", "content": "", "extra": {"actions": actions}})
        for i, (_, out) in enumerate(step):
            if out is None:
                continue
            extra = out if isinstance(out, dict) else {"raw_output": out, "returncode": 0}
            obs = {"role": "user" if text_mode else "tool", "content": "", "extra": extra}
            if not text_mode:
                obs["tool_call_id"] = f"c{n}_{i}"
            messages.append(obs)
    messages.append({"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}})
    return messages


@pytest.mark.parametrize(
    "command",
    [
        "grep -rn pytest setup.cfg",
        "pip install pytest",
        "cat tests/x.py",
        "find . -name 'test_*.py'",
        "ls tests/",
        "sed -n 1,40p tests/test_api.py",
        "echo pytest",
    ],
)
def test_commands_that_mention_tests_without_running_them_do_not_count(command):
    assert not any(is_test_invocation(s) for s in split_segments(command))
    runs = read_test_runs(trajectory([(command, PYTEST_OK)]))
    assert (runs.n_test_attempts, runs.ran_repo_tests) == (0, False)


@pytest.mark.parametrize(
    "command",
    [
        "pytest tests/test_api.py -x",
        "cd /testbed && python -m pytest -q",
        "source /opt/miniconda3/bin/activate; conda activate testbed; pytest -k add",
        "PYTHONPATH=src timeout 300 python3 -m pytest tests | tail -20",
        "env CI=1 py.test",
        "python tests/runtests.py",
        "python -m unittest discover",
        "bash -c 'cd /testbed && pytest -q'",
        "python test_calc.py",
        "tox -e py310",
        "go test ./...",
        "cargo test",
        "npm run test",
    ],
)
def test_runner_invocations_count(command):
    assert any(is_test_invocation(s) for s in split_segments(command))


def test_evidenced_run_after_the_last_edit():
    runs = read_test_runs(
        trajectory(
            [("sed -i 's/a - b/a + b/' calc.py", "")],
            [("python -m pytest -q tests", PYTEST_OK)],
            [("git diff -- calc.py > patch.txt", "")],
            [(SUBMIT, None)],
        ),
        test_files=["tests/test_calc.py::test_add"],
    )
    assert runs.ran_repo_tests and runs.ran_tests_after_last_edit
    assert (runs.n_test_runs, runs.n_test_attempts, runs.targeted) == (1, 1, False)


def test_edit_after_the_last_run_clears_after_last_edit():
    runs = read_test_runs(
        trajectory(
            [("pytest tests/test_calc.py", PYTEST_OK)],
            [("cat > calc.py <<'EOF'\ndef add(a, b):\n    return a + b\nEOF", "")],
            [(SUBMIT, None)],
        ),
        test_files=["tests/test_calc.py::test_add"],
    )
    assert runs.ran_repo_tests and not runs.ran_tests_after_last_edit and runs.targeted


def test_edit_and_test_in_one_command_keep_their_order():
    runs = read_test_runs(trajectory([("sed -i s/-/+/ calc.py && pytest -q", PYTEST_OK)]))
    assert runs.ran_tests_after_last_edit
    runs = read_test_runs(trajectory([("pytest -q; sed -i s/-/+/ calc.py", PYTEST_OK)]))
    assert runs.ran_repo_tests and not runs.ran_tests_after_last_edit


def test_attempts_without_evidence_timeouts_and_submit_steps_are_not_runs():
    runs = read_test_runs(
        trajectory(
            [("pytest", "bash: pytest: command not found")],
            [("python -m pytest", "ImportError: No module named calc")],
            [
                (
                    "pytest tests",
                    {
                        "raw_output": "",
                        "returncode": -1,
                        "exception_type": "TimeoutExpired",
                    },
                )
            ],
            [("pytest -q", None), (SUBMIT, None)],  # same step as the submission: no output
        )
    )
    assert (runs.ran_repo_tests, runs.n_test_runs, runs.n_test_attempts) == (False, 0, 4)
    assert runs.attempted_timeout


def test_scratch_writes_are_not_edits_and_repro_runs_are_flagged():
    assert not is_edit("git diff -- calc.py > patch.txt")
    assert not is_edit("python reproduce.py > /tmp/out.txt 2>&1")
    assert not is_edit("cat > reproduce_bug.py <<'EOF'")
    assert not is_edit("grep -n 'a > b' calc.py")
    assert is_edit("echo 'x = 1' >> src/calc.py")
    assert is_edit("sed -i 's/a/b/' calc.py")
    assert is_edit("python -c \"open('calc.py', 'w').write('x')\"")
    runs = read_test_runs(trajectory([("python reproduce_bug.py", "Traceback ...")]))
    assert runs.ran_repro and not runs.ran_repo_tests


def test_heredoc_bodies_are_not_commands():
    command = "cat > notes.md <<'EOF'\npytest -q\nEOF"
    assert split_segments(command) == ["cat > notes.md"]


def test_profile_test_command_counts_in_text_mode():
    runs = read_test_runs(
        trajectory(
            [("python -m tornado.test --verbose", "Ran 12 tests in 0.3s\n\nOK")],
            [("vim x", "")],
            text_mode=True,
        ),
        test_cmd="source /opt/miniconda3/bin/activate; conda activate testbed; "
        "python -m tornado.test --verbose",
    )
    assert runs.ran_repo_tests and runs.n_test_runs == 1


def test_actions_after_the_exit_message_are_ignored():
    messages = trajectory([("ls", "")])
    messages.append(
        {"role": "assistant", "content": "", "extra": {"actions": [{"command": "pytest"}]}}
    )
    messages.append({"role": "user", "content": "", "extra": {"raw_output": PYTEST_OK}})
    assert read_test_runs(messages).n_test_attempts == 0
