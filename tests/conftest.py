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
