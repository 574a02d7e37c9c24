"""``rescue.stages``: the runner's promises where they can break, each from outside the
runner: a stage that wrote its outputs and then exited non-zero, a stage's standard output
file after a failure, the fingerprint recomputed by hand from its definition, an interrupt
recorded with its signal, what the runner says at each step, and the refusals' words.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rescue import interrupts, stages
from rescue.errors import InputError
from rescue.stages import Runner, Stage, fingerprint, read_state, write_progress

PY = sys.executable


def run(root: Path, stage_list, **kw) -> tuple[int, str]:
    out = io.StringIO()
    code = Runner(root / "run", stage_list, question="qx", cwd=root, out=out, **kw).run()
    return code, out.getvalue()


def py(code: str) -> tuple[str, ...]:
    return (PY, "-c", code)


def test_a_stage_that_wrote_its_outputs_then_exited_non_zero_failed_and_reruns(tmp_path):
    stage = Stage(
        "a",
        py("open('a.txt','w').write('x'); import sys; sys.exit(3)"),
        outputs=("a.txt",),
        job="make a",
    )
    code, text = run(tmp_path, [stage])
    log = tmp_path / "run" / "logs" / "a.log"
    assert code == 1 and (tmp_path / "a.txt").exists()
    assert f"[1/1] a: FAILED (exit 3): job make a; log {log}" in text
    record = read_state(tmp_path / "run")["stages"][0]
    assert (record["status"], record["exit_code"]) == ("failed", 3)
    code, text = run(tmp_path, [stage])  # its outputs exist, yet it runs again
    assert "[1/1] a: failed last time: restarting it" in text and code == 1


def test_a_stage_s_stdout_file_is_replaced_only_when_it_succeeded(tmp_path):
    ok = Stage(
        "r",
        py("import sys; print('new ' + 'report'); print('to ' + 'the log', file=sys.stderr)"),
        stdout="out/a/report.json",  # two folders to make
    )
    assert run(tmp_path, [ok])[0] == 0
    report = tmp_path / "out" / "a" / "report.json"
    assert report.read_text() == "new report\n"
    log = (tmp_path / "run" / "logs" / "r.log").read_text().splitlines()
    assert log == [f"$ {' '.join(ok.command)}", "to the log"]  # the command, then stderr
    bad = Stage(
        "r", py("print('half a ' + 'report'); import sys; sys.exit(2)"), stdout="out/a/report.json"
    )
    assert run(tmp_path, [bad])[0] == 1
    assert report.read_text() == "new report\n"
    assert sorted(os.listdir(report.parent)) == ["report.json"]  # no partial file left
    # without a stdout file, both streams go to the log, in order
    both = Stage("b", py("import sys; print('one', flush=True); print('two', file=sys.stderr)"))
    run(tmp_path, [both])
    assert (tmp_path / "run" / "logs" / "b.log").read_text().splitlines()[1:] == ["one", "two"]


def test_a_stage_s_note_env_and_progress_reach_its_command_and_its_record(tmp_path):
    code = (
        "import os; open('env.txt','w').write(os.environ['SETTING'] + ' ' + "
        "os.environ['RESCUE_STAGE_PROGRESS'])"
    )
    stage = Stage(
        "s",
        py(code),
        note="simulated here",
        env={"SETTING": "v1"},
        progress="p/s.json",
        outputs=("env.txt",),
    )
    rc, text = run(tmp_path, [stage])
    assert rc == 0
    assert (tmp_path / "env.txt").read_text() == f"v1 {tmp_path / 'p' / 's.json'}"
    assert "[1/1] s: NOTE: simulated here\n" in text
    assert f"[1/1] s: {PY} (log: {tmp_path / 'run' / 'logs' / 's.log'})\n" in text
    assert "[1/1] s: done\n" in text and text.endswith(
        f"qx: every stage done ({tmp_path / 'run'})\n"
    )
    record = read_state(tmp_path / "run")["stages"][0]
    for when in (record["started"], record["ended"]):  # local time, ISO 8601 with its offset
        assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]"
                            r"[+-][0-9]{4}", when), when  # fmt: skip
    assert record["note"] == "simulated here" and record["progress"] == "p/s.json"
    assert record["signal"] is None and record["recorded_command"] == list(stage.command)
    _, again = run(tmp_path, [stage])
    assert "[1/1] s: done, inputs unchanged: skipped\n" in again


def test_a_command_that_cannot_start_fails_with_127(tmp_path):
    stage = Stage("x", (str(tmp_path / "no-such-program"),))
    code, text = run(tmp_path, [stage])
    assert code == 1 and "FAILED (exit 127)" in text
    assert "cannot start the command" in (tmp_path / "run" / "logs" / "x.log").read_text()


def test_only_the_log_s_last_lines_are_printed(tmp_path):
    stage = Stage("t", py("import sys\nfor i in range(30): print(f'line {i}')\nsys.exit(1)"))
    _, text = run(tmp_path, [stage])
    shown = [line.strip() for line in text.splitlines() if line.startswith("    ")]
    assert shown == [f"line {i}" for i in range(10, 30)]  # the last TAIL_LINES = 20


@pytest.mark.parametrize(
    ("raised", "name", "status"),
    [(KeyboardInterrupt(), "SIGINT", 130), (interrupts.Interrupted(15), "SIGTERM", 143)],
)
def test_an_interrupt_during_a_stage_is_recorded_with_its_signal(
    tmp_path, monkeypatch, raised, name, status
):
    def interrupted(*a, **k):
        raise raised

    monkeypatch.setattr(stages.subprocess, "call", interrupted)
    stage = Stage("i", py("pass"))
    code, text = run(tmp_path, [stage, Stage("j", py("pass"))])
    assert code == status
    record = read_state(tmp_path / "run")["stages"][0]
    assert (record["status"], record["signal"], record["exit_code"]) == ("interrupted", name, None)
    assert record["ended"] is not None
    assert (
        f"[1/2] i: interrupted by {name}; recorded in {tmp_path / 'run' / 'stages.json'}; "
        "the same command resumes here\n"
    ) in text
    monkeypatch.undo()
    code, text = run(tmp_path, [stage, Stage("j", py("pass"))])
    assert code == 0 and "[1/2] i: interrupted last time: restarting it" in text


def test_the_fingerprint_is_sizes_and_bytes_under_sorted_names(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(b"abc")
    assert fingerprint(f) == hashlib.sha256(b"\x003\x00abc").hexdigest()
    d = tmp_path / "d"
    (d / "z").mkdir(parents=True)
    (d / "b.txt").write_text("12")
    (d / "z" / "a.txt").write_text("3")
    want = hashlib.sha256(b"b.txt\x002\x0012" + b"z/a.txt\x001\x003").hexdigest()
    assert fingerprint(d) == want
    (d / "z" / "a.txt").rename(d / "z" / "c.txt")  # a renamed file changes it
    assert fingerprint(d) != want


def test_bad_records_and_stage_names_are_refused_naming_them(tmp_path):
    (tmp_path / "stages.json").write_text("{not json")
    with pytest.raises(InputError, match=r"stages.json: not JSON \("):
        read_state(tmp_path)
    (tmp_path / "stages.json").write_text('{"stages": {}}')
    with pytest.raises(
        InputError, match=r"stages.json: not a record of stages \(no 'stages' list\)"
    ):
        read_state(tmp_path)
    (tmp_path / "stages.json").write_text("[]")
    with pytest.raises(InputError, match="not a record of stages"):
        read_state(tmp_path)
    for name in ("", "a/b", ".hidden"):
        with pytest.raises(InputError, match=f"stage name {name!r}: allowed a plain file name"):
            Stage(name, ("true",))


def test_progress_is_written_only_inside_a_runner(tmp_path, monkeypatch):
    monkeypatch.delenv("RESCUE_STAGE_PROGRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    write_progress(1, 2, "runs")
    assert os.listdir(tmp_path) == []
    target = tmp_path / "run" / "progress" / "p.json"  # two folders to make
    monkeypatch.setenv("RESCUE_STAGE_PROGRESS", str(target))
    write_progress(1, 2, "runs")
    write_progress(2, 2, "runs", "last")  # the folders exist now
    assert json.loads(target.read_text()) == {"done": 2, "total": 2, "unit": "runs",
                                              "detail": "last"}  # fmt: skip
    assert os.listdir(target.parent) == ["p.json"]


def test_the_runner_runs_in_the_current_folder_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    stage = Stage("w", py("open('here.txt','w').write('1')"), outputs=("here.txt",))
    assert Runner("runs/q/run", [stage], out=out).run() == 0  # its parents made too
    assert (tmp_path / "here.txt").exists()
    assert out.getvalue().endswith("run: every stage done (runs/q/run)\n")
    assert json.loads((tmp_path / "runs/q/run/stages.json").read_text())["question"] == ""


def test_a_skipped_stage_keeps_its_record_and_one_not_reached_keeps_its_interrupt(
    tmp_path, monkeypatch
):
    a = Stage("a", py("open('a.txt','w').write('1')"), outputs=("a.txt",))
    b = Stage("b", py("pass"))
    assert run(tmp_path, [a, b])[0] == 0
    keys = ("status", "started", "ended", "exit_code", "signal")
    first = [{k: r[k] for k in keys} for r in read_state(tmp_path / "run")["stages"]]
    assert first[1]["exit_code"] == 0 and first[1]["ended"] is not None
    _, text = run(tmp_path, [a, b])  # both skipped: their records as they were
    assert text.count("done, inputs unchanged: skipped") == 2
    assert [{k: r[k] for k in keys} for r in read_state(tmp_path / "run")["stages"]] == first

    real = stages.subprocess.call

    def interrupted_b(argv, **kw):
        if "b-again" in argv[-1]:
            raise interrupts.Interrupted(15)
        return real(argv, **kw)

    b2 = Stage("b", py("'b-again'"))
    monkeypatch.setattr(stages.subprocess, "call", interrupted_b)
    assert run(tmp_path, [a, b2])[0] == 143
    monkeypatch.undo()
    b_record = read_state(tmp_path / "run")["stages"][1]
    assert (b_record["status"], b_record["signal"]) == ("interrupted", "SIGTERM")
    # a fails now: b is not reached, and its record still says how it ended last time
    a_fails = Stage("a", py("import sys; sys.exit(5)"), outputs=("a.txt",))
    assert run(tmp_path, [a_fails, b2])[0] == 1
    after = read_state(tmp_path / "run")["stages"][1]
    assert {k: after[k] for k in keys} == {k: b_record[k] for k in keys}


def test_the_runner_s_lines_are_out_as_soon_as_said(tmp_path):
    """Read through a pipe while the stage still runs (the stage waits for the test): a
    line left in a buffer would not arrive until the runner exits."""
    go = tmp_path / "go"
    stage_code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
    runner_code = (
        "import sys\nfrom rescue.stages import Runner, Stage\n"
        f"sys.exit(Runner({str(tmp_path / 'run')!r}, [Stage('w', (sys.executable, '-c', "
        f"{stage_code!r}))], question='qx').run())\n"
    )
    proc = subprocess.Popen([PY, "-c", runner_code], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path)  # fmt: skip
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()))
    reader.start()
    reader.join(timeout=30)
    early = list(got)  # what arrived while the stage was still running
    go.write_text("")
    proc.communicate(timeout=60)
    reader.join()
    assert early and early[0].startswith("[1/1] w: "), (early, got)


def test_an_interrupt_before_a_restarted_stage_began_records_no_exit_code(tmp_path, monkeypatch):
    stage = Stage("f", py("import sys; sys.exit(4)"))
    run(tmp_path, [stage])
    assert read_state(tmp_path / "run")["stages"][0]["exit_code"] == 4

    def interrupted_at_once(self, *a):
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, "_run_stage", interrupted_at_once)
    assert run(tmp_path, [stage])[0] == 130
    record = read_state(tmp_path / "run")["stages"][0]
    assert (record["status"], record["exit_code"], record["signal"]) == (
        "interrupted",
        None,
        "SIGINT",
    )


def test_a_restarted_stage_s_record_says_running_with_nothing_of_its_last_end(tmp_path):
    """While it runs again, the record of a stage that failed last time has no end time,
    exit code or signal (``rescue status`` reads the record during the run)."""
    seen = tmp_path / "seen.json"
    code = (
        "import json, os, sys\n"
        f"rec = json.load(open({str(tmp_path / 'run' / 'stages.json')!r}))['stages'][0]\n"
        f"json.dump(rec, open({str(seen)!r}, 'w'))\n"
        "sys.exit(0 if os.path.exists('second') else 4)\n"
    )
    stage = Stage("s", py(code))
    assert run(tmp_path, [stage])[0] == 1
    (tmp_path / "second").write_text("")
    assert run(tmp_path, [stage])[0] == 0
    rec = json.loads(seen.read_text())
    assert (rec["status"], rec["ended"], rec["exit_code"], rec["signal"]) == (
        "running", None, None, None)  # fmt: skip


def test_a_stage_that_exits_0_without_two_outputs_names_both_and_exits_1(tmp_path):
    stage = Stage("m", py("pass"), outputs=("a.txt", "b/c.txt"), job="make m")
    code, text = run(tmp_path, [stage])
    log = (tmp_path / "run" / "logs" / "m.log").read_text().splitlines()
    assert code == 1 and log[-1] == "the stage exited 0 without writing a.txt, b/c.txt"
    assert "[1/1] m: FAILED (exit 1, missing a.txt, b/c.txt): job make m; log " in text
    assert read_state(tmp_path / "run")["stages"][0]["exit_code"] == 1


def test_a_log_that_is_not_utf_8_is_still_shown(tmp_path):
    stage = Stage("u", py("import sys; sys.stdout.buffer.write(b'bad \\xff byte\\n'); sys.exit(3)"))
    code, text = run(tmp_path, [stage])
    assert code == 1 and "    bad \ufffd byte" in text


class Recorder:
    """A stream that records what was written and when it was flushed."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def write(self, s: str) -> int:
        self.events.append(s)
        return len(s)

    def flush(self) -> None:
        self.events.append("<flush>")


