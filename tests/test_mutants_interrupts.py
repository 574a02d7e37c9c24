"""``rescue.interrupts``, piece by piece, on processes this test starts and owns: the tree read
from ``/proc`` and from ``ps`` alike (children first), SIGTERM then SIGKILL after the grace
for what ignores it, the handler's nesting and what it restores, the exit statuses, and a
worker's signal settings read back from inside the worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rescue import interrupts
from rescue.interrupts import Interrupted, descendants, end_tree, exit_status, signal_name

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")

#: A parent that starts a child, which starts a grandchild in a session of its own; each
#: prints its pid and waits.
TREE = """
import subprocess, sys, time
code = sys.argv[1]
if code == "top":
    subprocess.Popen([sys.executable, "-c", __import__("inspect").cleandoc('''
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True)
        time.sleep(60)
    ''')])
time.sleep(60)
"""


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def tree() -> subprocess.Popen:
    top = subprocess.Popen([sys.executable, "-c", TREE, "top"])
    wait_for(lambda: len(descendants(top.pid)) == 2)
    return top


def test_the_tree_is_children_first_and_the_same_from_ps(monkeypatch, tmp_path):
    top = tree()
    try:
        below = descendants(top.pid)
        child, grandchild = below
        assert descendants(child) == [grandchild] and descendants(grandchild) == []
        assert top.pid in descendants(os.getpid())  # default: below this process
        real = Path
        monkeypatch.setattr(
            interrupts, "Path", lambda p: real(tmp_path) if p == "/proc" else real(p)
        )
        assert descendants(top.pid) == below  # read from ps
    finally:
        monkeypatch.undo()
        end_tree([top.pid, *descendants(top.pid)], grace_s=5)
        top.wait()


def test_a_process_named_with_spaces_and_parentheses_is_read_right(tmp_path):
    exe = tmp_path / "a (b) c"
    exe.symlink_to(sys.executable)
    p = subprocess.Popen([str(exe), "-c", "import time; time.sleep(60)"])
    try:
        wait_for(lambda: p.pid in descendants())
        assert ") c" in Path(f"/proc/{p.pid}/stat").read_text()  # the comm holds them
    finally:
        p.kill()
        p.wait()


def _signalled(path: Path, then: str) -> subprocess.Popen:
    """A process that writes ``term`` to ``path`` on SIGTERM, then ``then`` ("exit" or
    "stay": ignore it and wait)."""
    code = (
        "import signal, sys, time\n"
        f"def on_term(s, f):\n    open({str(path)!r}, 'a').write('term')\n"
        f"    {'sys.exit(0)' if then == 'exit' else 'pass'}\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    return p


def test_what_ignores_sigterm_is_killed_after_the_grace_and_what_obeys_is_not(tmp_path):
    stubborn = _signalled(tmp_path / "stubborn", "stay")
    obedient = _signalled(tmp_path / "obedient", "exit")
    start = time.monotonic()
    alive = end_tree([stubborn.pid, obedient.pid, os.getpid()], grace_s=1.5)
    took = time.monotonic() - start
    assert alive == [stubborn.pid, obedient.pid]  # never this process
    # both were asked first (SIGTERM); both have exited when it returns, left to their owner
    # (here) to reap
    assert (tmp_path / "stubborn").read_text() == "term" == (tmp_path / "obedient").read_text()
    assert zombie(stubborn.pid) and zombie(obedient.pid)
    assert stubborn.wait(timeout=0) == -signal.SIGKILL and obedient.wait(timeout=0) == 0
    assert took >= 1.5  # the stubborn one was given the grace before SIGKILL
    assert end_tree([], grace_s=1.0) == []


def zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and not been reaped."""
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def test_an_exited_child_counts_as_gone_and_is_left_to_its_owner_to_reap():
    p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    wait_for(lambda: zombie(p.pid))
    assert interrupts._gone(p.pid)
    assert interrupts._gone(p.pid)  # seen again: not reaped by the first look
    assert zombie(p.pid)
    assert p.wait(timeout=0) == 3  # its owner still reads its exit status
    assert not interrupts._gone(os.getpid())


