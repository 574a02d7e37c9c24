"""One episode of a text game as the policy sees it: the prompt of each step, the action
read from each reply, the cap, the outcome.

Specification
-------------
The format is the public ALFWorld recipe the plan cites (verl-agent,
``agent_system/environments/prompts/alfworld.py``, ``env_manager.py``, ``memory.py``,
``env_package/alfworld/projection.py``), so that its published curves are the reference:

- every step is its own prompt (no concatenated transcript): the task, how many steps were
  taken, the last ``history`` (observation, action) pairs as
  ``[Observation k: '<obs>', Action k: '<action>']`` lines, the current step number, the
  current observation and the admissible actions as ``'<a>'`` joined by ``"\\n "``
  (``help`` left out); the first step's prompt has no history part;
- the action is the text between the first ``<action>`` and the next ``</action>`` of the
  reply, its characters that are not printable removed (a NUL hangs the Z-machine
  interpreter TextWorld plays the games with, found when the CPU rehearsal's tiny model
  wrote one), stripped and lower-cased. A reply is *valid* when it has both action tags and
  both ``<think>`` tags; an invalid reply is still played, as the recipe does: its command
  is the tag's content when it has one, else the reply's last 30 characters (lower-cased),
  and the game's answer is the next observation. An invalid or inadmissible action is an
  observation, never an error; ``invalid`` and ``inadmissible`` count them;
- the episode ends when the game is won or lost, or after ``cap`` actions (the recipe's
  ``env.max_steps``: 50 for ALFWorld, 15 for the cooking games).

Outcomes (the census' classes, through ``rescue.outcomes``; ``exit_status`` is what the
generate function writes to the sample's metadata):

======================  ==================  =================  ========  ======
how the episode ended   exit_status         outcome            reason    reward
======================  ==================  =================  ========  ======
the game is won         ``won``             solved             won       1
the game is lost        ``lost``            submitted_failure  lost      0
``cap`` actions taken   ``max_turns``       budget_failure     turn_cap  0
the game raised         ``env_error``       infra_no_result    env_error none
======================  ==================  =================  ========  ======

(The generate function adds the engine's cases: a prompt that no longer fits the context,
``length``, a budget failure; an engine fault or abort, an infrastructure no-result.)
Invariants: exactly one of won, lost, capped or faulted once ``done``; ``steps <= cap``;
no action is taken after ``done``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rescue.errors import InputError

#: The recipe's closing instructions, word for word (its trailing space after "tags." too).
_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning "
    "process MUST be enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags.\n"
)
#: The recipe's prompt of the first step (no history), with ``{intro}`` naming the game.
FIRST_TEMPLATE = (
    "\n{intro} Your task is to: {task_description}\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    + _INSTRUCTIONS
)
#: The recipe's prompt of later steps. "observaitons" is the recipe's own spelling: the
#: prompt is kept word for word so that a model sees what the published runs saw.
STEP_TEMPLATE = (
    "\n{intro} Your task is to: {task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most "
    "recent {history_length} observaitons and the corresponding actions you took: "
    "{action_history}\n"
    "You are now at step {current_step} and your current observation is: "
    "{current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    + _INSTRUCTIONS
)

#: The first sentence of each game's prompt.
INTROS = {
    "alfworld": "You are an expert agent operating in the ALFRED Embodied Environment.",
    "cooking": "You are an expert agent playing a TextWorld cooking game.",
}

#: How an episode ended -> the ``exit_status`` the sample carries (rescue.outcomes reads it).
EXIT_STATUSES = {"won": "won", "lost": "lost", "capped": "max_turns", "faulted": "env_error"}

_CHINESE = re.compile(r"[\u4e00-\u9fff]")


@dataclass(frozen=True)
class Observation:
    """What a game returns after a reset or an action."""

    text: str
    admissible: tuple[str, ...]
    won: bool = False
    lost: bool = False


class TextGame(Protocol):
    """A text game: ``task`` after ``reset``; ``step`` answers a command."""

    task: str

    def reset(self) -> Observation: ...

    def step(self, command: str) -> Observation: ...


@dataclass(frozen=True)
class Action:
    """A reply read as an action (the recipe's projection)."""

    command: str
    valid: bool


def _printable(text: str) -> str:
    """``text`` without the characters that are not printable (control characters)."""
    return "".join(ch for ch in text if ch.isprintable())


def read_action(reply: str) -> Action:
    """The command of a reply and whether the reply is valid (module docstring)."""
    lower = reply.lower()
    start, end = lower.find("<action>"), lower.find("</action>")
    if start == -1 or end == -1:
        return Action(_printable(lower[-30:]), False)
    command = _printable(lower[start + len("<action>") : end]).strip()
    valid = "<think>" in reply and "</think>" in reply and not _CHINESE.search(reply)
    return Action(command, valid)


def admissible_text(admissible: Sequence[str]) -> str:
    """The recipe's list of admissible actions (``help`` left out)."""
    return "\n ".join(f"'{a}'" for a in admissible if a != "help")


@dataclass
class Episode:
    """One episode of ``game`` under the recipe's format (module docstring).

    ``start()`` resets the game; then, until ``done``, ``prompt`` is the next step's prompt
    and ``act(reply)`` plays the model's reply. A game that raises ends the episode as
    ``faulted`` with the error in ``error``.
    """

    game: TextGame
    env: str
    cap: int
    history: int = 2
    steps: int = 0
    invalid: int = 0
    inadmissible: int = 0
    ending: str | None = None
    error: str | None = None
    _observation: Observation | None = field(default=None, repr=False)
    _memory: list[tuple[str, str]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.env not in INTROS:
            raise InputError(f"env={self.env!r} is not a text game; allowed: {', '.join(INTROS)}")
        if self.cap < 1:
            raise InputError(f"cap={self.cap!r} must be a positive number of actions")
        if self.history < 0:
            raise InputError(f"history={self.history!r} must be >= 0 (pairs shown)")

    @property
    def done(self) -> bool:
        return self.ending is not None

    def start(self) -> None:
        """Reset the game (a raise ends the episode as ``faulted``)."""
        try:
            self._observe(self.game.reset())
        except Exception as e:  # the game's own fault: no result, never a failure
            self._fault(e)

    @property
    def admissible(self) -> tuple[str, ...]:
        """The admissible commands of the current observation (empty before ``start``)."""
        return self._observation.admissible if self._observation is not None else ()

    @property
    def prompt(self) -> str:
        """The prompt of the next step."""
        if self.done or self._observation is None:
            raise InputError("the episode has no next step: it has ended or was not started")
        obs = self._observation
        fields = {
            "intro": INTROS[self.env],
            "task_description": self.game.task,
            "current_observation": obs.text,
            "admissible_actions": admissible_text(obs.admissible),
        }
        if not self._memory or self.history == 0:
            return FIRST_TEMPLATE.format(**fields)
        recent = self._memory[-self.history :]
        first = len(self._memory) - len(recent) + 1
        lines = [
            f"[Observation {first + j}: '{o}', Action {first + j}: '{a}']"
            for j, (o, a) in enumerate(recent)
        ]
        return STEP_TEMPLATE.format(
            **fields,
            step_count=len(self._memory),
            history_length=len(recent),
            action_history="\n".join(lines),
            current_step=len(self._memory) + 1,
        )

    def act(self, reply: str) -> Action:
        """Play one reply; returns the action read from it."""
        if self.done or self._observation is None:
            raise InputError("the episode has ended: no more actions")
        action = read_action(reply)
        self.invalid += not action.valid
        self.inadmissible += action.command not in self._observation.admissible
        self._memory.append((self._observation.text, action.command))
        self.steps += 1
        try:
            self._observe(self.game.step(action.command))
        except Exception as e:
            self._fault(e)
            return action
        if not self.done and self.steps >= self.cap:
            self.ending = "capped"
        return action

    def _observe(self, obs: Observation) -> None:
        self._observation = obs
        if obs.won:
            self.ending = "won"
        elif obs.lost:
            self.ending = "lost"

    def _fault(self, error: Exception) -> None:
        self.ending = "faulted"
        self.error = f"{type(error).__name__}: {error}"

    @property
    def exit_status(self) -> str:
        """The ``exit_status`` of the ended episode (``EXIT_STATUSES``)."""
        if self.ending is None:
            raise InputError("the episode has not ended")
        return EXIT_STATUSES[self.ending]

    @property
    def reward(self) -> float | None:
        """1 on a win, 0 otherwise; ``None`` when the game faulted (no result)."""
        if self.ending == "faulted":
            return None
        return 1.0 if self.ending == "won" else 0.0

    def metadata(self, exit_status: str | None = None) -> dict[str, object]:
        """What the samples of this episode carry (read by ``rescue.outcomes``, the census);
        ``exit_status`` names an end the game did not see (the engine's: the context, a
        fault), else the episode must have ended."""
        meta: dict[str, object] = {
            "env": self.env,
            "exit_status": exit_status or self.exit_status,
            "turns": self.steps,
            "invalid_actions": self.invalid,
            "inadmissible_actions": self.inadmissible,
        }
        if self.error is not None:
            meta["env_error"] = self.error
        return meta
