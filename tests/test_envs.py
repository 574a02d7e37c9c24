"""The text games without a framework: the recipe's prompt and action format, real cooking
games won, lost, capped and played with invalid actions, faults, and the prepared rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_games import SEED
from conftest_games import cooking_games as cooking_games  # a fixture
from textgame_engine import admissible_of, walkthrough

from rescue.envs.episode import Episode, Observation, admissible_text, read_action
from rescue.errors import InputError
from rescue.outcomes import Outcome, classify

ROOT = Path(__file__).resolve().parents[1]


# ── the recipe's format ─────────────────────────────────────────────────────────────────


class ScriptedGame:
    """A game of fixed observations: step k answers with observation k (``raise_at`` raises)."""

    def __init__(
        self, n: int = 5, won_at: int | None = None, lost_at: int | None = None, raise_at=None
    ):
        self.task = "put a clean mug in the coffeemachine."
        self.n, self.won_at, self.lost_at, self.raise_at = n, won_at, lost_at, raise_at
        self.commands: list[str] = []

    def _obs(self, k: int) -> Observation:
        return Observation(
            text=f"obs {k}",
            admissible=("go to desk 1", "help", "look"),
            won=k == self.won_at,
            lost=k == self.lost_at,
        )

    def reset(self) -> Observation:
        if self.raise_at == 0:
            raise RuntimeError("broken game file")
        return self._obs(0)

    def step(self, command: str) -> Observation:
        self.commands.append(command)
        if self.raise_at == len(self.commands):
            raise RuntimeError("the interpreter died")
        return self._obs(len(self.commands))


def reply(action: str) -> str:
    return f"<think>go</think><action>{action}</action>"


def test_first_prompt_has_the_task_observation_and_admissible_actions_but_no_history():
    ep = Episode(ScriptedGame(), env="alfworld", cap=50)
    ep.start()
    p = ep.prompt
    assert p.startswith(
        "\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task is "
        "to: put a clean mug in the coffeemachine.\nYour current observation is: obs 0\n"
    )
    assert "Your admissible actions of the current situation are: ['go to desk 1'\n 'look']." in p
    assert "help" not in p and "Prior to this step" not in p
    assert p.rstrip().endswith("present it within <action> </action> tags.")


def test_later_prompts_show_the_last_history_pairs_and_the_step_number():
    ep = Episode(ScriptedGame(), env="cooking", cap=15, history=2)
    ep.start()
    for a in ("look", "go to desk 1", "look"):
        ep.act(reply(a))
    p = ep.prompt
    assert p.startswith("\nYou are an expert agent playing a TextWorld cooking game.")
    assert "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 " in p
    assert (
        "[Observation 2: 'obs 1', Action 2: 'go to desk 1']\n[Observation 3: 'obs 2', Action 3: 'look']"
        in p
    )
    assert "Observation 1:" not in p
    assert "You are now at step 4 and your current observation is: obs 3\n" in p


def test_history_zero_keeps_the_first_template():
    ep = Episode(ScriptedGame(), env="alfworld", cap=50, history=0)
    ep.start()
    ep.act(reply("look"))
    assert "Prior to this step" not in ep.prompt and "obs 1" in ep.prompt


@pytest.mark.parametrize(
    ("text", "command", "valid"),
    [
        ("<think>x</think><action>Go To Desk 1</action>", "go to desk 1", True),
        ("<think>x</think> <ACTION> look </ACTION>", "look", True),
        ("<action>look</action>", "look", False),  # no think tags: played, but invalid
        ("<think>看</think><action>look</action>", "look", False),  # the recipe's CJK rule
        ("I would rather go to the desk now, really", "the desk now, really"[-30:], False),
    ],
)
def test_the_action_is_read_as_the_recipe_reads_it(text, command, valid):
    a = read_action(text)
    assert (a.command, a.valid) == (
        command if valid or "<action>" in text else text.lower()[-30:],
        valid,
    )


def test_admissible_text_quotes_and_leaves_help_out():
    assert admissible_text(["a", "help", "b"]) == "'a'\n 'b'"


def test_an_invalid_action_is_an_observation_and_counts():
    game = ScriptedGame(won_at=2)
    ep = Episode(game, env="alfworld", cap=50)
    ep.start()
    ep.act("no tags at all")
    assert not ep.done and ep.invalid == 1 and ep.inadmissible == 1
    assert game.commands == ["no tags at all"] and "obs 1" in ep.prompt
    ep.act(reply("look"))
    assert ep.exit_status == "won" and ep.reward == 1.0 and ep.steps == 2


@pytest.mark.parametrize(
    ("game", "status", "outcome", "reason", "reward"),
    [
        (ScriptedGame(won_at=3), "won", Outcome.SOLVED, "won", 1.0),
        (ScriptedGame(lost_at=2), "lost", Outcome.SUBMITTED_FAILURE, "lost", 0.0),
        (ScriptedGame(), "max_turns", Outcome.BUDGET_FAILURE, "turn_cap", 0.0),
        (ScriptedGame(raise_at=2), "env_error", Outcome.INFRA_NO_RESULT, "env_error", None),
        (ScriptedGame(raise_at=0), "env_error", Outcome.INFRA_NO_RESULT, "env_error", None),
    ],
)
def test_each_ending_is_one_outcome_with_its_reason(game, status, outcome, reason, reward):
    ep = Episode(game, env="alfworld", cap=4)
    ep.start()
    while not ep.done:
        ep.act(reply("look"))
    assert ep.exit_status == status and ep.reward == reward
    assert ep.steps <= 4 and (status != "max_turns" or ep.steps == 4)
    c = classify(status="completed", reward=ep.reward, metadata=ep.metadata())
    assert (c.outcome, c.reason) == (outcome, reason)
    with pytest.raises(InputError, match="ended"):
        ep.act(reply("look"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"env": "webshop", "cap": 15},
            "env='webshop' is not a text game; allowed: alfworld, cooking",
        ),
        ({"env": "cooking", "cap": 0}, "cap=0 must be a positive number of actions"),
        ({"env": "cooking", "cap": 15, "history": -1}, "history=-1 must be >= 0"),
    ],
)
def test_bad_settings_name_themselves(kwargs, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Episode(ScriptedGame(), **kwargs)


# ── real cooking games (tw-make) ────────────────────────────────────────────────────────


def play(row: dict, choose, cap: int = 15) -> Episode:
    from rescue.envs.games import open_game

    game = open_game("cooking", row["metadata"]["game"])
    ep = Episode(game, env="cooking", cap=cap)
    ep.start()
    while not ep.done:
        ep.act(choose(ep))
    game.close()
    return ep


def test_the_walkthrough_wins_every_level(cooking_games):
    for row in cooking_games:
        plan = iter(walkthrough(row["metadata"]["game"]))
        ep = play(row, lambda ep, plan=plan: reply(next(plan)))
        assert ep.exit_status == "won" and ep.reward == 1.0
        assert ep.steps == row["metadata"]["walkthrough"] and ep.invalid == ep.inadmissible == 0


def test_eating_an_ingredient_loses(cooking_games):
    row = cooking_games[0]
    plan = iter(walkthrough(row["metadata"]["game"]))

    def choose(ep):
        eat = [a for a in admissible_of(ep.prompt) if a.startswith("eat ") and a != "eat meal"]
        return reply(eat[0] if eat else next(plan))

    ep = play(row, choose)
    assert ep.exit_status == "lost" and ep.reward == 0.0
    c = classify(status="completed", reward=0.0, metadata=ep.metadata())
    assert (c.outcome, c.reason) == (Outcome.SUBMITTED_FAILURE, "lost")


def test_looking_around_hits_the_cap(cooking_games):
    ep = play(cooking_games[1], lambda ep: reply("look"), cap=6)
    assert ep.exit_status == "max_turns" and ep.steps == 6 and ep.reward == 0.0


def test_invalid_replies_are_played_and_the_game_goes_on(cooking_games):
    row = cooking_games[0]
    plan = iter(walkthrough(row["metadata"]["game"]))
    replies = iter(["not sure", "<action>xyzzy</action>"])
    ep = play(row, lambda ep: next(replies, None) or reply(next(plan)))
    assert ep.exit_status == "won" and ep.invalid == 2 and ep.inadmissible == 2
    assert ep.steps == row["metadata"]["walkthrough"] + 2


def test_the_first_observation_has_no_banner_and_the_task_is_the_objective(cooking_games):
    from rescue.envs.games import open_game

    game = open_game("cooking", cooking_games[0]["metadata"]["game"])
    obs = game.reset()
    assert obs.text.startswith("-= ") and "examine cookbook" in obs.admissible
    assert "cook" in game.task.lower() and "meal" in game.task.lower()
    game.close()


def test_a_missing_game_file_is_an_error_naming_it(tmp_path):
    from rescue.envs.games import open_game

    with pytest.raises(
        InputError, match=r"no game file .*none\.z8 .*make agent-prepare ENV=cooking"
    ):
        open_game("cooking", str(tmp_path / "none.z8"))


# ── the prepared set ────────────────────────────────────────────────────────────────────


def test_the_set_is_a_pure_function_of_the_seed(cooking_games, tmp_path):
    from rescue.envs.prepare import cooking_rows, seed_of

    again, _ = cooking_rows(tmp_path, games=1, seed=SEED, cap=15, levels=(1,))
    assert (
        again[0]["metadata"]["seed"] == cooking_games[0]["metadata"]["seed"] == seed_of(SEED, 1, 0)
    )
    first = Path(cooking_games[0]["metadata"]["game"]).with_suffix(".json")
    second = Path(again[0]["metadata"]["game"]).with_suffix(".json")
    assert (
        json.loads(first.read_text())["metadata"]["walkthrough"]
        == json.loads(second.read_text())["metadata"]["walkthrough"]
    )
    assert seed_of(SEED, 1, 0) != seed_of(SEED + 1, 1, 0) != seed_of(SEED, 2, 0)


def test_levels_are_graded_and_games_longer_than_the_cap_are_left_out(cooking_games, tmp_path):
    from rescue.envs.prepare import cooking_rows

    lengths = [r["metadata"]["walkthrough"] for r in cooking_games]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert [r["metadata"]["difficulty"] for r in cooking_games] == [1, 2]
    rows, skipped = cooking_rows(tmp_path, games=1, seed=SEED, cap=lengths[0], levels=(1, 2))
    assert len(rows) == 1 and skipped == 1


def test_rescue_agent_prepare_writes_the_rows(cooking_games, tmp_path):
    out = tmp_path / "rows.jsonl"
    games = Path(cooking_games[0]["metadata"]["game"]).parent
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rescue",
            "agent",
            "prepare",
            "--env",
            "cooking",
            "--games-dir",
            str(games),
            "--out",
            str(out),
            "--games",
            "1",
            "--seed",
            str(SEED),
            "--levels",
            "1,2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == cooking_games
    assert done.stdout.strip() == f"2 cooking games written to {out}"


def test_rescue_agent_prepare_needs_a_games_dir(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rescue",
            "agent",
            "prepare",
            "--env",
            "cooking",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "rescue agent: error: --env cooking needs --games-dir (where tw-make writes the games)\n"
    )


def test_a_command_reaches_the_game_without_characters_that_are_not_printable():
    """A NUL (or another control character) in a reply never reaches the game: TextWorld's
    Z-machine interpreter hangs on a NUL (the CPU rehearsal's tiny model wrote one)."""
    assert read_action("<think>x</think><action>\x00</action>").command == ""
    assert read_action("<think>x</think><action>ta\x7fke\tknife</action>").command == "takeknife"
    assert read_action("no tags\x00 at all").command == "no tags at all"
    game = ScriptedGame()
    ep = Episode(game, env="cooking", cap=5)
    ep.start()
    ep.act(reply("\x00look\x1b"))
    assert game.commands == ["look"]
