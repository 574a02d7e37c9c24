"""The tiny Qwen3 between Hugging Face and Megatron names, on disk in both formats, and the
report's ``checkpoint`` check (no Megatron or Miles needed: the layouts are known answers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from rescue.rehearsal.miles.checkpoint import (  # noqa: E402
    VOCAB_DIVISOR,
    check_and_export,
    hf_to_megatron,
    latest,
    megatron_to_hf,
    read_megatron,
    write_hf,
    write_megatron,
)
from rescue.rehearsal.tiny.policy import digest  # noqa: E402

CONFIG = {
    "hidden_size": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2,
    "intermediate_size": 6, "num_hidden_layers": 2, "vocab_size": 130, "tie_word_embeddings": False,
}  # fmt: skip


def hf_state(config: dict, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    h, d, kv = config["hidden_size"], config["head_dim"], config["num_key_value_heads"]
    heads, ffn, vocab = (
        config["num_attention_heads"],
        config["intermediate_size"],
        config["vocab_size"],
    )

    def r(*shape):
        return torch.randn(*shape, generator=g)

    state = {"model.embed_tokens.weight": r(vocab, h), "model.norm.weight": r(h)}
    if not config["tie_word_embeddings"]:
        state["lm_head.weight"] = r(vocab, h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": r(h), p + "post_attention_layernorm.weight": r(h),
            p + "self_attn.q_proj.weight": r(heads * d, h), p + "self_attn.k_proj.weight": r(kv * d, h),
            p + "self_attn.v_proj.weight": r(kv * d, h), p + "self_attn.o_proj.weight": r(h, heads * d),
            p + "self_attn.q_norm.weight": r(d), p + "self_attn.k_norm.weight": r(d),
            p + "mlp.gate_proj.weight": r(ffn, h), p + "mlp.up_proj.weight": r(ffn, h),
            p + "mlp.down_proj.weight": r(h, ffn),
        })  # fmt: skip
    return state


@pytest.mark.parametrize("tied", [False, True])
def test_hugging_face_to_megatron_and_back_is_the_identity(tied):
    config = {**CONFIG, "tie_word_embeddings": tied}
    state = hf_state(config)
    mg = hf_to_megatron(state, config)
    assert ("output_layer.weight" in mg) is not tied
    assert mg["embedding.word_embeddings.weight"].shape[0] % VOCAB_DIVISOR == 0
    back = megatron_to_hf(mg, config)
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_the_query_key_value_rows_are_grouped_as_megatron_lays_them_out():
    """Known answer: heads 0, 1 (group 0) and 2, 3 (group 1); every row of head h holds h,
    of key group g 10 + g, of value group g 20 + g; Megatron's rows go group by group,
    [its queries, its key, its value]."""
    config = CONFIG
    state = hf_state(config)
    d, h = config["head_dim"], config["hidden_size"]
    p = "model.layers.0.self_attn."
    state[p + "q_proj.weight"] = torch.arange(4).repeat_interleave(d)[:, None].float().expand(-1, h)
    state[p + "k_proj.weight"] = (
        (10 + torch.arange(2)).repeat_interleave(d)[:, None].float().expand(-1, h)
    )
    state[p + "v_proj.weight"] = (
        (20 + torch.arange(2)).repeat_interleave(d)[:, None].float().expand(-1, h)
    )
    qkv = hf_to_megatron(state, config)["decoder.layers.0.self_attention.linear_qkv.weight"]
    rows = qkv[:, 0].view(-1, d)[:, 0].tolist()
    assert rows == [0, 1, 10, 20, 2, 3, 11, 21]


def test_the_vocabulary_padding_is_zero_and_removed_on_the_way_back():
    mg = hf_to_megatron(hf_state(CONFIG), CONFIG)
    embed = mg["embedding.word_embeddings.weight"]
    assert embed.shape[0] == 256 and not embed[CONFIG["vocab_size"] :].any()
    assert megatron_to_hf(mg, CONFIG)["model.embed_tokens.weight"].shape[0] == 130


def test_an_unknown_megatron_name_is_an_error_naming_it():
    with pytest.raises(KeyError, match=r"decoder\.layers\.0\.mlp\.router\.weight"):
        megatron_to_hf({"decoder.layers.0.mlp.router.weight": torch.zeros(1)}, CONFIG)


def test_a_legacy_release_checkpoint_round_trips_and_names_its_folder(tmp_path):
    state = hf_state(CONFIG)
    write_megatron(tmp_path / "ref", state, CONFIG)
    assert (tmp_path / "ref" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert latest(tmp_path / "ref") == tmp_path / "ref" / "release"
    back = megatron_to_hf(read_megatron(tmp_path / "ref"), CONFIG)
    assert all(torch.equal(back[k], state[k]) for k in state)
    with pytest.raises(FileNotFoundError, match=r"no latest_checkpointed_iteration\.txt"):
        latest(tmp_path)


def test_a_torch_dist_checkpoint_has_its_stacked_layers_split(tmp_path):
    """Megatron's torch_dist stacks the layers on a first axis (and names the layer norms as
    Transformer Engine does): read back layer by layer."""
    from torch.distributed.checkpoint import save

    mg = hf_to_megatron(hf_state(CONFIG), CONFIG)
    stacked = {}
    for name in {k.split(".", 3)[3] for k in mg if k.startswith("decoder.layers.")}:
        dist = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
                "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}.get(name, name)  # fmt: skip
        stacked[f"decoder.layers.{dist}"] = torch.stack(
            [mg[f"decoder.layers.{i}.{name}"] for i in range(2)]
        )
    flat = {**{k: v for k, v in mg.items() if not k.startswith("decoder.layers.")}, **stacked}
    save(flat, checkpoint_id=str(tmp_path / "ck" / "iter_0000003"), no_dist=True)
    (tmp_path / "ck" / "latest_checkpointed_iteration.txt").write_text("3")
    back = megatron_to_hf(read_megatron(tmp_path / "ck"), CONFIG)
    want = megatron_to_hf(mg, CONFIG)
    assert set(back) == set(want) and all(torch.equal(back[k], want[k]) for k in want)


def _run_folder(tmp_path: Path, state: dict) -> Path:
    out = tmp_path / "run"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    (model / "tokenizer.json").write_text("{}")
    write_megatron(out / "runs" / "rlvr-zero-seed1" / "checkpoints", state, CONFIG)
    return out


def test_the_checkpoint_check_compares_with_the_last_update_and_writes_hugging_face(tmp_path):
    state = {k: v.to(torch.bfloat16) for k, v in hf_state(CONFIG).items()}
    out = _run_folder(tmp_path, state)
    sent = [{"version": "1", "digest": "x"}, {"version": "2", "digest": digest(state.items())}]
    ok, detail = check_and_export(out, tmp_path / "model", sent)
    assert ok, detail
    assert "version 2" in detail and (out / "checkpoint-hf" / "model.safetensors").is_file()
    assert (out / "checkpoint-hf" / "tokenizer.json").is_file()
    from safetensors.torch import load_file

    written = load_file(str(out / "checkpoint-hf" / "model.safetensors"))
    assert all(torch.equal(written[k].to(torch.bfloat16), state[k]) for k in state)


def test_the_checkpoint_check_fails_when_the_checkpoint_is_not_the_last_update(tmp_path):
    state = {k: v.to(torch.bfloat16) for k, v in hf_state(CONFIG).items()}
    out = _run_folder(tmp_path, state)
    other = {k: v + 1 for k, v in state.items()}
    ok, detail = check_and_export(
        out, tmp_path / "model", [{"version": "4", "digest": digest(other.items())}]
    )
    assert not ok and "not the weights of the last update (version 4)" in detail
    assert not (out / "checkpoint-hf").exists()


def test_write_hf_keeps_tied_weights_once(tmp_path):
    config = {**CONFIG, "tie_word_embeddings": True}
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(config))
    state = hf_state(config)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    from safetensors.torch import load_file

    write_hf(tmp_path / "o", state, tmp_path / "t")
    assert "lm_head.weight" not in load_file(str(tmp_path / "o" / "model.safetensors"))
