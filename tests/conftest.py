"""The test tiers (pyproject's markers): ``make test`` runs ``-m "not slow and not agent"``,
``make test-all`` and CI run everything.

A test that plays the cooking games (it uses the ``cooking_games`` fixture, directly or
through another fixture) needs the ``[agent]`` extra, whose TextWorld and ALFWorld build
from source on install: it is marked ``agent`` here, so the newcomer's tier, which does not
install that extra, leaves it out instead of skipping it.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cooking_games" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.agent)
