"""Score centering's settings, and every setting under which it is refused, in one place.

Specification
-------------
Score centering (``rescue.score_centering``) needs ``q``, the distribution the sampler drew
each token from, at the temperature the trainer divides its logits by. SGLang returns
``log_softmax(logits / T)`` over the whole vocabulary, taken *before* any filter or
constraint (``sampler.py`` in 0.5.23), so the recorded log-probs are ``q`` only when
nothing else shapes the draw. A run is refused, with one line naming the flag or field:

- Miles flags (``check_sc_flags``, at the first loss call, each recorder call and each
  publication): ``--rollout-top-p`` < 1, ``--rollout-top-k`` > 0, ``--rollout-temperature``
  <= 0 (greedy: the log-probs are not at a temperature and ``q`` is a point mass),
  speculative decoding (``--sglang-speculative-algorithm``), ``--use-tis`` and
  ``--custom-tis-function-path`` (a second weighting), ``--get-mismatch-metrics`` (it
  needs a TIS function this loss never calls), ``--use-opsm``, ``--true-on-policy-mode``,
  ``--recompute-logprobs-via-prefill``, ``--use-opd``, multi-LoRA, ``--advantage-estimator``
  other than ``grpo``, ``--normalize-advantages``, ``--use-kl-loss`` and a nonzero
  ``--entropy-coef`` (this loss has neither term), ``--partial-rollout``, ``--allgather-cp``,
  ``--qkv-format`` other than ``thd``, ``--use-session-server v2``; and the hooks this
  loss works with missing (``REQUIRED``; a ``--load-debug-rollout-data`` replay needs no
  recorder: its dumps kept the heads).
- Each request (``check_request``, by the recorder, on the body SGLang received): a
  temperature other than ``--rollout-temperature`` (a per-call change), ``top_p`` < 1,
  ``top_k`` > 0, ``min_p`` > 0, ``logit_bias``, a custom logit processor, constrained
  decoding (``regex``, ``ebnf``, ``json_schema``, ``structural_tag``, a ``response_format``
  other than text), strict tools, a forced ``tool_choice``, and a head size other than
  ``K``.
- The environment: ``SGLANG_RETURN_ORIGINAL_LOGPROB`` set to a true value (SGLang then
  returns pre-temperature log-probs).

Settings (environment variables, in every process of the job):

``RESCUE_SC_TOP_K``
    ``K``, the head size the recorder asks SGLang for (default 20): an integer >= 1.
    SGLang's Rust router caps chat ``top_logprobs`` at 20, so the SWE (chat) path needs
    ``--use-miles-router`` for more; ``/generate`` has no cap.
``RESCUE_SC_CAP``
    ``C``, the truncation cap of the importance weights (default 2): a number > 0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rescue import flags
from rescue.errors import InputError
from rescue.score_centering import DEFAULT_CAP

#: The loss that applies score centering (``--custom-loss-function-path``).
SC_LOSS_PATH = "rescue.miles.sc_loss.policy_loss"
#: The recorders (``--custom-generate-function-path``): single-turn ``/generate`` and the
#: agentic (chat, session server) path.
GENERATE_PATH = "rescue.miles.topk.generate"
AGENTIC_GENERATE_PATH = "rescue.miles.topk.agentic_generate"
RECORDERS = (GENERATE_PATH, AGENTIC_GENERATE_PATH)
#: The hook that publishes each step's recorded heads (``--custom-rollout-log-function-path``).
PUBLISHER_PATH = "rescue.miles.log.log_rollout"
#: The hook that tells the loss which rollout it trains (and logs ``train/rescue/sc/*``).
STEP_HOOK_PATH = "rescue.miles.train_step.before_train_step"

ENV_TOP_K = "RESCUE_SC_TOP_K"
DEFAULT_TOP_K = 20
ENV_CAP = "RESCUE_SC_CAP"
#: SGLang's Rust router refuses chat requests with more ``top_logprobs`` than this.
CHAT_ROUTER_TOP_K = 20
ENV_ORIGINAL_LOGPROB = "SGLANG_RETURN_ORIGINAL_LOGPROB"

#: ``(attribute, flag, reason)``: Miles options that must be off (falsy).
REFUSED: tuple[tuple[str, str, str], ...] = (
    ("use_tis", "--use-tis", "the loss applies its own truncated weights; TIS would weight twice"),
    ("custom_tis_function_path", "--custom-tis-function-path", "a second weighting"),
    ("get_mismatch_metrics", "--get-mismatch-metrics", "it needs a TIS function this loss never calls"),
    ("use_opsm", "--use-opsm", "a sequence mask the centering does not model"),
    ("true_on_policy_mode", "--true-on-policy-mode", "it changes how log-probs are computed"),
    ("recompute_logprobs_via_prefill", "--recompute-logprobs-via-prefill", "q must come from the draw itself"),
    ("use_opd", "--use-opd", "rescue's per-token advantages ride the OPD field"),
    ("multi_lora", "multi-LoRA", "several policies share one batch"),
    ("normalize_advantages", "--normalize-advantages", "it re-centres the advantages"),
    ("use_kl_loss", "--use-kl-loss", "this loss has no KL term"),
    ("entropy_coef", "--entropy-coef", "this loss has no entropy term"),
    ("partial_rollout", "--partial-rollout", "a resumed response mixes draws the recorder did not see"),
    ("allgather_cp", "--allgather-cp", "its context-parallel layout is not the one the head rows are sliced by"),
    ("sglang_speculative_algorithm", "--sglang-speculative-algorithm", "speculative decoding does not return q"),
)  # fmt: skip

#: Hooks score centering needs, ``(attribute, flag, allowed values, reason)``.
REQUIRED: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("custom_generate_function_path", "--custom-generate-function-path", RECORDERS,
     "it records each generated position's top-K head"),
    ("custom_rollout_log_function_path", "--custom-rollout-log-function-path", (PUBLISHER_PATH,),
     "it publishes each step's heads to the trainer"),
    ("custom_megatron_before_train_step_hook_path", "--custom-megatron-before-train-step-hook-path",
     (STEP_HOOK_PATH,), "it tells the loss which rollout it trains and logs train/rescue/sc/*"),
)  # fmt: skip


#: ``RESCUE_SC_TOP_K`` (default 20), an integer >= 1.
TOP_K = flags.count(ENV_TOP_K, DEFAULT_TOP_K, 1)
top_k_from_env = TOP_K.read
#: ``RESCUE_SC_CAP`` (default 2), a number > 0.
CAP = flags.amount(ENV_CAP, DEFAULT_CAP, 0, low_open=True, shown="2.0")
cap_from_env = CAP.read


def sc_enabled(args: Any) -> bool:
    """Whether the run trains with score centering (its loss is the SC loss)."""
    return (
        getattr(args, "loss_type", None) == "custom_loss"
        and getattr(args, "custom_loss_function_path", None) == SC_LOSS_PATH
    )


def _truthy_env(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Refuse ``SGLANG_RETURN_ORIGINAL_LOGPROB`` set to a true value."""
    env = os.environ if env is None else env
    if _truthy_env(env.get(ENV_ORIGINAL_LOGPROB)):
        raise InputError(
            f"score centering with {ENV_ORIGINAL_LOGPROB}={env.get(ENV_ORIGINAL_LOGPROB)}: "
            "SGLang then returns log-probs before the temperature, not q; unset it"
        )


