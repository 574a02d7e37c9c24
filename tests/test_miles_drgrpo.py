"""Dr. GRPO's constant-divisor pg-loss reducer against Miles' own reducer, on CPU tensors."""

from __future__ import annotations

import sys
import types

import pytest
from miles_env import require_miles

from rescue.miles.drgrpo import ENV_DIVISOR, REDUCER_PATH


@pytest.fixture
def miles(monkeypatch):
    require_miles()
    import torch

    monkeypatch.delenv(ENV_DIVISOR, raising=False)
    return torch


def batch(torch, lengths, prompt=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    masks = [(torch.rand(n, generator=g) > 0.3).int() for n in lengths]
    totals = [prompt + n for n in lengths]
    return totals, list(lengths), masks


def local_values(torch, totals, responses, full_values, cp_size, cp_rank):
    """The CP-local flat per-token tensor a loss hands the reducer (Miles' own slicing)."""
    from megatron_cpu import miles_parallel_state
    from miles.backends.training_utils.cp_utils import slice_log_prob_with_cp

    with miles_parallel_state(cp_rank=cp_rank, cp_size=cp_size):
        return torch.cat(
            [
                slice_log_prob_with_cp(v, t, r)
                for v, t, r in zip(full_values, totals, responses, strict=True)
            ]
        )


def reduce(torch, reducer_factory, totals, responses, masks, values, *, cp_size, denominators=None):
    """Sum over CP ranks of the rank-local reductions (what the CP all-reduce of gradients adds)."""
    from megatron_cpu import miles_parallel_state

    out = 0.0
    for cp in range(cp_size):
        x = local_values(torch, totals, responses, values, cp_size, cp)
        with miles_parallel_state(cp_rank=cp, cp_size=cp_size):
            if denominators is None:
                f = reducer_factory(totals, responses, masks, False)
            else:
                f = reducer_factory(
                    totals, responses, masks, False, "thd", None, denominators=denominators
                )
            out += float(f(x))
    return out


@pytest.mark.parametrize("cp_size", [1, 2])
def test_equals_miles_default_when_every_response_trains_d_tokens(miles, monkeypatch, cp_size):
    torch = miles
    from miles.backends.training_utils.cp_utils import get_sum_of_sample_mean

    from rescue.miles.drgrpo import pg_loss_reducer

    lengths = [9, 13, 6, 11]
    totals, responses, masks = batch(torch, lengths)
    masks = [torch.zeros(n, dtype=torch.int) for n in lengths]
    for m in masks:
        m[:5] = 1  # every response trains exactly D = 5 tokens
    monkeypatch.setenv(ENV_DIVISOR, "5")
    values = [torch.randn(n, generator=torch.Generator().manual_seed(n)) for n in lengths]
    ours = reduce(torch, pg_loss_reducer, totals, responses, masks, values, cp_size=cp_size)
    sums = torch.tensor([float(m.sum()) for m in masks])
    theirs = reduce(
        torch,
        get_sum_of_sample_mean,
        totals,
        responses,
        masks,
        values,
        cp_size=cp_size,
        denominators=sums,
    )
    assert ours == pytest.approx(theirs, rel=1e-6)
    full = sum(float((v * m).sum()) for v, m in zip(values, masks, strict=True)) / 5
    assert ours == pytest.approx(full, rel=1e-6)


@pytest.mark.parametrize("cp_size", [1, 2])
def test_divides_every_token_sum_by_the_constant(miles, monkeypatch, cp_size):
    torch = miles
    from rescue.miles.drgrpo import pg_loss_reducer

    lengths = [17, 4, 10]
    totals, responses, masks = batch(torch, lengths, seed=3)
    values = [torch.randn(n, generator=torch.Generator().manual_seed(7 + n)) for n in lengths]
    monkeypatch.setenv(ENV_DIVISOR, "8")
    ours = reduce(torch, pg_loss_reducer, totals, responses, masks, values, cp_size=cp_size)
    want = sum(float((v * m).sum()) for v, m in zip(values, masks, strict=True)) / 8
    assert ours == pytest.approx(want, rel=1e-6)


@pytest.fixture
def megatron_args(monkeypatch):
    """Megatron's ``megatron.training.global_vars`` as Miles' trainer has it: ``get_args``
    asserts the arguments were set (``'args is not initialized.'``), as Megatron-LM does."""
    module = types.ModuleType("megatron.training.global_vars")
    holder = {"args": None}

    def get_args():
        assert holder["args"] is not None, "args is not initialized."
        return holder["args"]

    module.get_args = get_args
    parent = types.ModuleType("megatron.training")
    parent.global_vars = module
    monkeypatch.setitem(sys.modules, "megatron.training", parent)
    monkeypatch.setitem(sys.modules, "megatron.training.global_vars", module)
    return holder


def test_default_divisor_is_rollout_max_response_len(miles, megatron_args):
    torch = miles
    from types import SimpleNamespace

    from megatron_cpu import miles_parallel_state

    from rescue.miles.drgrpo import pg_loss_reducer

    megatron_args["args"] = SimpleNamespace(rollout_max_response_len=4, qkv_format="thd")
    masks = [torch.ones(4, dtype=torch.int), torch.ones(2, dtype=torch.int)]
    with miles_parallel_state():
        f = pg_loss_reducer([6, 4], [4, 2], masks, False)
    assert float(f(torch.ones(6))) == pytest.approx(6 / 4)


def test_missing_divisor_is_an_error_naming_both_sources(miles, megatron_args):
    torch = miles
    from megatron_cpu import miles_parallel_state

    from rescue.miles.drgrpo import pg_loss_reducer

    with (
        miles_parallel_state(),
        pytest.raises(ValueError, match=f"set {ENV_DIVISOR}.*--rollout-max-response-len"),
    ):
        pg_loss_reducer([4], [2], [torch.ones(2)], False)


@pytest.mark.parametrize("bad", ["0", "-3", "x", "nan"])
def test_bad_divisor_setting_is_an_error(miles, monkeypatch, bad):
    torch = miles
    from megatron_cpu import miles_parallel_state

    from rescue.miles.drgrpo import pg_loss_reducer

    monkeypatch.setenv(ENV_DIVISOR, bad)
    with miles_parallel_state(), pytest.raises(ValueError, match=f"{ENV_DIVISOR}=.*a number > 0"):
        pg_loss_reducer([4], [2], [torch.ones(2)], False)


def test_per_token_loss_is_refused(miles, monkeypatch):
    torch = miles
    from megatron_cpu import miles_parallel_state

    from rescue.miles.drgrpo import pg_loss_reducer

    monkeypatch.setenv(ENV_DIVISOR, "4")
    with miles_parallel_state(), pytest.raises(ValueError, match="--calculate-per-token-loss"):
        pg_loss_reducer([4], [2], [torch.ones(2)], True)


def test_bshd_under_cp_is_refused(miles, megatron_args):
    torch = miles
    from types import SimpleNamespace

    from megatron_cpu import miles_parallel_state

    from rescue.miles.drgrpo import pg_loss_reducer

    megatron_args["args"] = SimpleNamespace(rollout_max_response_len=4, qkv_format="bshd")
    with miles_parallel_state(cp_size=2), pytest.raises(ValueError, match="--qkv-format thd"):
        pg_loss_reducer([4], [2], [torch.ones(2)], False)


def test_the_dotted_path_loads_with_miles_load_function(miles):
    from miles.utils.misc import load_function

    from rescue.miles.drgrpo import pg_loss_reducer

    assert load_function(REDUCER_PATH) is pg_loss_reducer
    with pytest.raises((AttributeError, ModuleNotFoundError)):
        load_function(REDUCER_PATH.replace(".pg_loss_reducer", ":pg_loss_reducer"))
