"""What the policy samples with: one source for the pilot's requests and the training run's.

The pilot's success window is only the training distribution's if the pilot samples as
training does. Training's requests are built by Miles: the rollout settings
(``--rollout-temperature``, ``--rollout-top-p``, ``--rollout-top-k``,
``--rollout-max-response-len``, ``--rollout-skip-special-tokens``) become
``compute_sampling_params`` (``miles/rollout/inference_rollout/inference_rollout_common.py``),
the agentic generate function turns them into chat-request keys (``build_chat_request_kwargs``,
``generate_hub/agentic_tool_call.py``: ``max_new_tokens`` → ``max_tokens``, ``None`` and
keys that are not ``ChatCompletionRequest`` fields dropped), the agent sends them, and
Miles' session server sets ``no_stop_trim=False`` and the family's
``chat_template_kwargs`` on the way to SGLang (``session/core.py``
``prepare_chat_request``). ``Sampling.request_kwargs`` is that body's sampling part, which
the pilot sends to its SGLang server directly; the launchers derive the training flags and
the pilot's command from the same settings (``launch/config.sh``: ``TEMPERATURE``,
``TOP_P``, ``TOP_K``, ``MAX_RESPONSE_LEN``, the family's ``CHAT_TEMPLATE_KWARGS`` with its
``clear_thinking``).

Miles sends no ``min_p`` and no ``repetition_penalty``. SGLang then takes them from the
model's ``generation_config.json`` when started with ``--sampling-defaults model`` (its
default, ``ChatCompletionRequest.to_sampling_params``: request value, else the model's
generation config, else the OpenAI default), and from the OpenAI defaults (``min_p`` 0,
``repetition_penalty`` 1, as for ``top_p``/``top_k`` had they been omitted) with
``--sampling-defaults openai``. Both servers run with ``openai``: training's engines
(``--sglang-sampling-defaults openai``) and the pilot's (``--sampling-defaults openai``).
``check_server`` refuses a pilot server that would fill what the request omits from
anywhere else (``sampling_defaults`` other than ``openai``, or ``preferred_sampling_params``
set), reading SGLang's ``/server_info``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: SGLang's ``--sampling-defaults`` both servers run with.
SAMPLING_DEFAULTS = "openai"


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of a run. Defaults are Miles' rollout defaults.

    Args:
        temperature: ``--rollout-temperature`` (default 1.0).
        top_p: ``--rollout-top-p`` (default 1.0).
        top_k: ``--rollout-top-k`` (default -1, off).
        max_tokens: ``--rollout-max-response-len``, tokens per model call (default 8192).
        skip_special_tokens: ``--rollout-skip-special-tokens`` (default False).
        chat_template_kwargs: the family's, as Miles' session server sets them (default
            none), e.g. ``{"clear_thinking": false}`` for Qwen3.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 8192
    skip_special_tokens: bool = False
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def request_kwargs(self) -> dict[str, Any]:
        """The sampling keys of the chat request SGLang receives in training (docstring)."""
        body: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": False,
        }
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        return body


def server_info(base_url: str, timeout_s: float = 30) -> dict[str, Any]:
    """SGLang's ``/server_info`` (``/get_server_info`` on older servers) at ``base_url``;
    ``ValueError`` when neither answers with a JSON object."""
    base = base_url.rstrip("/").removesuffix("/v1")
    errors = []
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(base + path, timeout=timeout_s) as response:
                info = json.loads(response.read())
        except (OSError, ValueError) as e:
            errors.append(f"{path}: {e}")
            continue
        if isinstance(info, dict):
            return info
        errors.append(f"{path}: not a JSON object")
    raise ValueError("; ".join(errors))


def check_server(info: Mapping[str, Any]) -> list[str]:
    """Why a server would sample otherwise than training for ``Sampling.request_kwargs``
    (an empty list when it would not): one line per problem, naming the flag to change."""
    problems = []
    defaults = info.get("sampling_defaults")
    if defaults != SAMPLING_DEFAULTS:
        problems.append(
            f"the server fills omitted sampling parameters from sampling_defaults={defaults!r} "
            f"(with 'model', the checkpoint's generation_config.json: min_p, "
            f"repetition_penalty, which Miles never sends): start it with "
            f"--sampling-defaults {SAMPLING_DEFAULTS}, as training's engines run"
        )
    preferred = info.get("preferred_sampling_params")
    if preferred:
        problems.append(
            f"the server has preferred_sampling_params={preferred!r}: start it without "
            "--preferred-sampling-params"
        )
    return problems


def check_endpoint(base_url: str, timeout_s: float = 30) -> list[str]:
    """``check_server`` of the SGLang server at ``base_url``; one problem when its
    ``/server_info`` cannot be read (the check cannot be made)."""
    try:
        info = server_info(base_url, timeout_s)
    except ValueError as e:
        return [
            f"cannot read the sampling defaults of {base_url} ({e}): the pilot needs an SGLang "
            "server whose /server_info says how it fills omitted sampling parameters"
        ]
    return check_server(info)
