"""Output folders and files that a failed or interrupted command never destroys.

Specification
-------------
A command that writes a folder ``OUT`` first validates its inputs and reaches the resources
it needs (Ray, a dataset, a checkpoint), then writes into a temporary sibling,
``.<name>.partial-<pid>`` beside ``OUT`` (``staged``), and swaps it in only when it has
finished (``Staging.commit``):

1. the entries of the old ``OUT`` that the command does not own (``owned(entry)`` false: a
   file of the user's, another command's output) move into the new folder, unless the new
   folder has an entry of that name;
2. the old ``OUT`` is renamed ``.<name>.old-<pid>`` and the new folder renamed ``OUT``;
3. the old folder is removed.

SIGINT and SIGTERM are held back during the swap and the removal of the old folder
(delivered after them), so an interrupt finds either the previous folder or the new one,
with the user's entries in it, and nothing beside it. Any exception before the swap, an
interrupt included, removes the temporary sibling and leaves ``OUT`` as it was; an error
during the swap moves what it had moved back. ``left_as_it_was()`` names the folders this
process staged and did not swap in since ``forget()`` (what the ``rescue`` command's
interrupt line names).
Temporary siblings left by a killed run (their pid no longer alive) are removed the next
time the same ``OUT`` is staged; a previous folder a run killed during its swap left as
``.<name>.old-<pid>`` without ``OUT`` is renamed back to ``OUT``.

A file is written the same way: ``write_text`` writes ``.<name>.partial-<pid>`` beside it,
flushes it to disk and renames it over the file, so a reader sees the old text or the new.

``OUT`` may not be the current folder, one above it or a file system's root (the swap
renames it): such an ``--out`` is refused, as is one that is an existing file, or one whose
folder cannot be written (``check_out`` creates it and writes a probe file there, before
the command computes anything); ``check_file`` does the same for a file a command writes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from rescue.errors import InputError

#: ``owned(entry)``: whether an entry (a path) of an old output folder belongs to the
#: command (it is replaced) or not (it is carried into the new folder).
Owned = Callable[[Path], bool]

_LEFT: list[Path] = []
_STALE = re.compile(r"^\.(?P<name>.+)\.(?:partial|old)-(?P<pid>[0-9]+)$")


def every_entry(entry: Path) -> bool:
    """``owned`` for a folder the command writes whole: every old entry is replaced."""
    return True


def left_as_it_was() -> list[Path]:
    """The output folders staged and not swapped in since ``forget()``."""
    return list(_LEFT)


def forget() -> None:
    """Start a new record for ``left_as_it_was`` (the ``rescue`` command calls it first)."""
    _LEFT.clear()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_out(out: Path, flag: str = "--out") -> Path:
    """``out`` as an absolute path, or an error naming ``flag`` when it cannot be replaced
    (a file, the current folder or one above it, a root)."""
    resolved = Path(os.path.abspath(out))
    if resolved.exists() and not resolved.is_dir():
        raise InputError(f"{flag} {out}: an existing file, not a folder: name a folder")
    cwd = Path.cwd().resolve()
    real = resolved.resolve()
    if real == real.parent or real == cwd or real in cwd.parents:
        raise InputError(
            f"{flag} {out}: the current folder or one above it cannot be replaced: "
            "name a folder below it (e.g. runs/NAME)"
        )
    writable(resolved.parent, flag, out)
    return resolved


def check_file(path: str | os.PathLike[str], flag: str) -> Path:
    """``path`` as an absolute path, or an error naming ``flag`` when a file cannot be
    written there (a folder, or a place that cannot be written): checked before a command
    computes what it will write."""
    resolved = Path(os.path.abspath(path))
    if resolved.is_dir():
        raise InputError(f"{flag} {path}: an existing folder, not a file: name a file")
    writable(resolved.parent, flag, path)
    return resolved


def writable(folder: Path, flag: str, given: str | os.PathLike[str]) -> None:
    """Create ``folder`` (with its parents) and write and remove a probe file in it, or an
    error naming ``flag`` and its value ``given``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".rescue-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InputError(
            f"{flag} {given}: cannot write in {folder} ({e.strerror or e}): name a place "
            "you can write"
        ) from None


def remove_stale(out: Path) -> None:
    """Temporary siblings of ``out`` left by a run that no longer exists; an earlier result
    a run killed in the middle of its swap left renamed (``.old-``, and no ``out``) is put
    back instead."""
    if not out.parent.is_dir():
        return
    for entry in sorted(out.parent.iterdir()):
        m = _STALE.match(entry.name)
        if not (m and m["name"] == out.name and not _alive(int(m["pid"]))):
            continue
        if ".old-" in entry.name and not out.exists() and not out.is_symlink():
            os.rename(entry, out)
        else:
            _remove(entry)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM received while the block runs are delivered when it ends (in the
    main thread, where Python runs signal handlers; elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {
        s: signal.signal(s, lambda signum, frame: caught.append(signum))
        for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])


class Staging:
    """A new output folder being written beside ``out``; ``commit`` swaps it in."""

    def __init__(self, out: Path, owned: Owned = every_entry) -> None:
        self.out = out
        self.owned = owned
        self.path = out.with_name(f".{out.name}.partial-{os.getpid()}")
        self.committed = False

    def commit(self) -> None:
        """Swap the new folder in (module docstring); idempotent."""
        if self.committed:
            return
        with _signals_held():
            carried: list[str] = []
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            try:
                if self.out.is_dir():
                    for entry in sorted(self.out.iterdir()):
                        target = self.path / entry.name
                        if self.owned(entry) or target.exists() or target.is_symlink():
                            continue
                        os.rename(entry, target)
                        carried.append(entry.name)
                    os.rename(self.out, old)
                os.rename(self.path, self.out)
            except BaseException:
                if old.exists() and not self.out.exists():
                    os.rename(old, self.out)
                for name in carried:
                    with contextlib.suppress(OSError):
                        os.rename(self.path / name, self.out / name)
                raise
            self.committed = True
            _remove(old)


@contextlib.contextmanager
def staged(out: str | os.PathLike[str], owned: Owned = every_entry) -> Iterator[Staging]:
    """Write a new ``out`` into ``Staging.path``; swapped in when the block ends without
    an exception (or earlier by ``commit``); on any exception the temporary folder is
    removed and ``out`` is left as it was."""
    target = check_out(Path(out))
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    stage = Staging(target, owned)
    _remove(stage.path)
    stage.path.mkdir()
    try:
        yield stage
        stage.commit()
    finally:
        if not stage.committed:
            _LEFT.append(target)
            _remove(stage.path)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace the file ``path`` with ``text`` atomically (module docstring)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