def test_signal_names_and_exit_statuses():
    assert str(Interrupted(signal.SIGTERM)) == "SIGTERM" and Interrupted().signum == 2
    assert Interrupted(signal.SIGTERM).name == "SIGTERM" and Interrupted().name == "SIGINT"
    assert isinstance(Interrupted(), KeyboardInterrupt)
    assert signal_name(KeyboardInterrupt()) == "SIGINT"
    assert signal_name(Interrupted(signal.SIGTERM)) == "SIGTERM"
    assert exit_status(KeyboardInterrupt()) == 130 and exit_status(Interrupted(15)) == 143
    assert interrupts.GRACE_S == 10.0


def test_sigterm_inside_the_block_ends_the_tree_first_then_raises_there(monkeypatch):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    top = tree()
    below = [top.pid, *descendants(top.pid)]
    # The handler ends every process below this one; in a test session that includes
    # services other tests started (wandb's), so it sees only this test's tree.
    real = interrupts.descendants
    monkeypatch.setattr(interrupts, "descendants",
                        lambda pid=None: [p for p in real(pid) if p in below])  # fmt: skip
    with pytest.raises(Interrupted) as raised, interrupts.handled():
        with interrupts.handled():  # nested: one block
            assert signal.getsignal(signal.SIGTERM) is interrupts._on_signal
        assert signal.getsignal(signal.SIGTERM) is interrupts._on_signal  # still the outer's
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
    assert raised.value.signum == signal.SIGTERM
    assert top.poll() is not None  # ended (and reaped) before the exception arrived
    assert all(not Path(f"/proc/{p}").exists() or
               Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] == "Z"
               for p in below)  # fmt: skip
    assert {s: signal.getsignal(s) for s in before} == before
    assert interrupts._DEPTH == 0


def test_a_default_handler_of_none_is_restored_as_the_default(monkeypatch):
    real = signal.signal
    calls = []

    def record(s, h):
        calls.append((s, h))
        old = real(s, h if h is not None else signal.SIG_DFL)
        return None if s == signal.SIGTERM else old  # as for a handler not set from Python

    monkeypatch.setattr(signal, "signal", record)
    with interrupts.handled():
        pass
    monkeypatch.undo()
    assert calls[-1] == (signal.SIGTERM, signal.SIG_DFL) or calls[-2] == (
        signal.SIGTERM, signal.SIG_DFL)  # fmt: skip
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_outside_the_main_thread_the_block_changes_no_handler():
    seen = []

    def work():
        with interrupts.handled():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [before] and interrupts._DEPTH == 0


def test_a_worker_ignores_sigint_takes_sigterm_and_dies_with_its_parent():
    code = (
        "import ctypes, signal\n"
        "from rescue.interrupts import worker_initializer\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "worker_initializer()\n"
        "sig = ctypes.c_int(0)\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig))\n"  # PR_GET_PDEATHSIG
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN,"
        " signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, sig.value)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True", str(int(signal.SIGKILL))], out.stderr


def test_a_worker_s_settings_made_in_this_process_then_undone():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        interrupts.worker_initializer()
        sig = ctypes.c_int(0)
        libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert sig.value == int(signal.SIGKILL)
    finally:
        libc.prctl(1, 0)  # PR_SET_PDEATHSIG: none again
        for s, h in saved.items():
            signal.signal(s, h)


def test_the_ps_listing_is_read_line_by_line_and_cannot_hang(monkeypatch, tmp_path):
    asked = []

    class Listing:
        stdout = "PID PPID\n 101 1\n102 101\n  7\nx 101\n103 y\n104 102 extra\n105 101\n"

    def ps(argv, **kw):
        asked.append((argv, kw.get("timeout")))
        return Listing()

    real = Path
    monkeypatch.setattr(interrupts, "Path", lambda p: real(tmp_path) if p == "/proc" else real(p))
    monkeypatch.setattr(interrupts.subprocess, "run", ps)
    assert interrupts._children_table() == {1: [101], 101: [102, 105]}
    assert asked[0][0] == ["ps", "-A", "-o", "pid=,ppid="]
    assert isinstance(asked[0][1], (int, float)) and 0 < asked[0][1] <= 60

    def hung(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw.get("timeout") or 0)

    monkeypatch.setattr(interrupts.subprocess, "run", hung)
    assert interrupts._children_table() == {}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid names no process
    return p.pid


