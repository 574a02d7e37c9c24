"""``rescue.output``'s failure paths, forced: each promise of the module docstring checked where
it can break (a rename of the swap that fails, a name in both the old and the new folder, a
signal during the swap, a stale sibling that is not ours), the folder compared file by file
with what it held before (``fingerprint``, an independent reading of the disk).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
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
    (folder / "more.txt").write_text("more of the user's\n")
    return fingerprint(folder)


def owned(entry: Path) -> bool:
    return entry.name in ("summary.md", "sub")


def beside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def failing_rename(fail: callable):
    """``os.rename`` that raises ``OSError`` for the calls ``fail(src, dst)`` selects."""
    real = os.rename

    def rename(src, dst):
        if fail(Path(src), Path(dst)):
            raise OSError(28, "No space left on device")
        real(src, dst)

    return rename


def test_a_swap_whose_last_rename_fails_puts_the_old_folder_and_the_user_s_entries_back(
    tmp_path, monkeypatch
):
    out = tmp_path / "out"
    before = old_result(out)
    monkeypatch.setattr(
        os, "rename", failing_rename(lambda s, d: d == out and ".partial-" in s.name)
    )
    with pytest.raises(OSError, match="No space"), output.staged(out, owned) as stage:
        (stage.path / "summary.md").write_text("the new result\n")
    monkeypatch.undo()
    assert fingerprint(out) == before  # notes.txt and more.txt carried out and back
    assert beside(out) == []  # neither the new folder nor the old one's aside name is left
    assert output.left_as_it_was()[-1] == out


def test_a_carry_that_fails_midway_moves_back_what_it_had_moved(tmp_path, monkeypatch):
    out = tmp_path / "out"
    before = old_result(out)
    monkeypatch.setattr(os, "rename", failing_rename(lambda s, d: s.name == "notes.txt"))
    with pytest.raises(OSError), output.staged(out, owned) as stage:
        (stage.path / "summary.md").write_text("the new result\n")
    monkeypatch.undo()
    # more.txt was carried first (sorted order), then notes.txt failed: more.txt is back
    assert fingerprint(out) == before and beside(out) == []


def test_an_entry_of_the_same_name_in_the_old_and_new_folder_is_the_new_one(tmp_path):
    out = tmp_path / "out"
    old_result(out)
    with output.staged(out, owned) as stage:
        (stage.path / "notes.txt").write_text("written by the command\n")
        (stage.path / "more.txt").symlink_to("notes.txt")  # a link of that name counts too
    assert (out / "notes.txt").read_text() == "written by the command\n"
    assert (out / "more.txt").is_symlink()
    assert sorted(os.listdir(out)) == ["more.txt", "notes.txt"]  # owned ones not carried
    assert beside(out) == []


def test_every_entry_is_owned_by_default(tmp_path):
    out = tmp_path / "out"
    old_result(out)
    with output.staged(out) as stage:
        (stage.path / "new.md").write_text("x")
    assert os.listdir(out) == ["new.md"] and output.every_entry(out / "x") is True


def test_commit_swaps_once(tmp_path):
    out = tmp_path / "out"
    with output.staged(out) as stage:
        (stage.path / "a").write_text("1")
        stage.commit()
        assert (out / "a").read_text() == "1" and stage.committed
        (out / "b").write_text("written after the swap")
        stage.commit()  # again, and at the block's end: nothing moves
    assert sorted(os.listdir(out)) == ["a", "b"] and beside(out) == []


def test_a_new_out_is_made_with_its_parents(tmp_path):
    out = tmp_path / "runs" / "deep" / "out"
    with output.staged(str(out)) as stage:
        assert stage.out == out and stage.path.parent == out.parent
        (stage.path / "a").write_text("1")
    assert (out / "a").read_text() == "1" and beside(out) == []


def test_the_swap_holds_sigterm_too_and_restores_the_handlers(tmp_path):
    out = tmp_path / "out"
    old_result(out)
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    previous_int = signal.getsignal(signal.SIGINT)
    try:
        stage = output.Staging(out, owned)
        stage.path.mkdir()
        real = os.rename

        def rename(src, dst):
            if Path(dst) == out:
                os.kill(os.getpid(), signal.SIGTERM)
                assert seen == []  # held during the swap
            real(src, dst)

        os.rename = rename
        try:
            stage.commit()
        finally:
            os.rename = real
        assert seen == [signal.SIGTERM]  # delivered after it, to the handler before it
        assert signal.getsignal(signal.SIGINT) is previous_int
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert beside(out) == [] and (out / "notes.txt").exists()


def test_outside_the_main_thread_the_swap_runs_without_touching_signals(tmp_path):
    out = tmp_path / "out"
    old_result(out)
    handler = signal.getsignal(signal.SIGINT)
    errors: list[BaseException] = []

    def work():
        try:
            with output.staged(out, owned) as stage:
                (stage.path / "summary.md").write_text("from a thread\n")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert errors == [] and signal.getsignal(signal.SIGINT) is handler
    assert (out / "summary.md").read_text() == "from a thread\n" and beside(out) == []


@pytest.mark.parametrize("where", ["/", ".", ".."])
def test_the_current_folder_one_above_it_or_a_root_is_refused(tmp_path, monkeypatch, where):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    with pytest.raises(InputError) as refused:
        output.check_out(Path(where), "--out")
    assert str(refused.value) == (
        f"--out {where}: the current folder or one above it cannot be replaced: name a folder "
        "below it (e.g. runs/NAME)"
    )


def test_a_folder_below_the_current_one_is_taken_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert output.check_out(Path("runs/x")) == tmp_path / "runs" / "x"
    (tmp_path / "runs").mkdir(exist_ok=True)  # check_out made it, to probe that it is writable
    (tmp_path / "runs" / "f").write_text("")
    with pytest.raises(InputError, match=r"^--out runs/f: an existing file, not a folder"):
        output.check_out(Path("runs/f"))


def test_stale_siblings_of_another_folder_or_a_live_run_are_left(tmp_path):
    out = tmp_path / "out"
    dead = dead_pid()
    other = tmp_path / f".other.partial-{dead}"  # another output's
    other.mkdir()
    link = tmp_path / f".out.partial-{dead}"  # a stale link is removed, not followed
    target = tmp_path / "kept"
    target.mkdir()
    (target / "x").write_text("1")
    link.symlink_to(target)
    old_aside = tmp_path / f".out.old-{dead}"  # out exists: an old one aside is removed
    old_aside.mkdir()
    out.mkdir()
    output.remove_stale(out)
    assert other.exists() and not link.is_symlink() and (target / "x").exists()
    assert not old_aside.exists() and out.is_dir()
    output.remove_stale(tmp_path / "absent" / "out")  # no parent folder: nothing to do


def test_a_stale_aside_folder_is_renamed_back_only_when_out_is_missing(tmp_path):
    out = tmp_path / "out"
    dead = dead_pid()
    aside = tmp_path / f".out.old-{dead}"
    before = old_result(aside)
    out.symlink_to(tmp_path / "nowhere")  # a dangling link named out: out is taken
    output.remove_stale(out)
    assert out.is_symlink() and not aside.exists()
    out.unlink()
    old_result(aside)
    output.remove_stale(out)
    assert fingerprint(out) == before and not aside.exists()


def test_a_file_write_that_fails_leaves_the_old_text_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    output.write_text(path, "the old text")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        output.write_text(path, "the new text")
    monkeypatch.undo()
    assert path.read_text() == "the old text" and os.listdir(tmp_path) == ["report.json"]


def test_a_live_run_s_sibling_is_kept_and_the_run_left_running(tmp_path):
    """The liveness probe sends no signal: the process whose pid names the sibling runs on."""
    code = "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_DFL); time.sleep(60)"
    live = subprocess.Popen([sys.executable, "-c", code])  # SIGHUP ends it (nohup or not)
    try:
        sibling = tmp_path / f".out.partial-{live.pid}"
        sibling.mkdir()
        output.remove_stale(tmp_path / "out")
        assert sibling.is_dir()
        with pytest.raises(subprocess.TimeoutExpired):
            live.wait(timeout=1.0)  # still running: a signal 1 (SIGHUP) would have ended it
    finally:
        live.kill()
        live.wait()


def test_a_process_of_another_user_counts_as_alive(monkeypatch):
    def not_permitted(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", not_permitted)
    assert output._alive(12345) is True


def test_a_file_is_written_with_every_folder_above_it(tmp_path):
    path = tmp_path / "a" / "b" / "report.json"
    output.write_text(path, "one")
    output.write_text(path, "two")  # the folders exist by now
    assert path.read_text() == "two"


def test_the_record_of_folders_left_as_they_were_is_a_copy_and_forget_clears_it(tmp_path):
    out = tmp_path / "out"
    output.forget()
    with pytest.raises(RuntimeError), output.staged(out):
        raise RuntimeError("fails")
    record = output.left_as_it_was()
    record.append(Path("/elsewhere"))
    assert output.left_as_it_was() == [out]
    output.forget()
    assert output.left_as_it_was() == []


def test_a_first_swap_whose_rename_fails_raises_that_failure(tmp_path, monkeypatch):
    # no earlier folder: nothing to put back, and the rename's own error is the one raised
    out = tmp_path / "out"
    monkeypatch.setattr(
        os, "rename", failing_rename(lambda s, d: d == out and ".partial-" in s.name)
    )
    with pytest.raises(OSError, match="No space left on device"), output.staged(out) as stage:
        (stage.path / "a").write_text("1")
    monkeypatch.undo()
    assert not out.exists() and beside(out) == []


def test_an_entry_that_cannot_be_carried_back_does_not_hide_the_failure(tmp_path, monkeypatch):
    out = tmp_path / "out"
    old_result(out)
    real = os.rename

    def rename(src, dst):
        src, dst = Path(src), Path(dst)
        if dst == out and ".partial-" in src.name:
            raise OSError(28, "No space left on device")
        if dst == out / "more.txt":  # more.txt cannot be moved back
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="No space left on device"), output.staged(out, owned):
        pass
    monkeypatch.undo()
    # the old folder back, with the entry that could be moved back; the error raised is the
    # swap's, not the carry's
    assert {"notes.txt", "sub", "summary.md"} <= set(os.listdir(out))


def test_an_owned_entry_listed_first_does_not_stop_the_carry(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a-owned", "b-mine", "c-mine"):
        (out / name).write_text(name)
    with output.staged(out, lambda e: e.name.endswith("owned")) as stage:
        (stage.path / "new").write_text("new")
    assert sorted(os.listdir(out)) == ["b-mine", "c-mine", "new"]


def test_stale_files_and_dangling_links_are_removed_and_a_folder_that_resists_is_left(
    tmp_path, monkeypatch
):
    dead = dead_pid()
    (tmp_path / f".out.partial-{dead}").write_text("a stale file")
    (tmp_path / f".out.old-{dead}").symlink_to(tmp_path / "nowhere")  # out exists: not put back
    (tmp_path / "out").mkdir()
    output.remove_stale(tmp_path / "out")
    assert beside(tmp_path / "out") == []
    stuck = tmp_path / f".out.partial-{dead}"
    (stuck / "deep").mkdir(parents=True)

    def refused(*a, **k):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "rmdir", refused)
    output.remove_stale(tmp_path / "out")  # what cannot be removed is left, no error
    monkeypatch.undo()
    assert stuck.is_dir()


def test_a_file_s_place_is_checked_before_anything_is_computed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert output.check_file("deep/er/x.json", "--json") == tmp_path / "deep" / "er" / "x.json"
    assert (tmp_path / "deep" / "er").is_dir() and os.listdir(tmp_path / "deep" / "er") == []
    (tmp_path / "folder").mkdir()
    with pytest.raises(InputError) as e:
        output.check_file("folder", "--json")
    assert str(e.value) == "--json folder: an existing folder, not a file: name a file"
    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError) as e:
        output.check_file("afile/x.json", "--json")
    assert str(e.value) == (
        f"--json afile/x.json: cannot write in {tmp_path / 'afile'} (File exists): name a "
        "place you can write"
    )


def test_a_place_that_cannot_be_written_is_refused_naming_the_flag_and_value():
    # /proc/self exists and takes no new file, even from root
    with pytest.raises(InputError) as e:
        output.check_file("/proc/self/x.json", "--json")
    assert str(e.value).startswith("--json /proc/self/x.json: cannot write in /proc/self (")
    assert str(e.value).endswith("): name a place you can write")
    with pytest.raises(InputError) as e:
        output.check_out(Path("/proc/self/out"), "--out-dir")
    assert str(e.value).startswith("--out-dir /proc/self/out: cannot write in /proc/self (")


def test_the_probe_is_a_hidden_file_removed_at_once(tmp_path, monkeypatch):
    probes = []
    real = os.unlink

    def unlink(path, *a, **k):
        probes.append(Path(path))
        assert Path(path).exists()
        real(path, *a, **k)

    monkeypatch.setattr(os, "unlink", unlink)
    output.writable(tmp_path, "--out", tmp_path)
    monkeypatch.undo()
    assert len(probes) == 1 and probes[0].parent == tmp_path
    assert probes[0].name.startswith(".rescue-probe-") and os.listdir(tmp_path) == []
