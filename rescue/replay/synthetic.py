"""Synthetic debug dumps in the exact schema of Miles' ``Sample.to_dict()``, for tests and benchmarks.

``MILES_SAMPLE_FIELDS`` is the key set of ``Sample().to_dict()`` in Miles (radixark/miles,
``miles/utils/types.py``); a test compares it with the real class when Miles is available.

``synthetic_step`` draws one step of an agentic task: ``groups`` prompts with ``G`` rollouts
each. Prompt ``x`` has a per-turn submit probability and a solve probability; a rollout
takes turns until it submits (solved or submitted failure) or reaches ``cap`` turns (status
``truncated``: a budget failure scored 0); with probability ``p_abort`` it is aborted (no
reward). Each turn is ``turn_tokens`` action tokens (loss mask 1) followed by an observation
(loss mask 0) except after the last turn, so turns are the runs of 1s, as in a merged
multi-turn Miles sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rescue.errors import InputError

#: Keys of Miles' ``Sample.to_dict()`` at HEAD 31f1ca961.
MILES_SAMPLE_FIELDS: tuple[str, ...] = (
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
    "multimodal_train_inputs", "response", "response_length", "label", "reward", "loss_mask",
    "weight_versions", "rollout_log_probs", "rollout_routed_experts", "rollout_indexer_topk",
    "remove_sample", "teacher_log_probs", "opd_reverse_kl", "status", "metadata",
    "generate_function_path", "train_metadata", "adapter", "reward_spec", "routing_key",
    "non_generation_time", "spec_info", "prefix_cache_info",
)  # fmt: skip


def sample_dict(**fields: Any) -> dict[str, Any]:
    """A ``Sample.to_dict()``-shaped dict: Miles' defaults, overridden by ``fields``."""
    d: dict[str, Any] = {
        "group_index": None, "index": None, "rollout_id": None, "prompt": "", "tokens": [],
        "multimodal_inputs": None, "multimodal_train_inputs": None, "response": "",
        "response_length": 0, "label": None, "reward": None, "loss_mask": None,
        "weight_versions": [], "rollout_log_probs": None, "rollout_routed_experts": None,
        "rollout_indexer_topk": None, "remove_sample": False, "teacher_log_probs": None,
        "opd_reverse_kl": None, "status": "pending", "metadata": {},
        "generate_function_path": None, "train_metadata": None, "adapter": None,
        "reward_spec": None, "routing_key": None, "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                      "completion_token_num": 0},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }  # fmt: skip
    unknown = set(fields) - set(d)
    if unknown:
        raise InputError(f"not Sample fields: {sorted(unknown)}")
    d.update(fields)
    return d


def synthetic_step(
    *,
    rollout_id: int = 0,
    groups: int = 4,
    G: int = 4,
    cap: int = 6,
    turn_tokens: int = 3,
    obs_tokens: int = 2,
    prompt_tokens: int = 4,
    vocab: int = 50,
    p_submit: float = 0.35,
    p_abort: float = 0.0,
    seed: int = 0,
    first_group: int = 0,
    with_logprobs: bool = False,
) -> dict[str, Any]:
    """One step's dump payload ``{"rollout_id", "metadata", "samples"}`` (module docstring).

    Defaults: 4 groups of 4, cap 6 turns of 3 action + 2 observation tokens, 4 prompt tokens,
    vocabulary 50, submit probability 0.35 per turn, no aborts, seed 0.
    """
    rng = np.random.default_rng(seed)
    samples = []
    for gi in range(groups):
        solve = rng.uniform(0.1, 0.9)
        prompt = rng.integers(0, vocab, prompt_tokens).tolist()
        group_index = first_group + gi
        for k in range(G):
            index = group_index * G + k
            if rng.random() < p_abort:
                samples.append(
                    sample_dict(
                        group_index=group_index, index=index, tokens=prompt, status="aborted"
                    )
                )
                continue
            turns = 1
            while turns < cap and rng.random() >= p_submit:
                turns += 1
            submitted = rng.random() < p_submit or turns < cap
            mask: list[int] = []
            for t in range(turns):
                mask += [1] * turn_tokens
                if t < turns - 1:
                    mask += [0] * obs_tokens
            response = rng.integers(0, vocab, len(mask)).tolist()
            solved = submitted and rng.random() < solve
            samples.append(
                sample_dict(
                    group_index=group_index,
                    index=index,
                    prompt=f"p{group_index}",
                    tokens=prompt + response,
                    response_length=len(mask),
                    loss_mask=mask,
                    reward=1.0 if solved else 0.0,
                    status="completed" if submitted else "truncated",
                    weight_versions=[str(rollout_id)] * turns,
                    rollout_log_probs=rng.normal(-1.0, 0.3, len(mask)).tolist()
                    if with_logprobs
                    else None,
                )
            )
    return {"rollout_id": rollout_id, "metadata": {}, "samples": samples}
