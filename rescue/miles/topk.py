"""The top-K recorder: every generation call records the sampler's head at each position.

Targets of ``--custom-generate-function-path`` under score centering:

- ``rescue.miles.topk.generate``: the single-turn ``/generate`` path. Miles' own
  ``single_turn.generate`` with ``top_logprobs_num: K`` added to the payload Miles builds
  (``compute_request_payload`` sends none); the heads come from
  ``meta_info.output_top_logprobs``.
- ``rescue.miles.topk.agentic_generate``: the SWE path. Miles' own
  ``agentic_tool_call.generate`` (through ``rescue.miles.generate.generate``, so a refused
  sample assembly is a no-result) with ``top_logprobs: K`` added to the request kwargs
  the agent sends (the session server forces ``logprobs`` and ``return_meta_info`` and
  passes the rest through, ``session/core.py``). The agent function
  (``--custom-agent-function-path``) is wrapped so that, when it returns or raises, the
  session's records (``GET /sessions/{id}``, ``sessions.py``; each keeps SGLang's full reply
  with ``choices[0].meta_info.output_top_logprobs``) are read before Miles collects the
  samples and deletes the session. The heads are then aligned to the assembled sample
  (``align_records``).

Specification
-------------
A sample's heads live in ``sample.metadata["rescue_topk"]`` (``KEY``), a dict of numpy
arrays: ``positions`` ``[N]`` int32 (response positions that have a head: every generated
token the sample kept), ``ids`` ``[N, K]`` int32 (``-1`` pads a head shorter than ``K``),
``logprobs`` ``[N, K]`` float32 (0 on padding), and ``digest``, the sample's token digest
(``token_digest``) when recorded, so a head can never be read for other tokens. They ride
the sample to the step's rollout hook (``rescue.miles.topk_store`` publishes them to the
trainer) and into ``--save-debug-rollout-data`` dumps, so a replay trains with them too.

Alignment (``align_records``): the assembled sample's trained tokens are runs of 1s in its
loss mask, one run per model call that produced output tokens, in order (Miles'
``merge_samples`` puts each observation's 0s between them). Run ``j`` takes the first
``n_j`` rows of the ``j``-th such record; the rest of a record is what the session trimmed
(a stop token the template re-renders) or truncated. Later records are turns the session
dropped. Every aligned token must equal the record's output token (else ``InputError``):
the heads are never guessed.

Each recorded request is checked (``rescue.miles.sc_flags.check_request``): a request whose
log-probs are not the draw's ``q`` stops the run with its field named. A session whose
records cannot be read (a transport fault) leaves the sample ``ABORTED`` with
``metadata["rescue_topk_error"]``: Miles never trains it and rescue's census counts it as
an infrastructure no-result, never as a failure.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rescue.errors import InputError
from rescue.miles.sc_flags import check_request, check_sc_flags, top_k_from_env

logger = logging.getLogger(__name__)

#: Where a sample's heads live in its metadata.
KEY = "rescue_topk"
#: Why a sample's heads could not be recorded (the sample is then aborted).
ERROR_KEY = "rescue_topk_error"
#: The agent wrapper ``agentic_generate`` substitutes for ``--custom-agent-function-path``.
RECORDING_AGENT_PATH = "rescue.miles.topk.recording_agent"
#: Tolerance between a sampled token's log-prob and its own entry in the head (one tensor).
SAME_DISTRIBUTION_ATOL = 1e-3
#: How errors of the single-turn recorder name it.
GENERATE_ERROR = f"--custom-generate-function-path {__name__}.generate"


def token_digest(tokens: Any) -> str:
    """A digest of a token sequence (int64 bytes), the same for a list and a tensor."""
    if hasattr(tokens, "detach"):
        tokens = tokens.detach().cpu().numpy()
    data = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64)).tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def head_rows(
    top: Sequence[Any] | None, sampled: Sequence[Any], k: int, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [n, k], logprobs [n, k])`` from SGLang's ``output_top_logprobs``.

    ``top``: one entry per output position, a list of ``[logprob, token_id, text]``
    (``tokenizer_manager.detokenize_top_logprobs_tokens``); ``sampled``: the matching
    ``output_token_logprobs`` entries ``[logprob, token_id, text]``.
    """
    n = len(sampled)
    if top is None:
        raise InputError(
            f"{where}: no meta_info.output_top_logprobs in SGLang's reply (the request asked "
            f"for a head of {k}): the engine or a proxy dropped it"
        )
    if len(top) != n:
        raise InputError(f"{where}: {len(top)} rows of output_top_logprobs for {n} output tokens")
    ids = np.full((n, k), -1, dtype=np.int32)
    logprobs = np.zeros((n, k), dtype=np.float32)
    for j, (row, (lp_y, y, *_)) in enumerate(zip(top, sampled, strict=True)):
        if not row:
            raise InputError(f"{where}: output position {j} has no head (null row)")
        if len(row) > k:
            raise InputError(f"{where}: output position {j} has {len(row)} head entries, K={k}")
        for e, (lp, tid, *_) in enumerate(row):
            ids[j, e], logprobs[j, e] = int(tid), float(lp)
            if int(tid) == int(y) and abs(float(lp) - float(lp_y)) > SAME_DISTRIBUTION_ATOL:
                raise InputError(
                    f"{where}: output position {j}: token {y} has log-prob {lp_y} sampled and "
                    f"{lp} in the head: not one distribution"
                )
    return ids, logprobs