def check_sc_flags(args: Any, env: Mapping[str, str] | None = None) -> None:
    """Refuse every Miles setting under which the loss would not be score centering."""
    for attr, flag, reason in REFUSED:
        if getattr(args, attr, None):
            raise InputError(f"score centering ({SC_LOSS_PATH}) with {flag}: {reason}; remove it")
    replay = getattr(args, "load_debug_rollout_data", None) is not None
    for attr, flag, allowed, reason in REQUIRED:
        value = getattr(args, attr, None)
        if replay and attr == "custom_generate_function_path":
            continue  # a replay of dumps generates nothing: the dumps kept the heads
        if value not in allowed:
            raise InputError(
                f"score centering ({SC_LOSS_PATH}) needs {flag} {' or '.join(allowed)} "
                f"(got {value!r}): {reason}"
            )
    estimator = getattr(args, "advantage_estimator", None)
    if estimator != "grpo":
        raise InputError(
            f"score centering with --advantage-estimator {estimator}; allowed: grpo "
            "(the loss is a REINFORCE surrogate of the per-token advantages)"
        )
    top_p = getattr(args, "rollout_top_p", 1.0)
    if top_p is not None and top_p < 1.0:
        raise InputError(
            f"score centering with --rollout-top-p {top_p}: the recorded log-probs are taken "
            "before the filter, so they are not q; use --rollout-top-p 1.0"
        )
    top_k = getattr(args, "rollout_top_k", -1)
    if top_k is not None and top_k > 0:
        raise InputError(
            f"score centering with --rollout-top-k {top_k}: the recorded log-probs are taken "
            "before the filter, so they are not q; use --rollout-top-k -1"
        )
    temperature = getattr(args, "rollout_temperature", 1.0)
    if not (temperature and temperature > 0):
        raise InputError(
            f"score centering with --rollout-temperature {temperature}: greedy decoding has "
            "no sampling distribution to centre; use a temperature > 0"
        )
    if getattr(args, "qkv_format", "thd") != "thd":
        raise InputError(f"score centering with --qkv-format {args.qkv_format}; allowed: thd")
    if getattr(args, "use_session_server", None) == "v2":
        raise InputError(
            "score centering with --use-session-server v2: the recorder reads the linear "
            "(v1) session's records; use --use-session-server"
        )
    cap_from_env(env)
    k = top_k_from_env(env)
    agentic = getattr(args, "custom_generate_function_path", None) == AGENTIC_GENERATE_PATH
    if agentic and k > CHAT_ROUTER_TOP_K and not getattr(args, "use_miles_router", False):
        raise InputError(
            f"{ENV_TOP_K}={k} on the chat path without --use-miles-router: SGLang's router "
            f"refuses top_logprobs above {CHAT_ROUTER_TOP_K}; set {ENV_TOP_K} <= "
            f"{CHAT_ROUTER_TOP_K} or add --use-miles-router"
        )
    check_environment(env)


