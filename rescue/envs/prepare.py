"""The games of a run and the prompt rows Miles reads (``rescue agent prepare``).

Specification
-------------
A row is ``{"prompt": "<env>:<game id>", "metadata": {"env", "game", ...}}``: Miles
reads ``--input-key prompt --metadata-key metadata``; the generate function
(``rescue.miles.textgame``) opens ``metadata["game"]`` and builds every prompt itself.

Cooking games (``cooking_rows``): ``GAMES`` per level of ``DEFAULT_LEVELS`` (or the levels
given), each made by
TextWorld's own ``tw-make tw-cooking`` with the level's skills and ``--split train``, at
seed ``seed_of(seed, level, k)`` (so the set is a pure function of the seed: the same
files on every machine, any game re-made alone). A level adds skills (more ingredients to
find and prepare, rooms, containers, cutting, cooking), so the walkthrough lengthens and
the game gets harder. A game whose walkthrough is longer than the cap cannot be won within
it: it is left out and counted (``skipped``), since every episode of it would be a budget
failure whatever the policy does. Metadata: ``difficulty`` (the level), ``walkthrough``
(its length), ``seed``.

ALFWorld games (``alfworld_rows``): the games ALFWorld's own training environment would
load from its data (``AlfredTWEnv.collect_game_files``: the split's solvable
``game.tw-pddl`` files of the task types 1-6, movable and sliced tasks left out), with
their path under ``$ALFWORLD_DATA`` kept as ``$ALFWORLD_DATA/...``. Metadata:
``task_type`` (ALFWorld's name of it). The data comes from ALFWorld's own download
command (``alfworld-download``), which ``make agent-prepare ENV=alfworld`` runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rescue.errors import InputError
from rescue.output import write_text

#: tw-make's skills per level (``tw-make tw-cooking --help``), easiest first. Level 0 (the
#: ingredient already in hand: examine the cookbook, prepare the meal, eat it) is not among
#: the default levels; the CPU rehearsal adds it, so a tiny policy wins some episodes.
LEVELS: dict[int, tuple[str, ...]] = {
    0: ("--recipe", "1", "--take", "0", "--go", "1"),
    1: ("--recipe", "1", "--take", "1", "--go", "1"),
    2: ("--recipe", "1", "--take", "1", "--go", "1", "--open", "--cut"),
    3: ("--recipe", "2", "--take", "2", "--go", "1", "--open", "--cut"),
    4: ("--recipe", "2", "--take", "2", "--go", "6", "--open", "--cut"),
    5: ("--recipe", "3", "--take", "3", "--go", "6", "--open", "--cut", "--cook"),
}
#: The levels a run's games are made of unless told otherwise.
DEFAULT_LEVELS = (1, 2, 3, 4, 5)
#: ALFWorld's task types (``alfred_tw_env.TASK_TYPES``), all of which the recipe trains on.
ALFWORLD_TASK_TYPES = (1, 2, 3, 4, 5, 6)


@dataclass(frozen=True)
class Prepared:
    """Rows written and games left out (and why)."""

    rows: int
    skipped: int
    path: Path


def seed_of(seed: int, level: int, k: int) -> int:
    """The tw-make seed of game ``k`` of ``level`` in the set of ``seed`` (below 2**31)."""
    digest = hashlib.blake2b(f"{seed}/{level}/{k}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % (2**31 - 1)


def tw_make() -> str:
    """TextWorld's ``tw-make`` (beside this interpreter, else on PATH)."""
    import sys

    here = Path(sys.executable).parent / "tw-make"
    found = str(here) if here.is_file() else shutil.which("tw-make")
    if not found:
        raise InputError("tw-make is not installed: pip install -e '.[agent]' (TextWorld)")
    return found


