"""Miles' agentic generate function, with a refused sample assembly turned into a no-result.

Target of ``--custom-generate-function-path rescue.miles.generate.generate``, in place of
``miles.rollout.generate_hub.agentic_tool_call.generate`` (same flags, same session server;
Miles is not patched).

Specification
-------------
``generate(input)`` awaits Miles' ``agentic_tool_call.generate(input)`` and returns what it
returns, with one exception turned into a result. When the session's records cannot be
assembled into a training sample, Miles' session server answers ``POST
/sessions/{id}/samples`` with HTTP 422 and the assertion's text (``session/core.py``,
``collect_samples``: ``except (AssertionError, ValueError)`` → 422, lines 336-339; the v2
server likewise, ``session/v2/core.py`` lines 99-122). The client,
``OpenAIEndpointTracer.collect_samples``, posts through
``http_utils.post_bytes_no_retry``, which raises ``RuntimeError("POST <url> failed with
422: <text>")`` on any non-2xx (``utils/http_utils.py`` lines 266-268; the tracer deletes
the session in its ``finally`` first). ``agentic_tool_call.generate`` catches only
``TimeoutError`` and ``httpx.TransportError`` around it (lines 91-96), so the error
escapes the group's ``gather`` (``generate_and_rm_group``) and ends Miles' fully-async
producer loop.

Here that error (``is_assembly_refusal``) gives a copy of the input sample with status
``ABORTED`` and metadata ``outcome=infra_no_result``, ``outcome_reason=sample_assembly``
and ``error`` (the server's text): no reward is computed for it (Miles skips the reward of
an aborted sample), the buffer drops its group as a no-result in every arm, and the census
counts it under its reason (``rescue.outcomes.REASONS``). The returned shape is Miles':
one ``Sample`` (session server v1), or a list of one (``--use-session-server v2``). Any
other exception propagates unchanged.

A refusal is deterministic for its records (malformed turns, a history the TITO
tokenizer cannot merge), so it can track what the agent did: the census reason is how the
rate is watched, and the watchdog stops a run where it dominates.
"""

from __future__ import annotations

import logging
import re
from copy import deepcopy
from typing import Any

logger = logging.getLogger(__name__)

#: ``http_utils.post_bytes_no_retry``'s message for a 422 from the samples endpoint.
ASSEMBLY_REFUSAL = re.compile(r"^POST \S+/samples failed with 422: ", re.S)
REASON = "sample_assembly"


def is_assembly_refusal(error: BaseException) -> bool:
    """Whether ``error`` is the session server refusing to assemble a sample (HTTP 422)."""
    return isinstance(error, RuntimeError) and bool(ASSEMBLY_REFUSAL.match(str(error)))


def no_result_sample(sample: Any, error: str, *, status: Any) -> Any:
    """A copy of ``sample`` with ``status`` (``ABORTED``) and the no-result metadata."""
    out = deepcopy(sample)
    out.status = status
    out.metadata = {
        **(out.metadata or {}),
        "outcome": "infra_no_result",
        "outcome_reason": REASON,
        "error": error[:2000],
    }
    return out


async def generate(input: Any) -> Any:
    """Miles' ``agentic_tool_call.generate`` with a 422 from sample assembly as a no-result."""
    from miles.rollout.base_types import GenerateFnOutput
    from miles.rollout.generate_hub import agentic_tool_call
    from miles.utils.types import Sample

    try:
        return await agentic_tool_call.generate(input)
    except RuntimeError as e:
        if not is_assembly_refusal(e):
            raise
        logger.warning("sample assembly refused (no result for this rollout): %s", e)
        sample = no_result_sample(input.sample, str(e), status=Sample.Status.ABORTED)
        use_v2 = getattr(input.args, "use_session_server", None) == "v2"
        return GenerateFnOutput(samples=[sample] if use_v2 else sample)


def _add_arguments(parser: Any) -> None:
    """The flags of Miles' agentic generate function (``--custom-agent-function-path``, …)."""
    from miles.rollout.generate_hub import agentic_tool_call

    agentic_tool_call.generate.add_arguments(parser)


generate.add_arguments = _add_arguments  # type: ignore[attr-defined]