def runs_of_ones(mask: Sequence[int] | None, n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each run of 1s in a loss mask (``None``: one run of ``n``)."""
    if mask is None:
        return [(0, n)] if n else []
    out, start = [], None
    for t, v in enumerate(mask):
        if v and start is None:
            start = t
        elif not v and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, len(mask)))
    return out


def align_records(
    records: Sequence[Mapping[str, Any]],
    tokens: Sequence[int],
    response_length: int,
    loss_mask: Sequence[int] | None,
    k: int,
    args: Any,
) -> dict[str, np.ndarray]:
    """The heads of an assembled multi-turn sample from its session records (docstring)."""
    prompt = len(tokens) - response_length
    calls = []
    for i, record in enumerate(records):
        where = f"chat request {i} of the session"
        check_request(record["request"], args, k, where)
        meta = record["response"]["choices"][0].get("meta_info") or {}
        sampled = meta.get("output_token_logprobs") or []
        if sampled:
            calls.append((where, meta, sampled))
    runs = runs_of_ones(loss_mask, response_length)
    if len(runs) > len(calls):
        raise InputError(
            f"the sample has {len(runs)} runs of trained tokens but its session recorded "
            f"{len(calls)} model calls with output: the heads cannot be aligned"
        )
    positions, ids, logprobs = [], [], []
    for (start, stop), (where, meta, sampled) in zip(runs, calls, strict=False):
        n = stop - start
        if n > len(sampled):
            raise InputError(
                f"{where}: {len(sampled)} output tokens for a run of {n} trained tokens"
            )
        want = [int(t[1]) for t in sampled[:n]]
        have = [int(t) for t in tokens[prompt + start : prompt + stop]]
        if want != have:
            raise InputError(
                f"{where}: its output tokens are not the sample's trained tokens at response "
                f"positions {start}..{stop - 1}: the heads cannot be aligned"
            )
        top = meta.get("output_top_logprobs")
        rows_ids, rows_lp = head_rows(None if top is None else top[:n], sampled[:n], k, where)
        positions.append(np.arange(start, stop, dtype=np.int32))
        ids.append(rows_ids)
        logprobs.append(rows_lp)
    return _pack(tokens, positions, ids, logprobs, k)


def _pack(tokens: Any, positions: list, ids: list, logprobs: list, k: int) -> dict[str, Any]:
    return {
        "positions": np.concatenate(positions) if positions else np.zeros(0, np.int32),
        "ids": np.concatenate(ids) if ids else np.zeros((0, k), np.int32),
        "logprobs": np.concatenate(logprobs) if logprobs else np.zeros((0, k), np.float32),
        "digest": token_digest(tokens),
    }


async def generate(input: Any) -> Any:
    """Miles' single-turn ``/generate`` with the head recorded (module docstring)."""
    from miles.rollout.base_types import GenerateFnOutput
    from miles.rollout.generate_utils.generate_endpoint_utils import (
        compute_prompt_ids_from_sample,
        compute_request_payload,
        compute_routing_headers,
        update_sample_from_response,
    )
    from miles.utils.http_utils import post
    from miles.utils.types import Sample

    args, sample = input.args, input.sample
    check_sc_flags(args)
    k = top_k_from_env()
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED) or sample.response:
        raise InputError(
            f"{GENERATE_ERROR}: sample {sample.index} already has a response (status "
            f"{sample.status}); a resumed response mixes draws the recorder did not see"
        )
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_ids = compute_prompt_ids_from_sample(input.state, sample)
    payload, halt_status = compute_request_payload(
        args,
        input_ids=prompt_ids,
        sampling_params=input.sampling_params,
        multimodal_inputs=sample.multimodal_inputs,
    )
    if payload is None:
        sample.status = halt_status
        return GenerateFnOutput(samples=sample)
    payload["top_logprobs_num"] = k
    check_request(payload, args, k, "the /generate request")
    output = await post(url, payload, headers=compute_routing_headers(args, sample))
    await update_sample_from_response(args, sample, payload=payload, output=output)
    meta = output["meta_info"]
    sampled = meta.get("output_token_logprobs") or []
    where = f"/generate reply for sample {sample.index}"
    rows_ids, rows_lp = head_rows(meta.get("output_top_logprobs"), sampled, k, where)
    positions = np.arange(len(sampled), dtype=np.int32)
    sample.metadata[KEY] = _pack(sample.tokens, [positions], [rows_ids], [rows_lp], k)
    return GenerateFnOutput(samples=sample)


