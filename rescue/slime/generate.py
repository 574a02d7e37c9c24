"""A generate-function wrapper that records which tokens each model call produced.

Target of ``--custom-generate-function-path rescue.slime.generate.generate``; the generate
function it wraps is ``RESCUE_GENERATE_FUNCTION`` (default slime's own
``slime.rollout.sglang_rollout.generate``; any function slime's ``generate_and_rm`` could
call, with or without its ``evaluation`` argument).

Why: slime pauses its engines with SGLang's default ``abort`` mode at every weight update
(``SGLangEngine.pause_generation`` posts ``{}`` to ``/pause_generation``; SGLang's
``PauseGenerationReqInput.mode`` defaults to ``"abort"``). The aborted reply still appends
its weight version to the sample (``Sample._apply_meta_info``), even without a token; slime's
fully-async worker requeues the group and ``generate()`` resumes the sample from its
tokens. Without knowing which call produced which tokens, that sample looks like two model
calls (two turns: ``RESCUE_ESTIMATOR=turn`` stops, the census counts two turns) and as
stale as the aborted call's version.

Specification
-------------
Around each call of the wrapped function on a sample, the wrapper notes the response
length and the number of weight versions before, and whether the sample entered aborted
(status ``aborted``: a resume). When the function returns that same sample, it appends
``[start, stop, versions appended, resumed]`` to ``metadata["rescue_calls"]``
(``rescue.model_calls``, which reads it: the counted versions and the turns). A call that
appended no version adds nothing. A function that returns other ``Sample`` objects (a
fan-out into several samples) records nothing on them: they keep the plain rules.

The record is plain JSON (it survives ``Sample.to_dict`` and the debug dumps), and the
wrapper changes nothing else: the sample, its tokens and its status are the wrapped
function's.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from rescue import flags
from rescue.errors import InputError
from rescue.model_calls import CALLS_KEY, record_entry
from rescue.outcomes import status_value

#: Environment variable naming the generate function the wrapper calls.
ENV_GENERATE = "RESCUE_GENERATE_FUNCTION"
#: Its default: slime's own single-turn generate.
DEFAULT_GENERATE = "slime.rollout.sglang_rollout.generate"
#: This wrapper's dotted path (the value of ``--custom-generate-function-path``).
GENERATE_PATH = "rescue.slime.generate.generate"


def _wrapped(path: str) -> str:
    if path == GENERATE_PATH:
        raise InputError(
            f"{ENV_GENERATE}={path}: the wrapper cannot wrap itself; allowed: the generate "
            f"function to record (default {DEFAULT_GENERATE})"
        )
    return path


#: ``RESCUE_GENERATE_FUNCTION`` (default slime's ``generate``); the wrapper itself is
#: refused (it would call itself).
GENERATE_FUNCTION = flags.setting(
    ENV_GENERATE,
    DEFAULT_GENERATE,
    _wrapped,
    f"the generate function to record (default {DEFAULT_GENERATE})",
    shown=f"slime's `{DEFAULT_GENERATE}`",
)
generate_path_from_env = GENERATE_FUNCTION.read


@functools.lru_cache(maxsize=8)
def _load(path: str) -> tuple[Any, bool]:
    from slime.utils.misc import load_function

    fn = load_function(path)
    return fn, "evaluation" in inspect.signature(fn).parameters


async def generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
    """slime's generate-function contract; the wrapped function's result, unchanged but
    for the record (module docstring)."""
    fn, takes_evaluation = _load(generate_path_from_env())
    start = int(getattr(sample, "response_length", 0) or 0)
    before = len(getattr(sample, "weight_versions", None) or ())
    resumed = status_value(getattr(sample, "status", None)) == "aborted"
    if takes_evaluation:
        result = await fn(args, sample, sampling_params, evaluation=evaluation)
    else:
        result = await fn(args, sample, sampling_params)
    returned = result if isinstance(result, list) else [result]
    if any(r is sample for r in returned):
        record(sample, start, before, resumed)
    return result


def record(sample: Any, start: int, versions_before: int, resumed: bool) -> None:
    """Append one call's entry to the sample's record (nothing when it appended no version)."""
    appended = len(getattr(sample, "weight_versions", None) or ()) - versions_before
    if appended <= 0:
        return
    stop = int(getattr(sample, "response_length", 0) or 0)
    if sample.metadata is None:
        sample.metadata = {}
    sample.metadata.setdefault(CALLS_KEY, []).append(record_entry(start, stop, appended, resumed))
