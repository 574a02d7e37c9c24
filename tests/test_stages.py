"""The stage runner (rescue.stages): resume, skip, restart, and a failing stage named."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rescue.errors import InputError
from rescue.stages import Runner, Stage, fingerprint, read_state

PY = sys.executable


def step(name: str, src: str, *, inputs=(), outputs=(), **kw) -> Stage:
    """A stage whose command appends its name to ``calls.txt`` then runs ``src``."""
    code = f"open('calls.txt', 'a').write({name!r} + '\\n')\n" + textwrap.dedent(src)
    return Stage(name, (PY, "-c", code), inputs=tuple(inputs), outputs=tuple(outputs), **kw)


def calls(root: Path) -> list[str]:
    p = root / "calls.txt"
    return p.read_text().split() if p.exists() else []


def chain(root: Path, *, fail_b: bool = False) -> list[Stage]:
    """a -> a.txt, b (a.txt) -> b.txt, c (b.txt) -> c.txt; ``fail_b`` kills b's process."""
    b_src = (
        "import os; os._exit(9)" if fail_b else "open('b.txt','w').write(open('a.txt').read()+'b')"
    )
    return [
        step(
            "a",
            "open('a.txt','w').write(open('seed.txt').read())",
            inputs=["seed.txt"],
            outputs=["a.txt"],
        ),
        step("b", b_src, inputs=["a.txt"], outputs=["b.txt"], job="job-b"),
        step(
            "c",
            "open('c.txt','w').write(open('b.txt').read()+'c')",
            inputs=["b.txt"],
            outputs=["c.txt"],
        ),
    ]


def run(root: Path, stages, **kw) -> tuple[int, str]:
    out = io.StringIO()
    code = Runner(root / "run", stages, question="qx", cwd=root, out=out, **kw).run()
    return code, out.getvalue()


def test_a_stage_killed_mid_run_is_where_the_next_run_resumes(tmp_path):
    (tmp_path / "seed.txt").write_text("s")
    code, text = run(tmp_path, chain(tmp_path, fail_b=True))
    assert code == 1 and calls(tmp_path) == ["a", "b"]
    state = read_state(tmp_path / "run")
    assert [r["status"] for r in state["stages"]] == ["done", "failed", "pending"]
    assert state["stages"][1]["exit_code"] == 9
    code, text = run(tmp_path, chain(tmp_path))
    assert code == 0, text
    assert calls(tmp_path) == ["a", "b", "b", "c"]  # a skipped, b restarted, c ran
    assert "a: done, inputs unchanged: skipped" in text and "b: failed last time" in text
    assert (tmp_path / "c.txt").read_text() == "sbc"
    # everything done and unchanged: nothing runs
    code, text = run(tmp_path, chain(tmp_path))
    assert code == 0 and calls(tmp_path) == ["a", "b", "b", "c"]


