"""Real cooking games for the tests, made once per session by TextWorld's own ``tw-make``.

``cooking_games`` (session fixture) makes one game of each level in ``LEVELS`` from seed
``SEED`` with ``rescue.envs.prepare.cooking_rows`` (offline: tw-make compiles them with the
Inform 7 compiler TextWorld ships), in a session temporary folder, and returns the rows.
Tests that need TextWorld skip without it (``pip install -e '.[agent]'``).

``RESCUE_TEST_GAMES`` (default unset): a folder to keep the games in between sessions
(tw-make takes about ten CPU-seconds a game); a game already there is reused, as
``make agent-prepare`` reuses one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The set every test plays: fixed before any test was written.
SEED = 7
#: Level 1 (one ingredient in the kitchen) and level 2 (a container to open, a cut).
LEVELS = (1, 2)


@pytest.fixture(scope="session")
def cooking_games(tmp_path_factory) -> list[dict]:
    pytest.importorskip("textworld", reason="the cooking games need TextWorld: .[agent]")
    from rescue.envs.prepare import cooking_rows

    kept = os.environ.get("RESCUE_TEST_GAMES")
    folder = Path(kept) if kept else tmp_path_factory.mktemp("cooking")
    rows, skipped = cooking_rows(folder, games=1, seed=SEED, cap=15, levels=LEVELS)
    assert skipped == 0 and len(rows) == len(LEVELS)
    return rows
