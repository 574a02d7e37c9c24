"""The arms' gradients on a tiny randomly initialized LM: the two-outcome check first."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rescue.replay.gradients as gradients  # noqa: E402
from rescue.cli import main  # noqa: E402
from rescue.replay.arms import build_batch, scalar_arms  # noqa: E402
from rescue.replay.dumps import parse_payload  # noqa: E402
from rescue.replay.gradients import (  # noqa: E402
    IdentityCheckFailed,
    arm_gradients,
    token_factors,
    two_outcome_check,
)
from rescue.replay.model import Scorer, build_model  # noqa: E402
from rescue.replay.synthetic import synthetic_step  # noqa: E402

VOCAB = 40


@pytest.fixture(scope="module")
def dump():
    payload = synthetic_step(groups=3, G=4, cap=4, turn_tokens=2, obs_tokens=1, vocab=VOCAB, seed=5)
    d = parse_payload(payload, need_tokens=True)
    capped = [t.capped for t in d.trajectories]
    assert any(capped) and not all(capped)
    return d


@pytest.fixture(scope="module")
def model():
    return build_model("tiny-gpt2", vocab_size=VOCAB, seed=0, dtype="float64")


@pytest.mark.parametrize(
    "spec, std_normalize, reduction",
    [
        ("tiny-gpt2", True, "sum"),
        ("tiny-gpt2", False, "sample-mean"),
        ("tiny-llama", True, "sample-mean"),
    ],
)
def test_two_outcome_identity_holds_per_prompt(dump, spec, std_normalize, reduction):
    model = build_model(spec, vocab_size=VOCAB, seed=0, dtype="float64")
    batch = build_batch(dump.trajectories)
    out = two_outcome_check(
        Scorer(model), batch, [dump], std_normalize=std_normalize, reduction=reduction
    )
    assert out["prompts"] == 3
    assert out["max_residual"] <= out["rtol"] == 1e-6
    # (b) = (1-J)(a) only in expectation: on finite samples the zero-mean term is visible
    assert out["gap_b_vs_(1-J)a_mean"] > 1e-6


def test_check_fails_loudly_when_an_arm_is_wrong(dump, model, monkeypatch):
    def survivors_use_all_members(batch, **kw):
        arms = scalar_arms(batch, **kw)
        arms["c"] = arms["b"]  # a survivor arm that kept the all-G baseline
        return arms

    monkeypatch.setattr(gradients, "scalar_arms", survivors_use_all_members)
    with pytest.raises(IdentityCheckFailed, match=r"arm \(c\) residual"):
        two_outcome_check(Scorer(model), build_batch(dump.trajectories), [dump])


def test_arm_gradient_equals_one_backward_of_the_whole_batch_loss(dump, model):
    """(a) and (e) totals against an independent computation: one loss, one backward."""
    result = arm_gradients([dump], model, turn_edges=(1, 3), check=False)
    total = {k: v for k, v in result["buckets"][0]["arms"].items()}
    batch = build_batch(dump.trajectories)
    a = scalar_arms(batch, rhos=())["a"]
    from rescue.replay.arms import turn_reached_token_advantages

    e = turn_reached_token_advantages(batch)
    f = token_factors(batch, "sum")
    scorer = Scorer(model)
    bounds = np.concatenate(([0], np.cumsum(batch.counts)))
    loss_a = loss_e = 0.0
    for i, t in enumerate(batch.trajectories):
        (turns,) = t.token_turns
        logp = scorer.logprobs(dump.samples[t.samples[0]], "x")
        w = torch.as_tensor(f[i] * (turns > 0), dtype=logp.dtype)
        loss_a = loss_a + (w * a[i] * logp).sum()
        loss_e = (
            loss_e
            + (torch.as_tensor(f[i] * e[bounds[i] : bounds[i + 1]], dtype=logp.dtype) * logp).sum()
        )
    ga = torch.cat(
        [g.reshape(-1) for g in torch.autograd.grad(loss_a, scorer.params, retain_graph=True)]
    )
    ge = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_e, scorer.params)])
    assert total["a"]["norm"] == pytest.approx(float(ga.norm()), rel=1e-9)
    assert total["e"]["norm"] == pytest.approx(float(ge.norm()), rel=1e-6)
    assert total["e"]["cos_a"] == pytest.approx(float(ga.dot(ge) / ga.norm() / ge.norm()), rel=1e-6)


def test_buckets_by_turn_and_difficulty_and_masking_all_capped_is_arm_b(dump, model):
    result = arm_gradients([dump], model, turn_edges=(1, 2, 3), check=True)
    assert result["check"]["max_residual"] < 1e-9  # GPT-2 computes all in float64
    buckets = {b["bucket"]: b for b in result["buckets"]}
    assert {"all", "turns 1", "turns 2", "turns 3+"} <= set(buckets)
    allb = buckets["all"]["arms"]
    assert allb["d1"]["norm"] == pytest.approx(allb["b"]["norm"], rel=1e-12)
    assert allb["d1"]["cos_a"] == pytest.approx(allb["b"]["cos_a"], rel=1e-12)
    assert allb["a"]["cos_a"] == pytest.approx(1.0)
    assert np.isfinite(buckets["all"]["b_minus_a"]["beta"])
    assert any(label.startswith("prompts ") for label in buckets)


def test_turn_edges_must_start_at_one(dump, model):
    with pytest.raises(ValueError, match="--turn-edges"):
        arm_gradients([dump], model, turn_edges=(2, 4))


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="--model='nowhere'"):
        build_model("nowhere", vocab_size=10)


def test_cli_gradients_on_a_dump_file(tmp_path, capsys):
    payload = synthetic_step(groups=2, G=3, cap=3, turn_tokens=2, vocab=VOCAB, seed=7)
    torch.save(payload, tmp_path / "rollout_0.pt")
    path = str(tmp_path / "rollout_0.pt")
    assert (
        main(
            [
                "replay",
                "gradients",
                path,
                "--model",
                "tiny-gpt2",
                "--dtype",
                "float64",
                "--check-only",
            ]
        )
        == 0
    )
    assert "check passed" in capsys.readouterr().out
    assert main(["replay", "gradients", path, "--model", "tiny-gpt2", "--turn-edges", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "two-outcome check passed" in out and "[turns 2+]" in out and "cos to grad P(cap)" in out
