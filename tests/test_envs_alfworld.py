"""ALFWorld without its data (which only alfworld-download fetches): the rows come from
ALFWorld's own game collection on a folder laid out as its data is, and the game is wrapped
and read as ALFWorld's own training environment does, checked against ALFWorld's source."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from rescue.envs.prepare import alfworld_rows
from rescue.errors import InputError

pytestmark = pytest.mark.agent  # the [agent] extra: make test-all and CI


@pytest.fixture(autouse=True)
def _alfworld() -> None:
    pytest.importorskip("alfworld", reason="the ALFWorld games need ALFWorld: .[agent]")


#: (folder under json_2.1.1/train, task type, solvable): as alfworld-download lays them out.
GAMES = [
    ("pick_and_place_simple-Mug-None-Desk-308/trial_T1", "pick_and_place_simple", True),
    ("pick_clean_then_place_in_recep-Cloth-None-Bathtub-405/trial_T2", "pick_clean_then_place_in_recep", True),
    ("look_at_obj_in_light-Book-None-DeskLamp-301/trial_T3", "look_at_obj_in_light", False),
    ("pick_and_place_with_movable_recep-Pen-Mug-Desk-309/trial_T4", "pick_and_place_with_movable_recep", True),
    ("pick_heat_then_place_in_recep-Egg-None-Fridge-2/trial_T5", "pick_heat_then_place_in_recep", None),
]  # fmt: skip


@pytest.fixture
def data(tmp_path: Path) -> Path:
    for folder, task, solvable in GAMES:
        d = tmp_path / "json_2.1.1" / "train" / folder
        d.mkdir(parents=True)
        (d / "traj_data.json").write_text(json.dumps({"task_type": task}))
        game = {} if solvable is None else {"solvable": solvable}
        (d / "game.tw-pddl").write_text(json.dumps(game))
    return tmp_path


def test_the_rows_are_the_games_alfworlds_environment_loads(data, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(data))
    rows = alfworld_rows("$ALFWORLD_DATA")
    # unsolvable, unchecked and movable-receptacle games are left out, as AlfredTWEnv does
    assert [r["metadata"]["task_type"] for r in rows] == [
        "pick_and_place_simple",
        "pick_clean_then_place_in_recep",
    ]
    assert rows[0]["metadata"] == {
        "env": "alfworld",
        "game": "$ALFWORLD_DATA/json_2.1.1/train/pick_and_place_simple-Mug-None-Desk-308/trial_T1/game.tw-pddl",
        "task_type": "pick_and_place_simple",
    }
    assert rows[0]["prompt"].startswith("alfworld:json_2.1.1/train/pick_and_place_simple-Mug")
    assert len(alfworld_rows(str(data), limit=1)) == 1


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(
        InputError, match=r"no ALFWorld data at .*json_2\.1\.1/train: run alfworld-download"
    ):
        alfworld_rows(str(tmp_path))
    with pytest.raises(
        InputError, match="--split='test'; allowed: train, valid_seen, valid_unseen"
    ):
        alfworld_rows(str(tmp_path), split="test")


def test_the_game_is_wrapped_and_read_as_alfworlds_training_environment_does():
    """ALFWorld's own init_env wraps a game with AlfredDemangler (shuffling only for
    domain randomization, off here) then AlfredInfos, and asks for won and the admissible
    commands; TextWorld's PDDL backend never loses: ALFWorld has two outcomes."""
    from alfworld.agents.environment import alfred_tw_env
    from textworld.envs.pddl import pddl

    from rescue.envs import games

    init_env = inspect.getsource(alfred_tw_env.AlfredTWEnv.init_env)
    assert "AlfredDemangler(shuffle=domain_randomization)" in init_env
    assert "wrappers = [alfred_demangler, AlfredInfos]" in init_env
    assert "textworld.EnvInfos(won=True, admissible_commands=True" in init_env
    ours = inspect.getsource(games.AlfworldGame.__init__)
    assert "wrappers=[AlfredDemangler(shuffle=False), AlfredInfos]" in ours
    assert 'self.state["lost"] = False' in inspect.getsource(pddl.PddlEnv._gather_infos)
