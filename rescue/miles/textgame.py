"""Miles' generate function for the text games (ALFWorld, TextWorld cooking), and the
group filter that keeps games without a result out of a synchronous run.

Targets: ``--custom-generate-function-path rescue.miles.textgame.generate`` and
``--dynamic-sampling-filter-path rescue.miles.textgame.drop_no_result``.

Specification
-------------
Miles calls ``generate(GenerateFnInput)`` once per rollout (``generate_and_rm`` in
``miles/rollout/inference_rollout/inference_rollout_common.py`` and in
``sglang_rollout.py``). The dataset row's ``metadata`` names the game: ``env``
(``alfworld`` | ``cooking``) and ``game`` (its file; ``rescue agent prepare`` writes the
rows). The episode is ``rescue.envs.episode.Episode`` (the recipe's prompt format, the
action read from each reply, the cap); each step is one request to the engine, token in
and token out, through Miles' own helpers:

- the step's prompt is one user message; its ids are Miles'
  ``compute_prompt_ids_from_sample`` (the tokenizer's chat template), the request is
  Miles' ``compute_request_payload`` (``--rollout-max-response-len`` new tokens per step,
  ``--rollout-max-context-len`` bounding prompt + reply), sent with Miles' ``post`` and
  routing headers, and the reply is added with Miles' ``update_sample_from_response``
  (the engine's own token ids and log-probs, loss mask 1 on every reply token);
- so every step is one ``Sample``: the row's sample with this step's prompt and reply,
  ``rollout_id`` the row sample's (else its ``index``), the same for every step, which
  is how Miles' conversion and rescue's reward hook join siblings into one rollout. The
  trajectory is the list of step samples (Miles' multi-sample output), the shape the
  recipe trains on (each step its own prompt).

Every step sample carries the episode's ``reward`` (1 won, 0 otherwise; Miles'
conversion requires siblings to share it, and a set reward keeps Miles' reward model
from being called) and its ``metadata``: the row's, then ``env``, ``exit_status``,
``turns`` (actions taken), ``invalid_actions``, ``inadmissible_actions``, ``step``
(1-based) and, on a fault, ``env_error`` / ``engine_error``. ``rescue.outcomes`` classifies
the rollout from ``exit_status``:

=============================================  ===============  ==================
what ended the episode                          exit_status      outcome (reason)
=============================================  ===============  ==================
the game is won                                 won              solved (won)
the game is lost (cooking)                      lost             submitted_failure (lost)
the cap (``--agent-cap`` actions)               max_turns        budget_failure (turn_cap)
the next prompt does not fit the context        length           budget_failure (context_limit)
the game raised                                 env_error        infra_no_result
the engine request raised                       engine_error     infra_no_result
the engine aborted the request                  (status aborted) infra_no_result (aborted)
=============================================  ===============  ==================

A fault before the first reply returns the row's sample with status ``aborted`` (as
Miles' agentic generate function does when no model call was recorded); a fault later
keeps the steps played, every one marked with the fault (their reward 0 is never a
result: the census counts the rollout as a no-result, the filter below drops its group).
An invalid or inadmissible action is an observation (``rescue.envs.episode``).

Settings: ``--agent-cap`` (default: 50 for alfworld, 15 for cooking, the recipe's
``env.max_steps``) and ``--agent-history`` (default 2, the recipe's
``env.history_length``), added to Miles' parser by ``generate.add_arguments``.

``drop_no_result(args, group)`` (Miles' dynamic-filter protocol) drops a group any of
whose rollouts has no result (``rescue.census.no_result``, the rule of rescue's async
buffer) with the reason ``no_result_<reason>``, which Miles counts as
``rollout/dynamic_filter/drop_no_result_<reason>``; Miles' synchronous rollout then draws
another group. No other group is dropped: the filter never reads a reward.

Miles' synchronous rollout draws groups until enough pass the filter, so a fault that hits
every game (an engine that is down, a game file that cannot load) would make it draw
forever. The filter reports every group to the run's watchdog (``rescue.watchdog``, the
asynchronous buffer's, with its ``RESCUE_WATCHDOG_WINDOW`` and
``RESCUE_WATCHDOG_MAX_NO_RESULT``): when more than that fraction of the last window of
groups had no result, it raises ``WatchdogStop`` with one line naming the dominant reason
and the last errors, which ends the rollout and the run. The idle check does not apply
here: nothing waits between the filter's calls to run it.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import logging
from typing import Any

from rescue.envs.episode import Episode
from rescue.envs.games import open_game
from rescue.errors import InputError
from rescue.watchdog import Watchdog, WatchdogSettings

logger = logging.getLogger(__name__)

#: This function's dotted path, as Miles' ``load_function`` loads it.
GENERATE_PATH = "rescue.miles.textgame.generate"
#: The no-result group filter's dotted path.
FILTER_PATH = "rescue.miles.textgame.drop_no_result"
#: The recipe's step cap of each game (``env.max_steps``).
DEFAULT_CAPS = {"alfworld": 50, "cooking": 15}
#: The recipe's history length (``env.history_length``).
DEFAULT_HISTORY = 2


def _settings(args: Any, metadata: dict) -> tuple[str, str, int, int]:
    env, game = metadata.get("env"), metadata.get("game")
    if env not in DEFAULT_CAPS:
        raise InputError(
            f"sample metadata env={env!r} is not a text game; allowed: {', '.join(DEFAULT_CAPS)} "
            "(rows written by `rescue agent prepare`)"
        )
    if not game:
        raise InputError(
            "sample metadata has no 'game' (the game file): use `rescue agent prepare`"
        )
    cap = getattr(args, "agent_cap", None) or DEFAULT_CAPS[env]
    history = getattr(args, "agent_history", None)
    history = DEFAULT_HISTORY if history is None else history
    return env, str(game), int(cap), int(history)


def _step_sample(row: Any, rollout_id: Any, messages: list[dict[str, str]]) -> Any:
    from miles.utils.types import Sample

    step = copy.deepcopy(row)
    step.prompt = messages
    step.tokens = []
    step.response = ""
    step.response_length = 0
    step.loss_mask = None
    step.rollout_log_probs = None
    step.weight_versions = []
    step.reward = None
    step.status = Sample.Status.PENDING
    step.rollout_id = rollout_id
    return step


async def generate(input: Any) -> Any:
    """Play one episode of the row's game (module docstring); Miles' generate protocol.

    Never raises for one episode's sake: Miles' synchronous rollout would log the exception
    and lose the group without a count. A fault of this function itself (a bad row, a bug)
    returns the row aborted with the exception's class as its reason, so the census and
    the filter count it (``rescue.miles.textgame.drop_no_result``).
    """
    from miles.rollout.base_types import GenerateFnOutput

    try:
        return await _play(input)
    except Exception as e:
        logger.exception("text game of sample %s failed", getattr(input.sample, "index", "?"))
        return GenerateFnOutput(samples=_aborted(input.sample, type(e).__name__, e))


async def _play(input: Any) -> Any:
    from miles.rollout.base_types import GenerateFnOutput
    from miles.rollout.generate_utils.generate_endpoint_utils import (
        compute_prompt_ids_from_sample,
        compute_request_payload,
        compute_routing_headers,
        update_sample_from_response,
    )
    from miles.utils.http_utils import post
    from miles.utils.types import Sample

    args, row = input.args, input.sample
    env, game_path, cap, history = _settings(args, dict(row.metadata or {}))
    rollout_id = row.rollout_id if row.rollout_id is not None else row.index
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"

    try:
        game = await asyncio.to_thread(open_game, env, game_path)
    except Exception as e:  # a missing or broken game file is the environment's fault
        return GenerateFnOutput(samples=_aborted(row, "env_error", e))
    episode = Episode(game, env=env, cap=cap, history=history)
    await asyncio.to_thread(episode.start)
    steps: list[Any] = []
    end: tuple[str, str] | None = None  # (exit_status, error) set by the engine side
    try:
        while not episode.done:
            step = _step_sample(row, rollout_id, [{"role": "user", "content": episode.prompt}])
            prompt_ids = compute_prompt_ids_from_sample(input.state, step)
            payload, _ = compute_request_payload(args, prompt_ids, input.sampling_params)
            if payload is None:  # the prompt leaves no room for a reply: the context budget
                end = ("length", "")
                break
            try:
                output = await post(url, payload, headers=compute_routing_headers(args, step))
            except Exception as e:  # the engine, not the policy: no result
                end = ("engine_error", f"{type(e).__name__}: {e}")
                break
            await update_sample_from_response(
                args, step, payload=payload, output=output, update_loss_mask=True
            )
            steps.append(step)
            if step.status == Sample.Status.ABORTED:
                end = ("aborted", "")
                break
            await asyncio.to_thread(episode.act, output["text"])
    finally:
        close = getattr(game, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    if not steps:  # no reply to train: the game or the engine failed, or the first prompt
        # does not fit the context (a setting, not the policy)
        reason = end[0] if end else episode.exit_status
        reason = "prompt_exceeds_context" if reason == "length" else reason
        return GenerateFnOutput(samples=_aborted(row, reason, end[1] if end else episode.error))
    metadata = dict(row.metadata or {})
    if end is None:
        metadata.update(episode.metadata())
        reward = episode.reward
    else:
        metadata.update(episode.metadata(exit_status=end[0]))
        if end[0] == "engine_error":
            metadata["engine_error"] = end[1]
        reward = 0.0
    for t, step in enumerate(steps, 1):
        step.metadata = {**metadata, "step": t}
        step.reward = 0.0 if reward is None else reward
    return GenerateFnOutput(samples=steps)


def _aborted(row: Any, reason: str, error: object) -> Any:
    """The row's sample, aborted, saying why (no reply was recorded): the outcome is set
    here (``rescue.outcomes`` rule 1), so the census keeps the reason."""
    from miles.utils.types import Sample

    sample = copy.deepcopy(row)
    sample.status = Sample.Status.ABORTED
    sample.metadata = {
        **(row.metadata or {}),
        "outcome": "infra_no_result",
        "outcome_reason": reason,
        "exit_status": reason,
        "engine_error": str(error or ""),
    }
    return sample


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent-cap",
        type=int,
        default=None,
        help="rescue text games: actions per episode (default 50 alfworld, 15 cooking)",
    )
    parser.add_argument(
        "--agent-history",
        type=int,
        default=None,
        help="rescue text games: (observation, action) pairs shown in each prompt (default 2)",
    )


generate.add_arguments = _add_arguments


#: The rollout process's watchdog, made at the filter's first call (module docstring).
_watchdog: Watchdog | None = None


def filter_watchdog() -> Watchdog:
    """The watchdog ``drop_no_result`` reports to, its settings read once from the
    environment (the idle check off: module docstring)."""
    global _watchdog
    if _watchdog is None:
        settings = dataclasses.replace(WatchdogSettings.from_env(), idle_s=0.0)
        _watchdog = Watchdog(settings, flush=logger.error)
        logger.info("rescue text games: watchdog: %s", settings.describe())
    return _watchdog


def _first_error(group: list) -> str | None:
    for item in group:
        for sample in item if isinstance(item, list) else [item]:
            meta = getattr(sample, "metadata", None) or {}
            error = meta.get("env_error") or meta.get("engine_error")
            if error:
                return str(error)
    return None


def drop_no_result(args: Any, group: list, **kwargs: Any) -> Any:
    """Miles' dynamic filter: drop a group with a rollout that has no result, and report
    every group to the watchdog (docstring)."""
    from miles.rollout.filter_hub.base_types import DynamicFilterOutput

    from rescue.census import no_result
    from rescue.samples import group_records

    reason = no_result(group_records(group, reward_key=getattr(args, "reward_key", None)))
    filter_watchdog().observe(reason, _first_error(group) if reason is not None else None)
    if reason is None:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"no_result_{reason}")
