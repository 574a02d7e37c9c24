"""Dr. GRPO's constant normalization of the policy-gradient loss.

Target of ``--custom-pg-loss-reducer-function-path rescue.miles.drgrpo.pg_loss_reducer``
(the dotted form: Miles' ``load_function`` splits the path on its last ``.``), used with
``--disable-grpo-std-normalization``: the arm that removes GRPO's length normalization as a
confound.

Specification
-------------
Miles' default reducer divides each rollout's token sum of ``pg_loss`` by that rollout's
trained-token count (``rollout_mask_sums``). This one divides every sample's token sum by
one constant ``D``::

    pg_loss = Σ_i Σ_t pg_{i,t} · m_{i,t} / D

(Miles then divides by the step's rollout count: ``seq-mean-token-sum-norm``). It is
Miles' own ``get_sum_of_sample_mean`` with every denominator set to ``D``, so under context
parallelism each rank sums exactly the tokens it owns, with the masks sliced per CP rank as
Miles' default reducer slices them; summed over the CP ranks this is the whole response.
It equals Miles' default when every rollout trains exactly ``D`` tokens. Only the
policy-gradient term uses it; Miles keeps the per-rollout token mean for the KL and entropy
terms and the logged metrics.

``D`` is ``RESCUE_DRGRPO_DIVISOR`` when set (a number > 0), else Miles'
``--rollout-max-response-len`` (Dr. GRPO's ``L_max``), read from Megatron's global
arguments (the reducer receives no ``args``). Refused: ``--calculate-per-token-loss``
(that is DAPO's global token mean, not Dr. GRPO), and CP > 1 with ``--qkv-format bshd``
(its CP slicing needs padded lengths the reducer is not given).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rescue import flags
from rescue.errors import InputError

#: This function's dotted path for ``--custom-pg-loss-reducer-function-path``.
REDUCER_PATH = "rescue.miles.drgrpo.pg_loss_reducer"
#: Environment variable overriding the constant divisor D.
ENV_DIVISOR = "RESCUE_DRGRPO_DIVISOR"
#: ``RESCUE_DRGRPO_DIVISOR``: the constant D (unset: ``--rollout-max-response-len``).
DIVISOR = flags.amount(
    ENV_DIVISOR,
    None,
    0,
    low_open=True,
    allowed="a number > 0",
    shown="`--rollout-max-response-len`",
)


def megatron_args() -> Any:
    """Megatron's global arguments (Miles' parsed flags in a trainer), or ``None``."""
    try:
        from megatron.training.global_vars import get_args

        return get_args()
    except (ImportError, AssertionError):
        return None


def divisor(args: Any, env: Mapping[str, str] | None = None) -> float:
    """The constant D (module docstring)."""
    given = DIVISOR.read(env)
    if given is not None:
        return given
    value = getattr(args, "rollout_max_response_len", None)
    if not value or value <= 0:
        raise InputError(
            f"the Dr. GRPO reducer needs its constant divisor: set {ENV_DIVISOR}, or run it in a "
            "Megatron trainer with --rollout-max-response-len set (its default)"
        )
    return float(value)


def pg_loss_reducer(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    loss_masks: Sequence[Any],
    calculate_per_token_loss: bool = False,
) -> Callable[[Any], Any]:
    """Miles' pg-loss reducer hook: ``x -> Σ_i Σ_t x_{i,t} m_{i,t} / D`` (CP-aware)."""
    import torch
    from miles.backends.training_utils.cp_utils import get_sum_of_sample_mean
    from miles.backends.training_utils.parallel import get_parallel_state

    if calculate_per_token_loss:
        raise InputError(
            f"--custom-pg-loss-reducer-function-path {REDUCER_PATH} with "
            "--calculate-per-token-loss: that flag is the global token mean (DAPO), not "
            "Dr. GRPO's constant divisor; remove one of them"
        )
    args = megatron_args()
    d = divisor(args)
    qkv_format = getattr(args, "qkv_format", "thd")
    if get_parallel_state().cp.size > 1 and qkv_format != "thd":
        raise InputError(
            f"--custom-pg-loss-reducer-function-path {REDUCER_PATH} with context parallelism "
            f"needs --qkv-format thd (got {qkv_format})"
        )
    device = loss_masks[0].device if len(loss_masks) else None
    denominators = torch.full((len(loss_masks),), d, dtype=torch.float32, device=device)
    return get_sum_of_sample_mean(
        list(total_lengths),
        list(response_lengths),
        list(loss_masks),
        False,
        qkv_format,
        None,
        denominators=denominators,
    )