def test_a_runner_process_killed_during_a_stage_restarts_that_stage(tmp_path):
    """The whole runner is killed (os._exit inside the stage takes only the stage; here the
    runner's own process dies while b is running, leaving b's record 'running')."""
    (tmp_path / "seed.txt").write_text("s")
    script = textwrap.dedent(
        f"""
        import os, sys, threading
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_stages import chain
        from rescue.stages import Runner
        from pathlib import Path
        root = Path({str(tmp_path)!r})
        stages = chain(root)
        import subprocess
        real = subprocess.call
        def call(cmd, **kw):  # the runner dies while stage b runs
            if 'b.txt' in cmd[-1] and 'sbc' not in cmd[-1]:
                os._exit(3)
            return real(cmd, **kw)
        subprocess.call = call
        Runner(root / 'run', stages, question='qx', cwd=root).run()
        """
    )
    r = subprocess.run([PY, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    state = read_state(tmp_path / "run")
    assert [s["status"] for s in state["stages"]] == ["done", "running", "pending"]
    code, text = run(tmp_path, chain(tmp_path))
    assert code == 0
    assert "b: the last run stopped during this stage: restarting it" in text
    assert calls(tmp_path) == ["a", "b", "c"]


def test_a_failing_stage_is_named_with_its_job_and_log(tmp_path):
    (tmp_path / "seed.txt").write_text("s")
    stages = chain(tmp_path)
    stages[1] = step(
        "b", "import sys; print('the grader broke'); sys.exit(4)", job="make rlvr-sweep"
    )
    code, text = run(tmp_path, stages)
    log = tmp_path / "run" / "logs" / "b.log"
    assert code == 1
    assert f"b: FAILED (exit 4): job make rlvr-sweep; log {log}" in text
    assert "the grader broke" in log.read_text() and "    the grader broke" in text
    assert "c" not in calls(tmp_path)


def test_a_stage_that_fails_after_a_full_run_leaves_what_follows_pending(tmp_path):
    (tmp_path / "seed.txt").write_text("s")
    assert run(tmp_path, chain(tmp_path))[0] == 0
    stages = chain(tmp_path)
    stages[1] = step("b", "import sys; sys.exit(4)", inputs=["seed.txt"], outputs=["b.txt"])
    code, _ = run(tmp_path, stages)
    assert code == 1
    state = read_state(tmp_path / "run")
    # c was built on b's earlier output: not done any more, so it runs once b succeeds
    assert [s["status"] for s in state["stages"]] == ["done", "failed", "pending"]


def test_an_exit_0_without_its_output_is_a_failure(tmp_path):
    (tmp_path / "seed.txt").write_text("s")
    stages = [step("a", "pass", inputs=["seed.txt"], outputs=["a.txt"])]
    code, text = run(tmp_path, stages)
    assert code == 1 and "missing a.txt" in text
    assert read_state(tmp_path / "run")["stages"][0]["status"] == "failed"


def test_a_changed_input_or_command_reruns_the_stage_and_what_reads_its_output(tmp_path):
    (tmp_path / "seed.txt").write_text("s")
    assert run(tmp_path, chain(tmp_path))[0] == 0
    (tmp_path / "seed.txt").write_text("t")
    assert run(tmp_path, chain(tmp_path))[0] == 0
    assert calls(tmp_path) == ["a", "b", "c"] * 2 and (tmp_path / "c.txt").read_text() == "tbc"
    # a changed command (a setting) reruns that stage; c's input b.txt is unchanged
    stages = chain(tmp_path)
    stages[1] = step(
        "b",
        "open('b.txt','w').write(open('a.txt').read()+'b')  # v2",
        inputs=["a.txt"],
        outputs=["b.txt"],
    )
    assert run(tmp_path, stages)[0] == 0
    assert calls(tmp_path)[6:] == ["b"]
    # a deleted output reruns its stage
    (tmp_path / "c.txt").unlink()
    assert run(tmp_path, stages)[0] == 0 and calls(tmp_path)[7:] == ["c"]


def test_the_record_holds_inputs_outputs_status_times_and_log(tmp_path):
    (tmp_path / "seed.txt").write_text("s")
    run(tmp_path, chain(tmp_path), settings={"REHEARSAL": "1"})
    state = json.loads((tmp_path / "run" / "stages.json").read_text())
    assert state["question"] == "qx" and state["settings"] == {"REHEARSAL": "1"}
    a = state["stages"][0]
    assert a["inputs"] == {"seed.txt": fingerprint(tmp_path / "seed.txt")}
    assert a["outputs"] == ["a.txt"] and a["status"] == "done" and a["exit_code"] == 0
    assert a["started"] <= a["ended"] and a["log"].endswith("logs/a.log")
    assert not list((tmp_path / "run").glob(".*tmp"))  # atomic writes leave nothing behind


def test_fingerprints_see_folder_contents_and_missing_paths(tmp_path):
    d = tmp_path / "d"
    assert fingerprint(d) == "missing"
    (d / "x").mkdir(parents=True)
    (d / "x" / "f").write_text("1")
    first = fingerprint(d)
    (d / "x" / "f").write_text("2")
    assert fingerprint(d) != first


def test_a_run_folder_of_another_question_and_bad_stages_are_refused(tmp_path):
    (tmp_path / "seed.txt").write_text("s")
    run(tmp_path, chain(tmp_path))
    with pytest.raises(InputError, match="a run folder of qx, not qy"):
        Runner(tmp_path / "run", chain(tmp_path), question="qy", cwd=tmp_path).run()
    with pytest.raises(InputError, match="unique"):
        Runner(tmp_path / "r2", chain(tmp_path) * 2)
    with pytest.raises(InputError, match="empty command"):
        Stage("x", ())
    with pytest.raises(InputError, match="no such file"):
        read_state(tmp_path / "nowhere")


def test_the_progress_file_path_reaches_the_command(tmp_path):
    src = "from rescue.stages import write_progress; write_progress(3, 4, 'runs', 'zero seed 1')"
    stages = [Stage("t", (PY, "-c", src), progress="run/progress/t.json")]
    assert run(tmp_path, stages)[0] == 0
    got = json.loads((tmp_path / "run" / "progress" / "t.json").read_text())
    assert got == {"done": 3, "total": 4, "unit": "runs", "detail": "zero seed 1"}