@dataclasses.dataclass
class _Recording:
    """What ``recording_agent`` hands back to ``agentic_generate`` (one per trajectory)."""

    agent: Any
    records: list[dict[str, Any]] | None = None
    error: str | None = None


_RECORDING: contextvars.ContextVar[_Recording] = contextvars.ContextVar("rescue_topk_recording")


async def _session_records(base_url: str) -> list[dict[str, Any]]:
    """The session's records (``GET /sessions/{id}``, Miles' ``SessionCore.get_session``)."""
    from miles.utils.http_utils import post

    reply = await post(base_url, {}, max_retries=3, action="get")
    if not isinstance(reply, Mapping) or not isinstance(reply.get("records"), list):
        raise InputError(f"GET {base_url} did not return the session's records")
    return reply["records"]


async def recording_agent(
    base_url: str, prompt: Any, request_kwargs: Any, metadata: Any, **kwargs: Any
) -> Any:
    """The agent ``agentic_generate`` runs: the real agent, then the session's records."""
    recording = _RECORDING.get(None)
    if recording is None:
        raise InputError(
            f"{RECORDING_AGENT_PATH} runs only inside {__name__}.agentic_generate; set "
            f"--custom-generate-function-path {__name__}.agentic_generate instead"
        )
    try:
        return await recording.agent(
            base_url=base_url,
            prompt=prompt,
            request_kwargs=request_kwargs,
            metadata=metadata,
            **kwargs,
        )
    finally:
        try:
            recording.records = await _session_records(base_url)
        except Exception as e:  # a transport fault: the sample is aborted, not trained
            recording.error = f"reading the session's records failed: {e!r}"


async def agentic_generate(input: Any) -> Any:
    """Miles' agentic generate (SWE path) with every call's head recorded (docstring)."""
    from miles.utils.misc import load_function
    from miles.utils.types import Sample

    from rescue.miles.generate import generate as generate_agentic

    args = input.args
    check_sc_flags(args)
    k = top_k_from_env()
    agent = load_function(args.custom_agent_function_path)
    if agent is None:
        raise InputError(
            f"--custom-agent-function-path {args.custom_agent_function_path} not found"
        )
    state = copy.copy(input.state)
    state.args = copy.copy(args)
    state.args.custom_agent_function_path = RECORDING_AGENT_PATH
    recording = _Recording(agent=agent)
    token = _RECORDING.set(recording)
    try:
        output = await generate_agentic(  # a refused sample assembly: a no-result
            dataclasses.replace(
                input,
                state=state,
                sampling_params={**input.sampling_params, "logprobs": True, "top_logprobs": k},
            )
        )
    finally:
        _RECORDING.reset(token)
    samples = output.samples if isinstance(output.samples, list) else [output.samples]
    for sample in samples:
        if sample.status == Sample.Status.ABORTED:
            continue
        if recording.error is not None or recording.records is None:
            sample.status = Sample.Status.ABORTED
            sample.metadata[ERROR_KEY] = recording.error or "the session's records were not read"
            logger.warning("sample %s aborted: %s", sample.index, sample.metadata[ERROR_KEY])
            continue
        sample.metadata[KEY] = align_records(
            recording.records, sample.tokens, sample.response_length, sample.loss_mask, k, args
        )
    return output


def _add_agentic_arguments(parser: Any) -> None:
    """The flags of the generate function wrapped (``--custom-agent-function-path``,
    ``--max-seq-len``): Miles adds a custom generate function's flags to its parser
    (``arguments.py`` ``add_user_provided_function_arguments``)."""
    from miles.rollout.generate_hub import agentic_tool_call

    agentic_tool_call.generate.add_arguments(parser)


agentic_generate.add_arguments = _add_agentic_arguments  # type: ignore[attr-defined]