def make_cooking_game(folder: Path, level: int, seed: int) -> tuple[Path, int]:
    """One cooking game of ``level`` at ``seed`` in ``folder``: its ``.z8`` path and the
    length of its walkthrough (an existing game is reused)."""
    if level not in LEVELS:
        raise InputError(f"level {level} is not a cooking level; allowed: {sorted(LEVELS)}")
    game = folder / f"cooking-l{level}-s{seed}.z8"
    data = game.with_suffix(".json")
    if not (game.is_file() and data.is_file()):
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [tw_make(), "tw-cooking", *LEVELS[level], "--split", "train"]
        cmd += ["--seed", str(seed), "--output", str(game), "-f", "--silent"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not data.is_file():
            raise InputError(
                f"tw-make failed for level {level} seed {seed} (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
    walkthrough = json.loads(data.read_text())["metadata"]["walkthrough"]
    return game, len(walkthrough)


def cooking_rows(
    folder: Path, *, games: int, seed: int, cap: int, levels: Sequence[int] = DEFAULT_LEVELS
) -> tuple[list[dict], int]:
    """The rows of ``games`` games per level (module docstring) and how many were skipped."""
    from tqdm import tqdm

    if games < 1:
        raise InputError(f"--games={games} must be a positive number of games per level")
    if cap < 1:
        raise InputError(f"--cap={cap} must be a positive number of actions")
    bad = [x for x in levels if x not in LEVELS]
    if bad:
        raise InputError(f"--levels has {bad}: allowed {sorted(LEVELS)}")
    rows, skipped = [], 0
    plan = [(level, k) for level in levels for k in range(games)]
    for level, k in tqdm(plan, desc="tw-make tw-cooking", unit="game"):
        s = seed_of(seed, level, k)
        game, steps = make_cooking_game(folder, level, s)
        if steps > cap:
            skipped += 1
            continue
        rows.append(
            {
                "prompt": f"cooking:{game.stem}",
                "metadata": {
                    "env": "cooking",
                    "game": str(game.resolve()),
                    "difficulty": level,
                    "walkthrough": steps,
                    "seed": s,
                },
            }
        )
    return rows, skipped


def alfworld_rows(data_dir: str, *, split: str = "train", limit: int = 0) -> list[dict]:
    """The ALFWorld games of ``split`` its training environment would load (docstring)."""
    try:
        from alfworld.agents.environment.alfred_tw_env import TASK_TYPES, AlfredTWEnv
    except ImportError:
        raise InputError(
            "--env alfworld: ALFWorld is not installed: pip install -e '.[agent]' "
            "(make agent-prepare installs it)"
        ) from None

    splits = {
        "train": "train",
        "valid_seen": "eval_in_distribution",
        "valid_unseen": "eval_out_of_distribution",
    }
    if split not in splits:
        raise InputError(f"--split={split!r}; allowed: {', '.join(splits)}")
    root = Path(os.path.expandvars(data_dir))
    folder = root / "json_2.1.1" / split
    if not folder.is_dir():
        raise InputError(
            f"no ALFWorld data at {folder}: run alfworld-download (make agent-prepare)"
        )
    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": list(ALFWORLD_TASK_TYPES)},
        "dataset": {
            "data_path": str(folder),
            "eval_id_data_path": str(folder),
            "eval_ood_data_path": str(folder),
            "num_train_games": limit,
            "num_eval_games": limit,
        },
    }
    env = AlfredTWEnv(config, train_eval=splits[split])
    rows = []
    for path in sorted(env.game_files):
        rel = Path(path).resolve().relative_to(root.resolve())
        task = next((t for t in TASK_TYPES.values() if t in str(rel)), "unknown")
        rows.append(
            {
                "prompt": f"alfworld:{rel.parent}",
                "metadata": {"env": "alfworld", "game": f"$ALFWORLD_DATA/{rel}", "task_type": task},
            }
        )
    return rows


def write_rows(rows: Iterable[dict], out: Path) -> int:
    """The rows as JSONL at ``out`` (its folder made); how many were written."""
    lines = [json.dumps(row) + "\n" for row in rows]
    if not lines:
        raise InputError(f"no game to write to {out}: every game was left out")
    write_text(out, "".join(lines))  # replaced whole, or left as it was
    return len(lines)
