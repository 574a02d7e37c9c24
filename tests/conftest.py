"""The test tiers (pyproject's markers): ``make test`` runs ``-m "not slow and not agent"``,
``make test-all`` and CI run everything.

A test that plays the cooking games (it uses the ``cooking_games`` fixture, directly or
through another fixture) needs the ``[agent]`` extra, whose TextWorld and ALFWorld build
from source on install: it is marked ``agent`` here, so the newcomer's tier, which does not
install that extra, leaves it out instead of skipping it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_SOURCES = pytest.StashKey[dict]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cooking_games" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.agent)


# ── the framework sources are read, never written ───────────────────────────────────────

SOURCE_VARIABLES = ("MILES_SRC", "SLIME_SRC", "MEGATRON_SRC")


def _source_files(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime in ns) of every file below ``root`` but Python's byte-code caches."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and d != ".git"]
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            found[path] = (st.st_size, st.st_mtime_ns)
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    """Record the files of the framework sources the tests run against (MILES_SRC,
    SLIME_SRC, MEGATRON_SRC), for ``pytest_sessionfinish`` to compare."""
    session.config.stash[_SOURCES] = {
        name: _source_files(Path(os.environ[name]))
        for name in SOURCE_VARIABLES
        if os.environ.get(name) and Path(os.environ[name]).is_dir()
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a test changed or removed a file of a framework source: a test
    that writes into the user's checkout (once, an empty train.py) breaks every later run
    against it, silently."""
    changed = []
    for name, before in session.config.stash.get(_SOURCES, {}).items():
        after = _source_files(Path(os.environ[name]))
        changed += [f"{name}: {path} {'removed' if path not in after else 'changed'}"
                    for path, stat in before.items() if after.get(path) != stat]  # fmt: skip
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["tests changed the framework sources they read:", *changed[:20]]
        if len(changed) > 20:
            lines.append(f"... and {len(changed) - 20} more")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line("\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _spare_the_sessions_own_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt handler (``rescue.interrupts``, ``rescue.stages``) ends every process below
    the one it runs in. In a test session that process is pytest's, and below it live services
    earlier tests started and later ones use (wandb's service, a module's Ray head): a test
    that raises an interrupt there sees only the processes started since it began."""
    from rescue import interrupts

    real = interrupts.descendants
    spared = set(real())
    monkeypatch.setattr(
        interrupts, "descendants", lambda pid=None: [p for p in real(pid) if p not in spared]
    )


#: Tests that left a signal handler changed (restored after each; listed at the session's end).
_HANDLERS_LEFT: list[str] = []


@pytest.fixture(autouse=True)
def _signal_handlers_restored(request: pytest.FixtureRequest):
    """SIGINT's and SIGTERM's handlers as they were before each test: a test that changes
    them (an interrupt handler, a worker's settings made in this process) leaves the next
    test the handlers pytest set, and is named at the session's end."""
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in before.items():
        if handler is not None and signal.getsignal(s) is not handler:
            _HANDLERS_LEFT.append(f"{request.node.nodeid} ({signal.Signals(s).name})")
            signal.signal(s, handler)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _HANDLERS_LEFT:
        terminalreporter.write_line(
            "signal handlers a test left changed (restored): " + "; ".join(_HANDLERS_LEFT)
        )
