"""The gradient oracle's build and compare steps, on dumps tagged by rescue's gate and on
gradients from the Hugging Face replay path (`rescue replay gradients --trained`)."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
from recorded_dumps import SEED, recorded_step

from rescue.cli import main
from rescue.gate import coin
from rescue.oracle.build import build
from rescue.oracle.compare import compare, metrics
from rescue.oracle.manifest import Manifest
from rescue.samples import WEIGHT_KEY

torch = pytest.importorskip("torch")

VOCAB = 40
STALE = ({1, 2}, {10, 11})  # stale groups of step 3 (groups 0-2) and step 4 (groups 10-12)


@pytest.fixture
def dumps(tmp_path):
    d = tmp_path / "dumps" / "rollout_data"
    d.mkdir(parents=True)
    for k, (rid, stale) in enumerate(zip((3, 4), STALE, strict=True)):
        payload = recorded_step(
            rid, stale=stale, seed=k, groups=3, G=4, cap=4, turn_tokens=2, obs_tokens=1,
            vocab=VOCAB, first_group=10 * k,
        )  # fmt: skip
        torch.save(payload, d / f"{rid}.pt")
    return tmp_path / "dumps"


def load(path):
    return torch.load(path, weights_only=False)


def test_build_writes_every_arm_of_every_step_with_the_gate_selection(dumps, tmp_path):
    out = str(tmp_path / "oracle")
    manifest = build([str(dumps)], out, a_values=(0.5, 0.25), progress=False)
    assert manifest.arms == ["all", "drop", "stale", "protect-a0.5", "protect-a0.25"]
    assert [(e.rollout_id, e.step, e.arm) for e in manifest][:6] == [
        (0, 3, "all"), (1, 3, "drop"), (2, 3, "stale"), (3, 3, "protect-a0.5"),
        (4, 3, "protect-a0.25"), (5, 4, "all"),
    ]  # fmt: skip
    assert Manifest.read(out).entries == manifest.entries
    for e in manifest:
        payload = load(os.path.join(out, "rollout_data", f"{e.rollout_id}.pt"))
        assert payload["rollout_id"] == e.rollout_id
        source = load(e.source)["samples"]
        stale = STALE[e.step - 3]
        assert e.stale_groups == len(stale) and e.groups == 3 and e.rollouts == 12
        trained = set()
        for s, orig in zip(payload["samples"], source, strict=True):
            g = s["group_index"]
            u = coin(SEED, g)
            if e.arm == "all":
                keep, w = True, None
            elif e.arm == "drop":
                keep, w = g not in stale, None
            elif e.arm == "stale":
                keep, w = g in stale, None
            else:
                a = float(e.arm.removeprefix("protect-a"))
                keep = g not in stale or u < a
                w = 1 / a if g in stale and u < a else None
            assert s["remove_sample"] == (not keep or orig["remove_sample"])
            assert s["metadata"].get(WEIGHT_KEY) == w
            assert s["tokens"] == orig["tokens"] and s["reward"] == orig["reward"]
            if keep:
                trained.add(g)
        assert e.trained_groups == len(trained)
    # the coins were drawn: at a = 0.5 some stale group is kept and some dropped
    assert any(coin(SEED, g) < 0.5 for g in (1, 2, 10, 11)) and any(
        coin(SEED, g) >= 0.5 for g in (1, 2, 10, 11)
    )


def test_build_refuses_untagged_weighted_or_inconsistent_dumps(dumps, tmp_path):
    path = str(dumps / "rollout_data" / "3.pt")
    payload = load(path)
    untagged = {**payload, "samples": [{**s, "metadata": {}} for s in payload["samples"]]}
    torch.save(untagged, tmp_path / "u.pt")
    with pytest.raises(ValueError, match=r"rescue_would_drop.*ARM=never-drop STALENESS=K"):
        build([str(tmp_path / "u.pt")], str(tmp_path / "o1"), progress=False)
    weighted = load(path)
    weighted["samples"][0]["metadata"][WEIGHT_KEY] = 2.0
    torch.save(weighted, tmp_path / "w.pt")
    with pytest.raises(ValueError, match="rescue_weight=2: a protect run"):
        build([str(tmp_path / "w.pt")], str(tmp_path / "o2"), progress=False)
    mixed = load(path)
    mixed["samples"][1]["metadata"]["rescue_would_drop"] = not mixed["samples"][0]["metadata"][
        "rescue_would_drop"
    ]
    torch.save(mixed, tmp_path / "m.pt")
    with pytest.raises(ValueError, match="different rescue_would_drop"):
        build([str(tmp_path / "m.pt")], str(tmp_path / "o3"), progress=False)
    build([path], str(tmp_path / "o4"), progress=False)
    with pytest.raises(ValueError, match="--force"):
        build([path], str(tmp_path / "o4"), progress=False)
    build([path], str(tmp_path / "o4"), progress=False, force=True)
    with pytest.raises(ValueError, match="must start with all"):
        build([path], str(tmp_path / "o5"), arms=("drop", "all"), progress=False)


def test_compare_on_hf_gradients_all_minus_drop_is_the_stale_gradient(dumps, tmp_path, capsys):
    out = str(tmp_path / "oracle")
    assert main(["oracle", "build", str(dumps), "--out", out, "--no-progress"]) == 0
    assert "--num-rollout 8" in capsys.readouterr().out  # 2 steps x 4 arms
    replay = sorted(glob.glob(os.path.join(out, "rollout_data", "*.pt")))
    args = ["replay", "gradients", *replay, "--model", "tiny-gpt2", "--dtype", "float64"]
    assert main([*args, "--trained", os.path.join(out, "gradients")]) == 0
    capsys.readouterr()
    manifest = Manifest.read(out)
    for step in manifest.steps():
        g = {
            e.arm: torch.load(os.path.join(out, "gradients", str(e.rollout_id), "model.pt"))
            for e in manifest.of_step(step)
        }
        for name in g["all"]:
            torch.testing.assert_close(
                g["all"][name] - g["drop"][name], g["stale"][name], rtol=0, atol=1e-12
            )
        assert any(v.abs().max() > 1e-6 for v in g["stale"].values())  # not trivially zero

    assert main(["oracle", "compare", out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    with open(os.path.join(out, "compare.json")) as f:
        assert json.load(f)["steps"] == report["steps"]
    for row in (*report["steps"], report["total"]):
        assert row["drop"]["explained"] == pytest.approx(1.0, abs=1e-9)
        assert row["drop"]["cos_stale"] == pytest.approx(1.0, abs=1e-9)
        assert row["arms"]["drop"]["norm_ratio"] > 0 and row["arms"]["drop"]["cos_all"] < 1
    s3 = report["steps"][0]  # groups 1 and 2 stale: 4 of 12 rollouts trained under drop
    assert s3["stale_groups"] == 2 and s3["arms"]["drop"]["norm_ratio_refilled"] == pytest.approx(
        s3["arms"]["drop"]["norm_ratio"] * 12 / 4
    )
    with open(os.path.join(out, "compare.md")) as f:
        table = f.read()
    assert "| 3 | 2 / 3 |" in table and "**total**" in table
    assert "explained by the dropped groups" in table


def test_compare_reads_streamed_statistics(dumps, tmp_path):
    """Statistics written as the streamed capture writes them give the same report."""
    out = str(tmp_path / "oracle")
    manifest = build([str(dumps)], out, arms=("all", "drop", "stale"), progress=False)
    rng = np.random.default_rng(0)
    vectors = {e.rollout_id: rng.normal(size=7) for e in manifest}
    for e in manifest:
        gdir = os.path.join(out, "gradients", str(e.rollout_id))
        os.makedirs(gdir)
        torch.save({"w": torch.as_tensor(vectors[e.rollout_id])}, os.path.join(gdir, "tp0-pp0.pt"))
    from_files = compare(out)
    os.makedirs(os.path.join(out, "stats"))
    for e in manifest:
        earlier = [x for x in manifest.of_step(e.step) if x.rollout_id < e.rollout_id]
        v = vectors[e.rollout_id]
        data = {
            "rollout_id": e.rollout_id,
            "sq_norm": float(v @ v),
            "dots": {str(x.rollout_id): float(v @ vectors[x.rollout_id]) for x in earlier},
        }
        with open(os.path.join(out, "stats", f"{e.rollout_id}.json"), "w") as f:
            json.dump(data, f)
    from_stats = compare(out)
    assert from_stats["source"] == "stats"
    for a, b in zip(from_files["steps"], from_stats["steps"], strict=True):
        assert a["arms"]["drop"]["cos_all"] == pytest.approx(b["arms"]["drop"]["cos_all"])
    os.remove(os.path.join(out, "stats", "1.json"))
    with pytest.raises(ValueError, match="replay rollout 1"):
        compare(out)
    with pytest.raises(ValueError, match="no gradient of replay rollout 0"):
        compare(out, str(tmp_path / "nowhere"))


def test_metrics_of_a_known_gram_matrix():
    g_all = np.array([3.0, 4.0, 0.0])
    g_drop = np.array([3.0, 0.0, 0.0])
    g_stale = np.array([0.0, 4.0, 0.0])
    M = np.stack([g_all, g_drop, g_stale])
    m = metrics(M @ M.T, ["all", "drop", "stale"], [1.0, 2.0, 4.0])
    assert m["norm_all"] == 5.0
    assert m["arms"]["drop"]["cos_all"] == pytest.approx(0.6)
    assert m["arms"]["drop"]["norm_ratio"] == pytest.approx(0.6)
    assert m["arms"]["drop"]["norm_ratio_refilled"] == pytest.approx(1.2)
    assert m["drop"]["difference_ratio"] == pytest.approx(0.8)
    assert m["drop"]["explained"] == pytest.approx(1.0) and m["drop"]["cos_stale"] == 1.0
    off = np.stack([g_all, g_drop, np.array([0.0, 2.0, 2.0])])
    m = metrics(off @ off.T, ["all", "drop", "stale"])
    assert m["drop"]["explained"] == pytest.approx(1 - (4 + 4) / 16)


def test_trained_gradient_is_one_backward_of_the_miles_loss(dumps):
    """Independent: group mean / std by hand, per-rollout token mean over all N rollouts."""
    from rescue.replay.dumps import parse_payload
    from rescue.replay.model import Scorer, build_model
    from rescue.replay.trained import trained_gradient

    payload = load(str(dumps / "rollout_data" / "3.pt"))
    for s in payload["samples"]:
        if s["group_index"] == 1:
            s["remove_sample"] = True
        if s["group_index"] == 2:
            s["metadata"][WEIGHT_KEY] = 2.0
    d = parse_payload(payload, need_tokens=True)
    model = build_model("tiny-gpt2", vocab_size=VOCAB, seed=0, dtype="float64")
    got = trained_gradient(d, model, reduction="sample-mean")
    scorer = Scorer(model)
    loss = 0.0
    N = len(payload["samples"])
    for s in payload["samples"]:
        if s["remove_sample"]:
            continue
        members = [x["reward"] for x in payload["samples"] if x["group_index"] == s["group_index"]]
        sd = np.std(members, ddof=1)
        A = s["reward"] - np.mean(members)
        A = A / (sd + 1e-6) if sd > 0 else A
        A *= s["metadata"].get(WEIGHT_KEY, 1.0)
        m = torch.as_tensor(s["loss_mask"], dtype=torch.float64)
        loss = loss + A / (N * m.sum()) * (m * scorer.logprobs(s, "x")).sum()
    grads = torch.autograd.grad(loss, scorer.params)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, g in zip(names, grads, strict=True):
        torch.testing.assert_close(got[name], g, rtol=1e-10, atol=1e-12)


def test_build_cli_flags(dumps, tmp_path, capsys):
    import fractions

    # default --out: DUMP_DIR/oracle; a progress bar unless --no-progress
    assert main(["oracle", "build", str(dumps)]) == 0
    assert "dumps" in capsys.readouterr().err
    assert Manifest.read(str(dumps / "oracle")).arms == ["all", "drop", "stale", "protect-a0.5"]
    assert main(["oracle", "build", str(dumps), "--no-progress"]) == 2  # exists: --force
    assert "--force" in capsys.readouterr().err
    args = ["oracle", "build", str(dumps), "--no-progress", "--force"]
    assert main([*args, "--arms", "all,protect", "--a", "0.25,1"]) == 0
    assert capsys.readouterr().err == ""
    assert Manifest.read(str(dumps / "oracle")).arms == ["all", "protect-a0.25", "protect-a1"]
    assert main([*args, "--a", "0"]) == 2  # refused in one line naming the flag
    assert "argument --a: --a '0': every a must be in (0, 1]" in capsys.readouterr().err
    # --unsafe-load: a dump holding an object outside the allow-list
    odd = load(str(dumps / "rollout_data" / "3.pt"))
    odd["metadata"] = {"ratio": fractions.Fraction(1, 3)}
    torch.save(odd, tmp_path / "odd.pt")
    out = str(tmp_path / "odd")
    assert main(["oracle", "build", str(tmp_path / "odd.pt"), "--out", out, "--no-progress"]) == 2
    assert "refusing to unpickle fractions.Fraction" in capsys.readouterr().err
    assert main(["oracle", "build", str(tmp_path / "odd.pt"), "--out", out, "--unsafe-load"]) == 0


def test_compare_cli_reads_gradients_from_elsewhere(dumps, tmp_path, capsys):
    out = str(tmp_path / "oracle")
    manifest = build([str(dumps)], out, arms=("all", "drop"), progress=False)
    elsewhere = tmp_path / "grads"
    for e in manifest:
        (elsewhere / str(e.rollout_id)).mkdir(parents=True)
        v = torch.tensor([1.0, float(e.rollout_id % 2)])
        torch.save({"w": v}, elsewhere / str(e.rollout_id) / "model.pt")
    assert main(["oracle", "compare", out]) == 2  # nothing in ORACLE_DIR/gradients
    assert "no gradient of replay rollout 0" in capsys.readouterr().err
    assert main(["oracle", "compare", out, "--gradients", str(elsewhere)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| step | stale / groups | cos(drop, all) |")
    assert "| 3 | 2 / 3 | 0.7071 | 1.4142 | 1.0000 |" in table


def test_replay_gradients_trained_honours_reduction_and_normalization(dumps, tmp_path):
    from rescue.replay.dumps import load_dumps
    from rescue.replay.model import build_model
    from rescue.replay.trained import trained_gradient

    flags = ["--reduction", "sample-mean", "--no-std-normalize"]
    kwargs = {"reduction": "sample-mean", "std_normalize": False}
    path = str(dumps / "rollout_data" / "3.pt")
    args = ["replay", "gradients", path, "--model", "tiny-gpt2", "--dtype", "float64"]
    assert main([*args, *flags, "--trained", str(tmp_path / "g")]) == 0
    saved = torch.load(tmp_path / "g" / "3" / "model.pt")
    (d,) = load_dumps([path], need_tokens=True)
    model = build_model("tiny-gpt2", vocab_size=VOCAB, seed=0, dtype="float64")
    want = trained_gradient(d, model, **kwargs)
    other = trained_gradient(d, model)  # the defaults: sum, std-normalized
    for name, g in want.items():
        torch.testing.assert_close(saved[name], g, rtol=1e-12, atol=0)
    assert any(not torch.allclose(want[n], other[n]) for n in want)