def test_every_line_the_runner_says_is_flushed_at_once(tmp_path):
    out = Recorder()
    Runner(tmp_path / "run", [Stage("a", py("pass"))], question="qx", cwd=tmp_path, out=out).run()
    lines = [e for e in out.events if e not in ("\n", "<flush>")]
    assert len(lines) == 3  # the start, done, and every stage done
    for i, e in enumerate(out.events):
        if e == "\n":
            assert out.events[i + 1] == "<flush>"


def test_a_folder_of_no_question_is_taken_and_another_question_s_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "stages.json").write_text(json.dumps({"question": "", "stages": []}))
    assert Runner(run_dir, [Stage("a", py("pass"))], question="qx", cwd=tmp_path,
                  out=io.StringIO()).run() == 0  # fmt: skip
    with pytest.raises(InputError) as e:
        Runner(run_dir, [Stage("a", py("pass"))], question="qy", cwd=tmp_path).run()
    assert str(e.value) == f"{run_dir}: a run folder of qx, not qy: choose another RUN_DIR"


def test_a_stage_not_reached_keeps_its_failure_and_a_rerun_clears_its_signal(tmp_path, monkeypatch):
    a = Stage("a", py("pass"), job="make a")
    b = Stage("b", py("import sys; sys.exit(4)"))
    run(tmp_path, [a, b])
    a_fails = Stage("a", py("import sys; sys.exit(5)"), job="make a")
    run(tmp_path, [a_fails, b])
    records = read_state(tmp_path / "run")["stages"]
    assert records[0]["job"] == "make a"
    assert (records[1]["status"], records[1]["exit_code"]) == ("failed", 4)  # as it ended
    # interrupted (signal recorded), then run again: while it runs, no signal in its record
    seen = tmp_path / "seen.json"
    code = (
        "import json\n"
        f"rec = json.load(open({str(tmp_path / 'x' / 'run' / 'stages.json')!r}))['stages'][0]\n"
        f"json.dump(rec, open({str(seen)!r}, 'w'))\n"
    )
    c = Stage("c", py(code))

    def interrupted(*args, **kw):
        raise interrupts.Interrupted(15)

    with monkeypatch.context() as m:
        m.setattr(stages.subprocess, "call", interrupted)
        (tmp_path / "x").mkdir()
        run(tmp_path / "x", [c])
    assert read_state(tmp_path / "x" / "run")["stages"][0]["signal"] == "SIGTERM"
    assert run(tmp_path / "x", [c])[0] == 0
    rec = json.loads(seen.read_text())
    assert (rec["name"], rec["status"], rec["signal"]) == ("c", "running", None)


def test_a_missing_record_is_refused_saying_what_a_run_folder_is(tmp_path):
    with pytest.raises(InputError) as e:
        read_state(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'stages.json'}: no such file: RUN_DIR must be a run folder of make "
        "q1/q2/q3 (or an arm's SAVE_DIR, for its lives)"
    )


def test_progress_without_a_detail_records_an_empty_one(tmp_path, monkeypatch):
    target = tmp_path / "p.json"
    monkeypatch.setenv("RESCUE_STAGE_PROGRESS", str(target))
    write_progress(3, 7, "steps")
    assert json.loads(target.read_text()) == {"done": 3, "total": 7, "unit": "steps",
                                              "detail": ""}  # fmt: skip


def test_a_stage_not_yet_run_records_no_inputs(tmp_path):
    a = Stage("a", py("import sys; sys.exit(2)"))
    b = Stage("b", py("pass"), inputs=("a.txt",))
    assert run(tmp_path, [a, b])[0] == 1
    records = read_state(tmp_path / "run")["stages"]
    assert [(r["name"], r["status"], r["inputs"]) for r in records] == [
        ("a", "failed", {}), ("b", "pending", {})]  # fmt: skip
