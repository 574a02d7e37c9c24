"""The policy's chat endpoint as the agent meets it: the model object, context limits, tool calls.

Specification
-------------
``litellm_model`` is mini-swe-agent's ``LitellmModel`` (one ``bash`` tool, read back from
``message.tool_calls`` only) against an OpenAI-compatible endpoint (Miles' session server
in training, an SGLang server in the pilot). One change: a request the server refuses
because it would exceed the model's context (HTTP 400 with one of SGLang's messages,
``CONTEXT_LIMIT_MESSAGES``) raises litellm's ``ContextWindowExceededError``.
mini-swe-agent never retries that error, records it as the exit status, and
``rescue.outcomes`` books it a budget failure (``context_limit``): the trajectory ran out
of context, which is the policy's budget, not an infrastructure fault. Without the change
litellm versions that do not know SGLang's wording surface it as ``BadRequestError``,
which mini-swe-agent retries ten times and the classifier would call infrastructure.

SGLang's messages (``tokenizer_manager`` and the OpenAI chat server):

- ``The input (N tokens) is longer than the model's context length (M tokens).``
- ``Requested token count exceeds the model's maximum context length of M tokens. ...``
- ``Input length (N tokens) exceeds the maximum allowed length (M tokens). ...``

Not among them: ``max_completion_tokens is too large`` (``max_tokens`` above the whole
context) refuses every request whatever the trajectory, a misconfiguration the launchers
reject (``MAX_RESPONSE_LEN < MAX_SEQ_LEN``); it stays an endpoint fault.

Retries. A request that fails for the endpoint's sake (no connection, a timeout, a 5xx, a
429: ``is_endpoint_fault``) is retried with exponential backoff (``RETRY_WAIT_S``) for up
to ``patience_s`` seconds from its first failure, then raised; every other error is raised
at once (mini-swe-agent's own retry loop is set to one attempt: ``agent`` sets
``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1`` unless it is set). The model keeps the seconds
lost this way in ``endpoint_wait_s``: they are the infrastructure's, not the agent's
budget. A set ``cancel`` event ends the waiting.

``probe_tool_calls`` is the pre-flight of a served endpoint: one chat request with
mini-swe-agent's bash tool asking for ``echo ready``. It passes when the reply carries
the call in ``tool_calls``. It fails, naming the SGLang flag, when the call comes back as
text in ``content`` (SGLang without ``--tool-call-parser`` leaves Qwen's
``<tool_call>...</tool_call>`` there: every trial would end in format errors) or when
the content carries the model's ``<think>`` block (no ``--reasoning-parser``: the
thinking would be sent back to the model as the reply's text). A model that answers
without any call after ``tries`` requests fails too: nothing would be learnt from trials.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: SGLang's words for a request that does not fit the context (lowercase substrings).
CONTEXT_LIMIT_MESSAGES = (
    "is longer than the model's context length",
    "requested token count exceeds the model's maximum context length",
    "exceeds the maximum allowed length",
)
#: Backoff between retries of a failing endpoint: first wait and most, seconds.
RETRY_WAIT_S = (1.0, 60.0)
#: litellm errors that are the endpoint's fault (besides any error with a 5xx status).
ENDPOINT_FAULTS = (
    *("APIConnectionError", "Timeout", "InternalServerError", "ServiceUnavailableError"),
    *("RateLimitError", "BadGatewayError"),
)
#: A tool call left as text: Qwen/Hermes ``<tool_call>``, the Qwen3-coder ``<function=``
#: form, or a bare JSON call of the bash tool.
TOOL_CALL_TEXT = re.compile(r"<tool_call>|<function=|\{\s*\"name\"\s*:\s*\"bash\"")
#: A reasoning block left in the content.
THINK_TEXT = re.compile(r"</?think>")
#: OpenAI chat parameters passed as such; other request keys go in ``extra_body`` (SGLang).
OPENAI_PARAMS = frozenset(
    {
        *("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "n"),
        *("presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias"),
        *("user", "response_format", "tool_choice", "parallel_tool_calls"),
    }
)


def is_context_limit(message: str) -> bool:
    """Whether an error message is SGLang refusing a request that exceeds the context."""
    text = message.lower()
    return any(m in text for m in CONTEXT_LIMIT_MESSAGES)


def api_base(base_url: str) -> str:
    """``base_url`` ending in ``/v1`` (what litellm's OpenAI provider expects)."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def is_endpoint_fault(e: BaseException) -> bool:
    """Whether a model request failed for the endpoint's sake (retried; see the docstring)."""
    import litellm

    if isinstance(e, litellm.exceptions.ContextWindowExceededError):
        return False
    kinds = tuple(
        getattr(litellm.exceptions, n) for n in ENDPOINT_FAULTS if hasattr(litellm.exceptions, n)
    )
    if isinstance(e, kinds):
        return True
    status = getattr(e, "status_code", None)
    return isinstance(status, int) and status >= 500


def litellm_model(
    *,
    base_url: str,
    model_name: str,
    request_kwargs: Mapping[str, Any],
    timeout_s: float,
    model_config: Mapping[str, Any] | None = None,
    patience_s: float = 1800,
    cancel: threading.Event | None = None,
) -> Any:
    """mini-swe-agent's ``LitellmModel`` for ``openai/<model_name>`` at ``base_url``.

    ``request_kwargs`` are the sampling parameters (OpenAI ones as such, the rest in
    ``extra_body``); ``model_config`` is the ``model`` section of a mini-swe-agent config
    (its ``model_kwargs`` and ``*_template`` strings). Cost tracking is off. ``patience_s``
    (default 1800) and ``cancel`` (default none) govern the retries (module docstring).
    """
    import litellm

    litellm.suppress_debug_info = True  # else a provider banner per unpriced call
    model_config = model_config or {}
    sampling = {k: v for k, v in request_kwargs.items() if k in OPENAI_PARAMS}
    extra_body = {k: v for k, v in request_kwargs.items() if k not in OPENAI_PARAMS}
    kwargs = {
        **dict(model_config.get("model_kwargs", {})),
        **sampling,
        "api_base": api_base(base_url),
        "api_key": os.environ.get("RESCUE_SWE_API_KEY", "EMPTY"),
        "timeout": timeout_s,
        **({"extra_body": extra_body} if extra_body else {}),
    }
    templates = {
        k: v for k, v in model_config.items() if k.endswith("_template") and isinstance(v, str)
    }
    model = _model_class()(
        model_name=f"openai/{model_name}",
        model_kwargs=kwargs,
        cost_tracking="ignore_errors",
        **templates,
    )
    model.patience_s, model.cancel = patience_s, cancel
    return model


_MODEL_CLASS: type | None = None


def _model_class() -> type:
    """``LitellmModel`` that raises ``ContextWindowExceededError`` for SGLang's context 400s
    and retries a failing endpoint with patience (module docstring)."""
    global _MODEL_CLASS
    if _MODEL_CLASS is None:
        import litellm
        from minisweagent.models.litellm_model import LitellmModel

        class ContextAwareLitellmModel(LitellmModel):
            patience_s: float = 1800.0
            cancel: threading.Event | None = None
            endpoint_wait_s: float = 0.0

            def _query(self, messages: list[dict[str, str]], **kwargs: Any) -> Any:
                delay, deadline = RETRY_WAIT_S[0], None
                while True:
                    started = time.monotonic()
                    try:
                        return self._query_once(messages, **kwargs)
                    except Exception as e:
                        if not is_endpoint_fault(e):
                            raise
                        deadline = deadline or started + self.patience_s
                        wait = min(delay, max(0.0, deadline - time.monotonic()))
                        give_up = time.monotonic() + wait >= deadline
                        if not give_up:
                            (self.cancel or threading.Event()).wait(wait)
                        self.endpoint_wait_s += time.monotonic() - started
                        if give_up or (self.cancel is not None and self.cancel.is_set()):
                            raise
                        delay = min(2 * delay, RETRY_WAIT_S[1])

            def _query_once(self, messages: list[dict[str, str]], **kwargs: Any) -> Any:
                try:
                    return super()._query(messages, **kwargs)
                except litellm.exceptions.BadRequestError as e:
                    if isinstance(e, litellm.exceptions.ContextWindowExceededError):
                        raise
                    if not is_context_limit(str(e)):
                        raise
                    raise litellm.exceptions.ContextWindowExceededError(
                        message=str(e),
                        model=self.config.model_name,
                        llm_provider=getattr(e, "llm_provider", "openai"),
                    ) from e

        _MODEL_CLASS = ContextAwareLitellmModel
    return _MODEL_CLASS


@dataclass(frozen=True)
class Probe:
    """Verdict of ``probe_tool_calls``: passed, and one line saying why."""

    ok: bool
    message: str


def probe_tool_calls(
    base_url: str,
    model: str,
    *,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    request_kwargs: Mapping[str, Any] | None = None,
    tries: int = 3,
    timeout_s: float = 300,
) -> Probe:
    """One chat request with the bash tool (up to ``tries``); the verdict in the docstring.

    ``tool_call_parser`` / ``reasoning_parser`` are the parser names the endpoint should
    run with (named in the failure message); ``request_kwargs`` are added to the body
    (e.g. ``chat_template_kwargs``).
    """
    from minisweagent.models.utils.actions_toolcall import BASH_TOOL

    body = {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": "Call the bash tool once with the command `echo ready`. "
                "Do not answer in text.",
            }
        ],
        "tools": [BASH_TOOL],
        "temperature": 0,
        "max_tokens": 2048,
        **dict(request_kwargs or {}),
    }
    tool_flag = f"--tool-call-parser {tool_call_parser or '<parser>'}"
    reasoning_flag = f"--reasoning-parser {reasoning_parser or '<parser>'}"
    for _ in range(max(1, tries)):
        try:
            reply = _post_json(f"{api_base(base_url)}/chat/completions", body, timeout_s)
        except (OSError, ValueError) as e:
            return Probe(False, f"no chat reply from {base_url}: {e}")
        try:
            message = reply["choices"][0]["message"] or {}
        except (KeyError, IndexError, TypeError):
            return Probe(False, f"{base_url} answered without a chat message: {str(reply)[:300]}")
        content = str(message.get("content") or "")
        if TOOL_CALL_TEXT.search(content):
            return Probe(
                False,
                f"the tool call came back as text in content, not in tool_calls: serve the model "
                f"with {tool_flag} (Miles: --sglang-{tool_flag[2:]})",
            )
        if THINK_TEXT.search(content):
            return Probe(
                False,
                f"the model's <think> block came back in content: serve the model with "
                f"{reasoning_flag} (Miles: --sglang-{reasoning_flag[2:]})",
            )
        calls = message.get("tool_calls") or []
        if any((c.get("function") or {}).get("name") == "bash" for c in calls):
            return Probe(True, f"{base_url} returns tool calls in tool_calls ({model})")
    return Probe(
        False,
        f"the model answered {tries} requests without calling the bash tool: check the "
        f"served model, its chat template and {tool_flag}",
    )


def _post_json(url: str, body: Mapping[str, Any], timeout_s: float) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ.get('RESCUE_SWE_API_KEY', 'EMPTY')}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:300]
        raise ValueError(f"HTTP {e.code}: {detail}") from None
