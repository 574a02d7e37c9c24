"""The text-game rehearsal's taught tiny model (``--launcher agent``, TextWorld cooking).

The games are ``rescue agent prepare``'s (the command ``make agent-prepare ENV=cooking``
runs): tw-make's cooking games of the five difficulty levels from one seed, and one game of
level 0, whose ingredient is already in hand (examine the cookbook, prepare the meal, eat
it: four moves), so that a tiny policy wins some episodes. A random tiny model would never
name an admissible action, so every episode would end at the cap; the rehearsal teaches it
first (``rescue.rehearsal.tiny.teach``), from a seeded teacher that plays the same games:

- the teacher (``teacher_action``) follows the game's walkthrough with probability
  ``FOLLOW`` and otherwise picks an admissible action at random, taking (``take ...``)
  ``TAKE`` times and eating an ingredient (``eat ...``, which loses a cooking game) ``EAT``
  times as often as anything else;
- its replies are the recipe's format, ``<think>`` ... ``</think>`` then
  ``<action>COMMAND</action>``, and the tiny tokenizer holds every command the teacher
  met as one token (``build_model_dir(words=...)``).

What a model of width 64 learns in a few hundred CPU steps is the format and the teacher's
distribution over commands, not which ones the prompt lists (reading the admissible list
would take it thousands of steps): it names the moves every game shares (inventory, the
cookbook, prepare the meal, eat it) often and a game's own moves (take, cut, cook an
ingredient) now and then, in any game. So it wins level 0 and now and then level 1, loses
when it eats an ingredient it holds, and otherwise plays until the cap, naming commands that
are not admissible (the episode's ``inadmissible_actions``) and writing replies that are
not valid (``invalid_actions``).

The prompts it learns from are the episodes' own (``rescue.envs.episode``, the recipe's
format), rendered with the chat template as Miles renders them, cut to their last
``CONTEXT`` tokens, to keep the teaching to a minute or two of CPU.

``python -m rescue.rehearsal.tiny.textgames --rows ROWS --out DIR --template JINJA [--seed 1]``
writes the model folder with ``teaching.json`` (the teacher's endings per level, the
teaching's loss).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

#: The teacher's chances: a move every cooking game shares (``GENERIC``, whether or not it
#: is admissible now), the walkthrough's next move (``FOLLOW``), else a random admissible one.
GENERIC = 0.3
GENERIC_MOVES = ("prepare meal", "eat meal")
FOLLOW = 0.4
TAKE = 4
EAT = 6
#: Episodes the teacher plays per game; the teaching's steps and batch.
EPISODES = 6
STEPS, BATCH = 120, 8
REPLY = "<think>\nI pick an admissible action.\n</think>\n<action>{command}</action>"


def teacher_action(rng: random.Random, admissible: tuple[str, ...], walkthrough: str) -> str:
    """The teacher's command: ``walkthrough`` (the next move of the game's walkthrough) with
    probability ``FOLLOW``, else one of ``admissible`` (module docstring)."""
    draw = rng.random()
    if draw < GENERIC:
        return rng.choice(GENERIC_MOVES)
    if walkthrough and draw < GENERIC + FOLLOW:
        return walkthrough
    choices = [a for a in admissible if a != "help"] or [walkthrough or "look"]
    weights = [
        TAKE if a.startswith("take ") else EAT if a.startswith("eat ") else 1 for a in choices
    ]
    return rng.choices(choices, weights)[0]


def walkthrough_of(game_path: str) -> list[str]:
    """The walkthrough tw-make wrote beside a cooking game (its ``.json``)."""
    data = Path(game_path).with_suffix(".json")
    if not data.is_file():
        return []
    return list(json.loads(data.read_text())["metadata"]["walkthrough"])


def play(rows: list[dict[str, Any]], seed: int, cap: int) -> tuple[list[tuple[str, str]], dict]:
    """The teacher's episodes on every game of ``rows``: (prompt, command) of every step,
    and the episodes' endings per difficulty level."""
    from rescue.envs.episode import Episode
    from rescue.envs.games import open_game

    rng = random.Random(seed)
    steps: list[tuple[str, str]] = []
    endings: dict[str, Counter[str]] = {}
    for row in rows:
        meta = row["metadata"]
        game = open_game(meta["env"], meta["game"])
        moves = walkthrough_of(meta["game"])
        try:
            for _ in range(EPISODES):
                episode = Episode(game, env=meta["env"], cap=cap)
                episode.start()
                k = 0
                while not episode.done:
                    prompt = episode.prompt
                    following = moves[k] if k < len(moves) else ""
                    command = teacher_action(rng, episode.admissible, following)
                    k += command == following
                    steps.append((prompt, command))
                    episode.act(REPLY.format(command=command))
                level = f"level {meta.get('difficulty', '?')}"
                endings.setdefault(level, Counter())[episode.ending or "?"] += 1
        finally:
            game.close()
    return steps, {k: dict(v) for k, v in sorted(endings.items())}


def build(
    out: Path, template: str, rows: list[dict[str, Any]], seed: int, *, cap: int = 15,
    steps: int = STEPS,
) -> dict[str, Any]:  # fmt: skip
    """The taught model in ``out`` (module docstring)."""
    from tokenizers import Tokenizer

    from rescue.envs.episode import FIRST_TEMPLATE, STEP_TEMPLATE
    from rescue.rehearsal.tiny.teach import Example, teach
    from rescue.rehearsal.tiny.tokenizer import build_model_dir
    from rescue.rlvr.calibrate import encode_prompts

    played, endings = play(rows, seed, cap)
    commands = sorted({c for _, c in played} | {"prepare meal", "eat meal"})
    texts = (
        FIRST_TEMPLATE,
        STEP_TEMPLATE,
        *dict.fromkeys(p for p, _ in played[:: max(1, len(played) // 200)]),
    )
    folder = build_model_dir(
        Path(out), template, vocab_size=1024, corpus=texts,
        words=("<action>", "</action>", *commands),
    )  # fmt: skip
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|im_end|>")
    prompts = encode_prompts(str(folder), [[{"role": "user", "content": p}] for p, _ in played])
    examples = [
        Example(
            tuple(ids),
            (*tokenizer.encode(REPLY.format(command=c), add_special_tokens=False).ids, eos),
        )
        for ids, (_, c) in zip(prompts, played, strict=True)
    ]
    facts = teach(folder, examples, seed=seed, steps=steps, batch=BATCH)
    facts.update(
        task="TextWorld cooking: name an admissible action",
        teacher_endings=endings,
        commands=len(commands),
        prompt_tokens_mean=round(sum(map(len, prompts)) / len(prompts), 1),
    )
    (folder / "teaching.json").write_text(json.dumps(facts, indent=1))
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rescue.rehearsal.tiny.textgames", description=__doc__
    )
    p.add_argument("--rows", required=True, help="the prompt rows of rescue agent prepare")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.add_argument("--template", required=True, help="the chat template (a .jinja file)")
    p.add_argument("--seed", type=int, default=1, help="teaching seed (default 1)")
    p.add_argument("--cap", type=int, default=15, help="actions per episode (default 15)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"teaching steps (default {STEPS})")
    a = p.parse_args(argv)
    rows = [json.loads(x) for x in Path(a.rows).read_text().splitlines() if x.strip()]
    facts = build(Path(a.out), Path(a.template).read_text(), rows, a.seed, cap=a.cap, steps=a.steps)
    print(f"taught model in {a.out}: {json.dumps(facts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
