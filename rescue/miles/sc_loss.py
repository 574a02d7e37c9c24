"""TIS + score centering as Miles' policy loss, composed with rescue's advantages.

Target of ``--loss-type custom_loss --custom-loss-function-path
rescue.miles.sc_loss.policy_loss`` (the asynchronous arms' ``OFFPOLICY=tis-sc``). It
replaces Miles' PPO loss with ``--use-tis``; the two never both apply (``--use-tis`` is
refused, ``rescue.miles.sc_flags``).

Specification
-------------
``policy_loss(args, batch, logits, sum_of_sample_mean)`` (Miles' loss protocol):

1. The advantages are rescue's, exactly as ``rescue.miles.loss.policy_loss`` trains them:
   Miles' scalar (the group advantage, ``R = 0`` on budget failures and the protect
   arm's ``1/a`` already in it) plus the per-token channel (``RESCUE_ESTIMATOR=turn``), and
   their moments are recorded for ``train/rescue/adv_*``.
2. For each sample, on the response positions this rank holds (after CP slicing), with
   Miles' own ``get_responses`` (temperature-scaled logits, CP-aware): the trainer's
   ``log p`` of the sampled token and of the recorded head ids (one log-normaliser over
   the vocabulary, reduced across tensor-parallel ranks; each logit taken from the rank
   that holds its vocabulary shard), and the sampler's recorded ``log q`` of both
   (``rollout_log_probs`` and the heads published by ``rescue.miles.topk_store``).
3. Per token, ``rescue.score_centering.token_terms`` with ``C = RESCUE_SC_CAP``; the token
   loss is ``-A_t s_t`` on trained tokens (loss mask 1) and 0 elsewhere. A trained token
   without its head is an ``InputError``; a sample with no trained token on this rank (a
   removed sample) is not looked up.
4. Reduced like Miles' policy-gradient term: ``--custom-pg-loss-reducer-function-path``
   when set (Dr. GRPO's constant divisor, ``rescue.miles.drgrpo``), else Miles'
   ``sum_of_sample_mean``; Miles then scales by micro-batches and rollouts as for any loss.
5. It records, over the trained tokens, the sampler's and the trainer's head mass, the
   fraction of sampled-token ratios above ``C`` and the centering's L1 size ``Σ_H |c_v|``
   (``SC_STATS``; ``rescue.miles.train_step`` reduces them over DP x CP after the optimizer
   step and logs ``train/rescue/sc/*``). A recomputed micro-batch is recorded once.

Returned metrics (Miles logs them under ``train/``): ``loss`` and ``pg_loss``. There is no
KL or entropy term (both refused) and no PPO clip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rescue.errors import InputError
from rescue.miles.sc_flags import cap_from_env, check_sc_flags

# The step's figures live below this loss and the before-train-step hook (no import circle).
from rescue.miles.sc_stats import SC_STATS, STAT_KEYS, SCStats

__all__ = ["SC_STATS", "STAT_KEYS", "SCStats", "policy_loss"]


def _reduce_sum_keep_grad(x: Any, group: Any) -> Any:
    """All-reduce (sum) over the tensor-parallel group; the backward is the identity, as
    for any term of a loss every TP rank computes identically (Megatron's
    ``reduce_from_tensor_model_parallel_region``)."""
    import torch
    import torch.distributed as dist

    class _Sum(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: Any) -> Any:
            out = t.clone()
            dist.all_reduce(out, group=group)
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad

    return _Sum.apply(x)


def vocab_parallel_log_probs(logits: Any, ids: Any, tp: Any) -> Any:
    """``log softmax(logits)`` at ``ids`` over the whole vocabulary.

    ``logits`` ``[n, V_local]``: this TP rank's vocabulary shard (``tp.rank * V_local`` on);
    ``ids`` ``[n, m]`` global ids (``-1``: none, gives 0). Differentiable in ``logits``.
    """
    import torch
    import torch.distributed as dist

    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    v_local = logits.size(-1)
    sharded = tp.size > 1
    with torch.no_grad():
        m = logits.max(dim=-1).values
        if sharded:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=tp.group)
    sum_exp = (logits - m[:, None]).exp().sum(dim=-1)
    if sharded:
        sum_exp = _reduce_sum_keep_grad(sum_exp, tp.group)
    log_z = m + sum_exp.log()
    local = ids - tp.rank * v_local
    here = (ids >= 0) & (local >= 0) & (local < v_local)
    picked = logits.gather(-1, local.clamp(0, v_local - 1))
    picked = torch.where(here, picked, torch.zeros_like(picked))
    if sharded:
        picked = _reduce_sum_keep_grad(picked, tp.group)
    return torch.where(ids >= 0, picked - log_z[:, None], torch.zeros_like(picked))


def policy_loss(
    args: Any,
    batch: dict,
    logits: Any,
    sum_of_sample_mean: Callable[[Any], Any],
) -> tuple[Any, dict[str, Any]]:
    """The TIS + SC policy loss of the module docstring."""
    import torch
    from miles.backends.training_utils.cp_utils import (
        get_local_response_loss_masks,
        slice_log_prob_with_cp,
    )
    from miles.backends.training_utils.loss_hub.logit_processors import get_responses
    from miles.backends.training_utils.parallel import get_parallel_state
    from miles.utils.misc import load_function

    from rescue.miles.loss import trained_advantages
    from rescue.miles.topk_store import TRAINER
    from rescue.miles.train_step import MOMENTS
    from rescue.score_centering import token_terms

    check_sc_flags(args)
    cap = cap_from_env()
    tp = get_parallel_state().tp
    total_lengths, response_lengths = batch["total_lengths"], batch["response_lengths"]
    advantages = trained_advantages(batch)
    masks = get_local_response_loss_masks(
        total_lengths, response_lengths, batch["loss_masks"], args.qkv_format,
        batch.get("max_seq_lens"),
    )  # fmt: skip
    MOMENTS.record(batch["advantages"], advantages, masks)
    sampled = batch.get("rollout_log_probs")
    if sampled is None:
        raise InputError(
            "score centering needs the samples' rollout_log_probs (log q of each token)"
        )
    chunk = getattr(args, "log_probs_chunk_size", -1)

    token_losses, stats = [], torch.zeros(5, dtype=torch.float64, device=logits.device)
    pieces = get_responses(
        logits, args=args, unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=total_lengths, response_lengths=response_lengths,
        max_seq_lens=batch.get("max_seq_lens"),
    )  # fmt: skip
    for i, (logits_i, tokens_i) in enumerate(pieces):
        mask = masks[i].to(device=logits.device).bool()
        if not bool(mask.any()):  # nothing trained here (a removed sample, another CP rank's)
            token_losses.append(mask.new_zeros(mask.shape, dtype=torch.float32))
            continue
        rows = TRAINER.rows(
            batch["unconcat_tokens"][i], sampled[i], total_lengths[i], response_lengths[i]
        )
        ids = slice_log_prob_with_cp(
            torch.from_numpy(rows["ids"]), total_lengths[i], response_lengths[i]
        )
        logq = slice_log_prob_with_cp(
            torch.from_numpy(rows["logprobs"]), total_lengths[i], response_lengths[i]
        )
        has = slice_log_prob_with_cp(
            torch.from_numpy(rows["has"]), total_lengths[i], response_lengths[i]
        )
        if bool((mask & ~has.to(mask.device)).any()):
            raise InputError(
                f"score centering: sample {i} of the micro-batch trains a position without its "
                "recorded head"
            )
        ids, logq = ids.to(logits.device), logq.to(logits.device)
        wanted = torch.cat([tokens_i.long()[:, None], ids], dim=-1)
        step = chunk if chunk and chunk > 0 else max(1, wanted.size(0))
        logp = torch.cat(
            [
                vocab_parallel_log_probs(logits_i[s : s + step], wanted[s : s + step], tp)
                for s in range(0, wanted.size(0), step)
            ]
        ) if wanted.size(0) else logits_i.new_zeros((0, wanted.size(1)))  # fmt: skip
        terms = token_terms(
            logp[:, 0], logp[:, 1:], sampled[i].to(logits.device).float(), logq, cap, ids >= 0
        )
        a = advantages[i].to(logits.device).float()
        a = torch.where(
            mask, torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0), torch.zeros_like(a)
        )
        token_losses.append(torch.where(mask, -a * terms.surrogate, torch.zeros_like(a)))
        with torch.no_grad():
            m = mask.double()
            stats += torch.stack(
                [
                    m.sum(),
                    (terms.head.mass_q.double() * m).sum(),
                    (terms.head.mass_p.double() * m).sum(),
                    (terms.truncated.double() * m).sum(),
                    (terms.correction_l1.double() * m).sum(),
                ]
            )
    SC_STATS.record(batch["advantages"], stats.cpu())
    pg = torch.cat(token_losses) if token_losses else logits.new_zeros((0,))
    if args.custom_pg_loss_reducer_function_path is not None:
        reducer = load_function(args.custom_pg_loss_reducer_function_path)(
            total_lengths, response_lengths, batch["loss_masks"], args.calculate_per_token_loss
        )
    else:
        reducer = sum_of_sample_mean
    pg_loss = reducer(pg)
    loss = pg_loss
    if not pg.requires_grad:  # no trained token in the micro-batch: still a graph to run
        loss = loss + 0 * logits.sum()
    return loss, {"loss": loss.clone().detach(), "pg_loss": pg_loss.clone().detach()}
