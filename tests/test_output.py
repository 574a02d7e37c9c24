"""rescue.output: a new output folder is written beside the old one and swapped in only when
the command finished; a failure or an interrupt leaves the old one as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rescue import output
from rescue.errors import InputError
from rescue.stages import fingerprint


def old_result(folder: Path) -> str:
    (folder / "sub").mkdir(parents=True)
    (folder / "summary.md").write_text("the earlier result\n")
    (folder / "sub" / "data.json").write_text("[1, 2, 3]\n")
    (folder / "notes.txt").write_text("the user's own notes\n")
    return fingerprint(folder)


def owned(entry: Path) -> bool:
    return entry.name in ("summary.md", "sub")


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


def test_a_finished_run_replaces_what_it_owns_and_keeps_the_rest(tmp_path):
    out = tmp_path / "out"
    old_result(out)
    output.forget()  # what an earlier test left recorded
    with output.staged(out, owned) as stage:
        assert stage.path.parent == out.parent and stage.path.name.startswith(".out.partial-")
        (stage.path / "summary.md").write_text("the new result\n")
        assert (out / "summary.md").read_text() == "the earlier result\n"  # not yet
    assert (out / "summary.md").read_text() == "the new result\n"
    assert not (out / "sub").exists()  # the earlier run's, not written again: gone
    assert (out / "notes.txt").read_text() == "the user's own notes\n"  # not owned: kept
    assert siblings(out) == []  # no temporary folder left
    assert output.left_as_it_was() == []


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_run_leaves_the_old_folder_as_it_was(tmp_path, error):
    out = tmp_path / "out"
    before = old_result(out)
    output.forget()
    with pytest.raises(type(error)), output.staged(out, owned) as stage:
        (stage.path / "summary.md").write_text("half of a new result\n")
        raise error
    assert fingerprint(out) == before
    assert siblings(out) == []
    assert output.left_as_it_was() == [out.resolve()]


def test_a_first_run_creates_the_folder_and_its_parents(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with output.staged(out) as stage:
        (stage.path / "x").write_text("1")
    assert (out / "x").read_text() == "1"


def test_a_failed_first_run_leaves_no_folder(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), output.staged(out) as stage:
        (stage.path / "x").write_text("1")
        raise RuntimeError("boom")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", [".", "..", "/"])
def test_the_current_folder_one_above_it_or_a_root_cannot_be_replaced(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"--out .*cannot be replaced: name a folder below it"):
        output.check_out(Path(where))


def test_an_out_that_is_a_file_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match=r"--trained .*an existing file, not a folder"):
        output.check_out(tmp_path / "f", "--trained")


def test_a_temporary_folder_left_by_a_killed_run_is_removed_next_time(tmp_path):
    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f".out.partial-{dead.pid}"
    left.mkdir()
    (left / "x").write_text("half")
    # a live process's: not ours to remove (a child of this test's, so that nothing else is
    # signalled if the liveness check were wrong; it must be left running too)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = tmp_path / f".out.partial-{live.pid}"
        alive.mkdir()
        with output.staged(out) as stage:
            (stage.path / "y").write_text("1")
        assert not left.exists() and alive.exists()
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()


def test_a_result_a_killed_swap_left_renamed_is_put_back_not_removed(tmp_path):
    """Killed (SIGKILL, nothing held) between renaming the old folder aside and the new one
    in: the next run puts the old one back before it stages."""
    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    aside = tmp_path / f".out.old-{dead.pid}"
    before = old_result(aside)
    with pytest.raises(RuntimeError), output.staged(out, owned):
        raise RuntimeError("this run fails too")
    assert fingerprint(out) == before and not aside.exists()


def test_write_text_replaces_a_file_whole(tmp_path):
    path = tmp_path / "d" / "report.json"
    output.write_text(path, "one")
    output.write_text(path, "two")
    assert path.read_text() == "two" and sorted(os.listdir(path.parent)) == ["report.json"]


def test_an_interrupt_during_the_swap_waits_for_it(tmp_path):
    """A SIGINT that arrives while the folders are renamed is delivered after the swap: the
    folder is the new one, whole, and the interrupt still stops the program."""
    # Python's own SIGINT handler, as in a program started from a terminal (a shell starts a
    # background job with SIGINT ignored, and Python then keeps it ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    out = tmp_path / "out"
    old_result(out)
    stage = output.Staging(out, owned)
    stage.path.mkdir()
    (stage.path / "summary.md").write_text("new\n")
    real_rename = os.rename

    def rename(a, b):  # the signal arrives in the middle of the swap
        if Path(b) == out:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        real_rename(a, b)

    os.rename = rename
    try:
        with pytest.raises(KeyboardInterrupt):
            stage.commit()
            time.sleep(0.5)  # the held signal is delivered on leaving the swap
    finally:
        os.rename = real_rename
        signal.signal(signal.SIGINT, previous)
    assert (out / "summary.md").read_text() == "new\n"
    assert (out / "notes.txt").exists() and siblings(out) == []