def test_gone_and_alive_as_the_process_table_says(monkeypatch):
    assert interrupts._gone(_dead_pid())
    # a zombie that is not this process's child (its parent does not reap it): gone
    code = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
            "print(pid, flush=True)\ntime.sleep(60)\n")  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        zombie = int(parent.stdout.readline())
        wait_for(lambda: Path(f"/proc/{zombie}/stat").read_text().split(")")[-1].split()[0] == "Z")
        assert interrupts._gone(zombie)
    finally:
        parent.kill()
        parent.wait()

    def not_permitted(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", not_permitted)
    assert not interrupts._gone(1)  # another user's live process


def test_ending_processes_that_are_already_gone_is_no_error():
    dead = _dead_pid()
    assert end_tree([dead], grace_s=0) == [dead]  # SIGTERM and SIGKILL to no process
    assert end_tree([dead], grace_s=1) == [dead]


def test_the_grace_ends_as_soon_as_every_process_is_gone(monkeypatch):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    clock = [0.0]
    naps = []
    real_sleep = time.sleep

    def nap(s):
        naps.append(s)
        clock[0] += s
        real_sleep(0.01)  # real time for the signal to land

    monkeypatch.setattr(interrupts.time, "sleep", nap)
    monkeypatch.setattr(interrupts.time, "monotonic", lambda: clock[0])
    end_tree([p.pid], grace_s=1000.0)
    assert sum(naps) < 100.0  # not the whole grace: it stopped once the process was gone


def test_a_process_that_vanishes_while_the_table_is_read_is_skipped(monkeypatch, tmp_path):
    # a /proc of twenty processes, every other one gone between the listing and its read
    # (no stat file): the others are all in the table, whichever order the folder lists
    for pid in range(2, 22):
        (tmp_path / str(pid)).mkdir()
        if pid % 2 == 0:
            (tmp_path / str(pid) / "stat").write_text(f"{pid} (w (x) y) S 1 {pid} 0\n")
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_text("1 (init) S 0 1 0\n")
    real = Path
    monkeypatch.setattr(interrupts, "Path", lambda p: real(tmp_path) if p == "/proc" else real(p))
    table = interrupts._children_table()
    assert sorted(table) == [1] and sorted(table[1]) == list(range(2, 22, 2))


def _blind_proc(monkeypatch, tmp_path):
    """``/proc/<pid>/stat`` unreadable to ``rescue.interrupts`` (as where there is none)."""
    real = Path
    monkeypatch.setattr(
        interrupts, "Path",
        lambda p: real(tmp_path / "none") if str(p).startswith("/proc/") else real(p),
    )  # fmt: skip


def test_an_exited_child_is_seen_gone_without_proc(monkeypatch, tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    wait_for(lambda: zombie(p.pid))
    _blind_proc(monkeypatch, tmp_path)
    assert interrupts._gone(p.pid)  # waitid sees it exited; the process table cannot
    assert p.wait(timeout=0) == 4


def test_looking_at_a_live_process_sends_it_nothing(monkeypatch, tmp_path):
    # SIGHUP's default ends a process: a look that sent a signal would end this one
    code = ("import signal, time\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        assert not interrupts._gone(p.pid)
        _blind_proc(monkeypatch, tmp_path)
        assert not interrupts._gone(p.pid)  # alive, its state unreadable: not gone
        time.sleep(0.3)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_a_zombie_named_with_parentheses_is_gone(tmp_path):
    # not this process's child: only its state in /proc tells it has exited, after a name
    # that holds ") "
    exe = tmp_path / "a (b) c"
    exe.symlink_to(sys.executable)
    code = (f"import subprocess, sys, time\np = subprocess.Popen([{str(exe)!r}, '-c', 'pass'])\n"
            "print(p.pid, flush=True)\ntime.sleep(60)\n")  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        wait_for(lambda: zombie(child))
        assert ") c) Z" in Path(f"/proc/{child}/stat").read_text()
        assert interrupts._gone(child)
    finally:
        parent.kill()
        parent.wait()
