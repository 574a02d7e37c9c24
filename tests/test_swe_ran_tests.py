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


# ── the commands mini-swe-agent trajectories contain: (command, runs tests, edits a file) ──

PY_HEREDOC_EDIT = (
    "python3 - <<'PY'\nfrom pathlib import Path\np = Path('src/calc.py')\n"
    "p.write_text(p.read_text().replace('a - b', 'a + b'))\nPY"
)
PY_HEREDOC_OPEN = (
    "python <<EOF\nimport re\ns = open('calc.py').read()\n"
    "with open('calc.py', 'w') as f:\n    f.write(re.sub('-', '+', s))\nEOF"
)
PY_HEREDOC_READ = "python3 - <<'PY'\nimport calc\nprint(calc.add(2, 3))\nPY"
COMMANDS = [
    # test runs
    ("pytest tests/test_calc.py -x -q", True, False),
    ("cd /testbed && python -m pytest -q tests 2>&1 | tail -30", True, False),
    ("python -m pytest tests/test_calc.py::test_add -vv", True, False),
    ("timeout 300 python -m pytest -x -q 2>&1 | head -100", True, False),
    ("PYTHONPATH=. pytest -k 'add and not slow'", True, False),
    ("python -m pytest tests | tee /tmp/pytest.log", True, False),
    ("pytest -q 2>&1 | tee test_output.txt", True, False),
    ("pytest -q > pytest_results.log 2>&1; tail -5 pytest_results.log", True, False),
    ("python -m unittest tests.test_calc -v", True, False),
    ("python runtests.py tests/test_calc.py", True, False),
    ("tox -e py311 -- -k calc", True, False),
    ("bash -c 'source /opt/miniconda3/bin/activate testbed && pytest -q'", True, False),
    ("python -m pytest --tb=short -q tests/ ; echo exit=$?", True, False),
    ("coverage run -m pytest tests -q", True, False),
    # edits
    ("sed -i 's/return a - b/return a + b/' calc.py", False, True),
    ("sed -e 's/a - b/a + b/' -i calc.py", False, True),
    ("sed -i.bak -e 's/-/+/' src/calc.py", False, True),
    ("sed --in-place 's/-/+/' calc.py", False, True),
    ("perl -pi -e 's/a - b/a + b/' calc.py", False, True),
    (PY_HEREDOC_EDIT, False, True),
    (PY_HEREDOC_OPEN, False, True),
    ("cat > calc.py <<'EOF'\ndef add(a, b):\n    return a + b\nEOF", False, True),
    ("cat <<'EOF' > src/calc.py\ndef add(a, b):\n    return a + b\nEOF", False, True),
    ("cat << EOF >> calc.py\n\ndef sub(a, b):\n    return a - b\nEOF", False, True),
    ("printf 'def add(a, b):\\n    return a + b\\n' > calc.py", False, True),
    ("echo 'import os' | tee -a src/calc.py", False, True),
    ("echo 'x = 1' >> src/calc.py", False, True),
    ("python -c \"import pathlib; pathlib.Path('calc.py').write_text('x')\"", False, True),
    ("git checkout -- calc.py", False, True),
    ("git apply /tmp/fix.diff", False, True),
    ("mv calc_new.py calc.py", False, True),
    ("bash <<'EOF'\nsed -i 's/-/+/' calc.py\nEOF", False, True),
    # neither
    ("cat calc.py", False, False),
    ("sed -n '1,40p' calc.py", False, False),
    ("nl -ba calc.py | sed -n '10,20p'", False, False),
    ("grep -rn 'def add' . | head", False, False),
    ("git diff -- calc.py > patch.txt", False, False),
    ("git status && git diff", False, False),
    ("find . -name 'test_*.py' | xargs grep -l add", False, False),
    ('python -c "import calc; print(calc.add(2, 3))"', False, False),
    (PY_HEREDOC_READ, False, False),
    ("python reproduce_bug.py > /tmp/out.txt 2>&1; cat /tmp/out.txt", False, False),
    ("cat > reproduce_issue.py <<'EOF'\nimport calc\nprint(calc.add(2, 3))\nEOF", False, False),
    ("pip install -e . > /dev/null 2>&1", False, False),
    ("ls -la tests/ && cat setup.cfg", False, False),
    ("cp calc.py /tmp/calc_backup.py", False, False),
    ("rm -rf .pytest_cache __pycache__", False, False),
    (SUBMIT, False, False),
]


@pytest.mark.parametrize(("command", "runs_tests", "edits"), COMMANDS, ids=range(len(COMMANDS)))
def test_each_real_command_is_read_as_a_test_run_an_edit_or_neither(command, runs_tests, edits):
    segments = split_segments(command)
    assert any(is_test_invocation(s) for s in segments) is runs_tests
    assert any(is_edit(s) for s in segments) is edits


def test_the_command_table_is_broad():
    assert len(COMMANDS) >= 40
    assert sum(e for _, _, e in COMMANDS) >= 15 and sum(t for _, t, _ in COMMANDS) >= 10


def test_a_heredoc_edit_after_the_last_run_clears_after_last_edit():
    runs = read_test_runs(
        trajectory(
            [("python -m pytest -q tests", PYTEST_OK)],
            [(PY_HEREDOC_EDIT, "")],
            [(SUBMIT, None)],
        )
    )
    assert runs.ran_repo_tests and not runs.ran_tests_after_last_edit


def test_teeing_the_test_log_is_not_an_edit_after_the_run():
    runs = read_test_runs(
        trajectory(
            [("sed -e 's/a - b/a + b/' -i calc.py", "")],
            [("python -m pytest -q tests 2>&1 | tee log.txt", PYTEST_OK)],
            [(SUBMIT, None)],
        )
    )
    assert runs.ran_repo_tests and runs.ran_tests_after_last_edit