#: Request fields that constrain the draw (``sampling_params`` on ``/generate``; top level
#: or ``extra_body`` on chat).
CONSTRAINTS = ("regex", "ebnf", "json_schema", "structural_tag", "custom_logit_processor")


def _field(body: Mapping[str, Any], name: str) -> Any:
    params = body.get("sampling_params") or {}
    return params.get(name, body.get(name))


def check_request(body: Mapping[str, Any], args: Any, top_k: int, where: str) -> None:
    """Refuse a request whose recorded log-probs are not the draw's ``q`` (module docstring).

    ``body``: the request SGLang received (a ``/generate`` payload or a chat body);
    ``where`` names it in the error (e.g. ``"chat request 3 of the session"``).
    """
    temperature = _field(body, "temperature")
    want = getattr(args, "rollout_temperature", 1.0)
    if temperature is None or float(temperature) != float(want):
        raise InputError(
            f"{where}: temperature {temperature!r}, but --rollout-temperature is {want} "
            "(the trainer divides by it): a per-call temperature change breaks score centering"
        )
    checks = (
        ("top_p", lambda v: v is not None and float(v) < 1.0, "top_p < 1"),
        ("top_k", lambda v: v is not None and int(v) > 0, "top_k > 0"),
        ("min_p", lambda v: v is not None and float(v) > 0, "min_p > 0"),
        ("logit_bias", bool, "logit_bias"),
        *((name, bool, name) for name in CONSTRAINTS),
    )
    for name, bad, what in checks:
        value = _field(body, name)
        if bad(value):
            raise InputError(
                f"{where}: {what} ({name}={value!r}) shapes the draw after SGLang takes the "
                "log-probs, so they are not q; remove it (score centering)"
            )
    fmt = body.get("response_format")
    if fmt and (fmt.get("type") if isinstance(fmt, Mapping) else fmt) != "text":
        raise InputError(f"{where}: response_format {fmt!r} is constrained decoding; remove it")
    for tool in body.get("tools") or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("strict"):
            raise InputError(
                f"{where}: tool {function.get('name')!r} is strict (constrained decoding); "
                "set strict false"
            )
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise InputError(f"{where}: tool_choice {choice!r} forces a call (constrained decoding)")
    asked = body.get("top_logprobs_num", body.get("top_logprobs"))
    if asked != top_k:
        raise InputError(f"{where}: asked for a head of {asked!r} entries, not {ENV_TOP_K}={top_k}")
