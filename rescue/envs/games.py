"""The two text games, played through their own packages: TextWorld's cooking games and
ALFWorld's TextWorld games.

Specification
-------------
``open_game(env, path)`` returns a ``rescue.envs.episode.TextGame``:

- ``cooking``: ``textworld.start(path)`` on a game ``tw-make tw-cooking`` wrote (``.z8``
  with its ``.json``), asking for the admissible commands, ``won``, ``lost`` and the
  objective. The task is the game's objective; the observation is the game's feedback,
  the welcome banner of the first one cut (everything before the first room header
  ``-= Room =-``).
- ``alfworld``: ``textworld.start(path)`` on a ``game.tw-pddl`` of ALFWorld's data (its
  PDDL backend), wrapped as ALFWorld's own training environment wraps it
  (``alfworld.agents.environment.alfred_tw_env.AlfredTWEnv.init_env``: ``AlfredDemangler``
  without shuffling, then ``AlfredInfos``). The task is what follows "Your task is to: " in
  the first observation (the recipe's ``extract_task``); ALFWorld games are never lost
  (TextWorld's PDDL backend sets ``lost`` to False), so they have two outcomes.

Paths may hold ``$VARS`` (``$ALFWORLD_DATA/...``), expanded when the game is opened. The
packages are imported here, when a game is opened (the ``[agent]`` extra), never when
``rescue`` is imported.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from rescue.envs.episode import Observation
from rescue.errors import InputError

#: The games ``open_game`` plays.
ENVS = ("alfworld", "cooking")

_TASK_MARK = "Your task is to: "
#: Games are opened one at a time: TextWorld parses its knowledge base and grammar into
#: module-level caches on the first load (seconds), which concurrent episodes of a step
#: (threads of one process) would otherwise all parse at once; later loads take
#: milliseconds.
_OPEN = threading.Lock()


def _infos() -> Any:
    import textworld

    return textworld.EnvInfos(admissible_commands=True, won=True, lost=True, objective=True)


def _observation(state: Any) -> Observation:
    return Observation(
        text=str(state.feedback).strip(),
        admissible=tuple(state["admissible_commands"] or ()),
        won=bool(state["won"]),
        lost=bool(state["lost"]),
    )


class CookingGame:
    """A TextWorld cooking game (``tw-make tw-cooking``)."""

    def __init__(self, path: str) -> None:
        import warnings

        import textworld

        self.path = path
        self.task = ""
        with warnings.catch_warnings():
            # Jericho warns that it cannot score TextWorld's own games; TextWorld's wrapper
            # (TWInform7) keeps the score, won and lost itself.
            warnings.filterwarnings("ignore", message=".*is not fully supported")
            with _OPEN:
                self._env = textworld.start(path, request_infos=_infos())

    def reset(self) -> Observation:
        state = self._env.reset()
        self.task = str(state["objective"]).strip()
        obs = _observation(state)
        text = obs.text
        header = text.find("-= ")
        return Observation(text[header:] if header > 0 else text, obs.admissible, obs.won, obs.lost)

    def step(self, command: str) -> Observation:
        state, _, _ = self._env.step(command)
        return _observation(state)

    def close(self) -> None:
        self._env.close()


class AlfworldGame:
    """An ALFWorld TextWorld game (``game.tw-pddl``), wrapped as ALFWorld trains on it."""

    def __init__(self, path: str) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        self.path = path
        self.task = ""
        with _OPEN:
            self._env = textworld.start(
                path,
                request_infos=_infos(),
                wrappers=[AlfredDemangler(shuffle=False), AlfredInfos],
            )

    def reset(self) -> Observation:
        obs = _observation(self._env.reset())
        at = obs.text.find(_TASK_MARK)
        if at == -1:
            raise InputError(f"{self.path}: the first observation has no '{_TASK_MARK}'")
        self.task = obs.text[at + len(_TASK_MARK) :].strip()
        return obs

    def step(self, command: str) -> Observation:
        state, _, _ = self._env.step(command)
        return _observation(state)

    def close(self) -> None:
        self._env.close()


def open_game(env: str, path: str) -> CookingGame | AlfworldGame:
    """The game at ``path`` (``$VARS`` expanded) under ``env``."""
    full = os.path.expandvars(path)
    if env not in ENVS:
        raise InputError(f"env={env!r} is not a text game; allowed: {', '.join(ENVS)}")
    if not os.path.isfile(full):
        raise InputError(f"no game file {full} (from {path!r}): run make agent-prepare ENV={env}")
    return CookingGame(full) if env == "cooking" else AlfworldGame(full)
