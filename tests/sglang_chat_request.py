"""SGLang 0.5.23's ``ChatCompletionRequest`` fields, for Miles code that filters by them.

Miles' ``agentic_tool_call.build_chat_request_kwargs`` keeps the request keys that are
fields of ``sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest``. SGLang is not
installed for the CPU tests (``miles_env`` registers an import-only stand-in of that
module), so ``install()`` adds a pydantic ``ChatCompletionRequest`` with exactly the field
names of SGLang 0.5.23's (``protocol.py`` lines 909-1060, and its base ``PDRoutingFields``,
lines 350-370, as read from the PyPI wheel), and nothing else of it. Where the real module
is installed, it is left alone.
"""

from __future__ import annotations

import sys

#: ``ChatCompletionRequest``'s public fields in SGLang 0.5.23, in source order.
FIELDS = (
    *("bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank"),
    *("disagg_prefill_dp_rank", "messages", "model", "frequency_penalty", "logit_bias"),
    *("logprobs", "top_logprobs", "max_tokens", "max_completion_tokens", "n"),
    *("presence_penalty", "response_format", "seed", "stop", "stream", "stream_options"),
    *("temperature", "top_p", "user", "tools", "tool_choice", "parallel_tool_calls"),
    *("return_hidden_states", "return_routed_experts", "routed_experts_start_len"),
    *("return_cached_tokens_details", "return_spec_tokens_details"),
    *("return_prompt_token_ids", "return_token_ids", "return_meta_info"),
    *("return_input_ids_in_sglext", "return_output_ids_in_sglext", "return_sampling_mask"),
    *("sampling_logprobs_mode", "return_flat_raw_output_top_logprobs"),
    *("return_flat_raw_top_logprobs_b64", "reasoning_effort", "thinking", "task"),
    *("top_k", "min_p", "min_tokens", "regex", "ebnf", "repetition_penalty"),
    *("stop_token_ids", "stop_regex", "no_stop_trim", "ignore_eos", "continue_final_message"),
    *("skip_special_tokens", "lora_path", "session_id", "session_params"),
    *("separate_reasoning", "stream_reasoning", "chat_template_kwargs", "max_dynamic_patch"),
    *("min_dynamic_patch", "use_audio_in_video", "images_config", "video_config"),
    *("mm_processor_kwargs", "custom_logit_processor", "custom_params", "watermark"),
    *("input_ids", "rid", "extra_key", "cache_salt", "priority", "data_parallel_rank"),
)


def install() -> None:
    """Give the stand-in protocol module a ``ChatCompletionRequest`` with SGLang's fields."""
    from typing import Any

    from pydantic import create_model

    protocol = sys.modules.get("sglang.srt.entrypoints.openai.protocol")
    if protocol is None or getattr(protocol, "__file__", None) is not None:
        return  # not imported yet, or the real SGLang
    current = getattr(protocol, "ChatCompletionRequest", None)
    if current is None or set(getattr(current, "model_fields", {})) != set(FIELDS):
        protocol.ChatCompletionRequest = create_model(
            "ChatCompletionRequest", **{name: (Any, None) for name in FIELDS}
        )
    # Miles' agentic generate function took the name at import: an earlier test may have
    # imported it with an empty stand-in (tests/framework_args.py)
    agentic = sys.modules.get("miles.rollout.generate_hub.agentic_tool_call")
    if agentic is not None:
        agentic.ChatCompletionRequest = protocol.ChatCompletionRequest
