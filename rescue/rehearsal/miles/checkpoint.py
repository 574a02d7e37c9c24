"""The tiny Qwen3 between Hugging Face names and Megatron's, in both directions, on disk.

The rehearsal's trainer and its engine must hold one model: the engine (and q2's
calibration) serves a Hugging Face checkpoint, Miles' trainer loads a Megatron one
(``--ref-load``), and the q-chains' replay stages differentiate the checkpoint Miles
wrote at the last step. This module converts between the two:

- ``hf_to_megatron(state, config)`` / ``megatron_to_hf(state, config)``: the name and
  layout mapping of a Qwen3 built from Megatron's local layers (``--transformer-impl
  local``: ``input_layernorm``, ``pre_mlp_layernorm``; query, key and value interleaved by
  key-value group in ``linear_qkv``; gate and up stacked in ``linear_fc1``; the vocabulary
  rows of the embedding and output layer padded to a multiple of ``VOCAB_DIVISOR``, as
  Megatron pads them, and the padding removed on the way back, as Miles removes it). It is the
  inverse of Miles' own conversion for the weight update
  (``miles/backends/megatron_utils/megatron_to_hf/qwen2.py``), written here so the
  rehearsal can check Miles' conversion against it (the engine's digest after the first
  update equals the digest of the checkpoint the trainer started from);
- ``write_megatron(folder, state, config)``: a Megatron checkpoint in the legacy ``torch``
  format, as a ``release`` (``latest_checkpointed_iteration.txt``,
  ``release/mp_rank_00/model_optim_rng.pt``), which Megatron loads whatever
  ``--ckpt-format`` says (it detects the format on disk) and Miles loads as
  ``--ref-load`` (with ``--finetune``: no optimizer, no RNG);
- ``read_megatron(folder)``: the model tensors of the latest checkpoint under ``folder``,
  in Megatron's names, from the ``torch_dist`` format Miles saves (read with torch's own
  ``dcp_to_torch_save``, no process group) or the legacy one; a ``torch_dist`` checkpoint
  stacks the layers on a first axis, which is split here;
- ``write_hf(folder, state, template)``: a Hugging Face checkpoint of ``state`` with the
  tokenizer and config of the folder ``template``.

Only torch is imported (inside functions); nothing here imports Megatron or Miles.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: Megatron's per-layer names (local layers) -> the Hugging Face names of a Qwen3 layer;
#: ``linear_qkv`` and ``linear_fc1`` are handled apart (one tensor for several).
LAYER_NAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
#: The same layers under the names a ``torch_dist`` checkpoint gives them (Megatron's
#: ``sharded_state_dict_keys_map`` of the local spec, so TE and local checkpoints agree).
DIST_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
GLOBAL_NAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
#: Megatron's ``--make-vocab-size-divisible-by`` default (tensor parallel size 1): the
#: embedding and output layer have this multiple of rows, the rows past the tokenizer's
#: vocabulary zero.
VOCAB_DIVISOR = 128
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")


def _dims(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(hidden size, head dim, key-value groups, query heads per group)."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    groups = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    return hidden, head_dim, groups, heads // groups


def hf_to_megatron(state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Megatron's model state of a Hugging Face Qwen3 state (module docstring)."""
    import torch

    hidden, head_dim, groups, per_group = _dims(config)
    out: dict[str, Any] = {}
    for mg, hf in GLOBAL_NAMES.items():
        if hf in state and not (mg == "output_layer.weight" and config.get("tie_word_embeddings")):
            out[mg] = state[hf]
    for mg in _VOCAB:
        if mg in out:
            rows = out[mg].shape[0]
            pad = -rows % VOCAB_DIVISOR
            out[mg] = torch.cat([out[mg], out[mg].new_zeros(pad, out[mg].shape[1])])
    for layer in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{layer}."
        for mg, hf in LAYER_NAMES.items():
            out[f"decoder.layers.{layer}.{mg}"] = state[p + hf]
        q = state[p + "self_attn.q_proj.weight"].view(groups, per_group * head_dim, hidden)
        k = state[p + "self_attn.k_proj.weight"].view(groups, head_dim, hidden)
        v = state[p + "self_attn.v_proj.weight"].view(groups, head_dim, hidden)
        out[f"decoder.layers.{layer}.self_attention.linear_qkv.weight"] = torch.cat(
            [q, k, v], dim=1
        ).reshape(-1, hidden)
        out[f"decoder.layers.{layer}.mlp.linear_fc1.weight"] = torch.cat(
            [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]], dim=0
        )
    return out


def megatron_to_hf(state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face Qwen3 state of Megatron's model state (every name mapped, or an
    error naming the one that is not)."""
    import torch

    hidden, head_dim, groups, per_group = _dims(config)
    layer_names = {**LAYER_NAMES, **{k: LAYER_NAMES[v] for k, v in DIST_NAMES.items()}}
    out: dict[str, Any] = {}
    vocab = int(config["vocab_size"])
    for name, tensor in state.items():
        if name in GLOBAL_NAMES:
            out[GLOBAL_NAMES[name]] = tensor[:vocab] if name in _VOCAB else tensor
            continue
        m = _LAYER.fullmatch(name)
        if m is None:
            raise KeyError(f"{name}: not a parameter of a Megatron Qwen3")
        p, rest = f"model.layers.{m.group(1)}.", m.group(2)
        if rest in layer_names:
            out[p + layer_names[rest]] = tensor
        elif rest == "self_attention.linear_qkv.weight":
            qkv = tensor.view(groups, (per_group + 2) * head_dim, hidden)
            q, k, v = torch.split(qkv, [per_group * head_dim, head_dim, head_dim], dim=1)
            out[p + "self_attn.q_proj.weight"] = q.reshape(-1, hidden)
            out[p + "self_attn.k_proj.weight"] = k.reshape(-1, hidden)
            out[p + "self_attn.v_proj.weight"] = v.reshape(-1, hidden)
        elif rest == "mlp.linear_fc1.weight":
            gate, up = tensor.chunk(2, dim=0)
            out[p + "mlp.gate_proj.weight"] = gate
            out[p + "mlp.up_proj.weight"] = up
        else:
            raise KeyError(f"{name}: not a parameter of a Megatron Qwen3")
    return out


def write_megatron(folder: Path, state: dict[str, Any], config: dict[str, Any]) -> Path:
    """A release checkpoint of the Hugging Face ``state`` in Megatron's legacy format under
    ``folder`` (module docstring); returns ``folder``."""
    import torch

    folder = Path(folder)
    target = folder / "release" / "mp_rank_00" / "model_optim_rng.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    model = {k: v.detach().clone().contiguous() for k, v in hf_to_megatron(state, config).items()}
    torch.save({"model": model, "checkpoint_version": 3.0, "iteration": 0}, target)
    (folder / "latest_checkpointed_iteration.txt").write_text("release")
    return folder


def latest(folder: Path) -> Path:
    """The checkpoint folder ``latest_checkpointed_iteration.txt`` names under ``folder``."""
    folder = Path(folder)
    tracker = folder / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        raise FileNotFoundError(f"{folder}: no latest_checkpointed_iteration.txt (no checkpoint)")
    text = tracker.read_text().strip()
    return folder / ("release" if text == "release" else f"iter_{int(text):07d}")


def read_megatron(folder: Path) -> dict[str, Any]:
    """The model tensors (Megatron's names, layers apart) of the latest checkpoint under
    ``folder``: ``torch_dist`` (Miles' saves) or the legacy format."""
    import torch

    ckpt = latest(folder)
    legacy = ckpt / "mp_rank_00" / "model_optim_rng.pt"
    if legacy.is_file():
        return dict(torch.load(legacy, map_location="cpu", weights_only=False)["model"])
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(ckpt), f"{tmp}/state.pt")
        flat = torch.load(f"{tmp}/state.pt", map_location="cpu", weights_only=False)
    out: dict[str, Any] = {}
    for name, tensor in flat.items():
        if not hasattr(tensor, "shape") or "optimizer" in name or "_extra_state" in name:
            continue
        if name.startswith("decoder.layers."):  # stacked: one row per layer
            rest = name[len("decoder.layers.") :]
            for layer in range(tensor.shape[0]):
                out[f"decoder.layers.{layer}.{rest}"] = tensor[layer]
        else:
            out[name] = tensor
    return out


def write_hf(folder: Path, state: dict[str, Any], template: Path) -> Path:
    """A Hugging Face checkpoint in ``folder``: the tokenizer and config files of
    ``template`` and ``state`` as ``model.safetensors`` (float32; tied weights once)."""
    import torch
    from safetensors.torch import save_file

    folder, template = Path(folder), Path(template)
    folder.mkdir(parents=True, exist_ok=True)
    for f in template.iterdir():
        if (f.is_file() and f.suffix in (".json", ".jinja", ".txt")) or f.name == "tokenizer.model":
            shutil.copy2(f, folder / f.name)
    config = json.loads((template / "config.json").read_text())
    tensors = {
        k: v.detach().to(torch.float32).contiguous()
        for k, v in state.items()
        if not (k == "lm_head.weight" and config.get("tie_word_embeddings"))
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def check_and_export(
    out: Path, model_dir: Path, trainer_weights: list[dict[str, Any]]
) -> tuple[bool, str]:
    """The report's ``checkpoint`` check of the run folder ``out``: the checkpoint Miles
    wrote at the last step, in Hugging Face names, holds exactly the weights of the last
    weight update (the digest the trainer recorded as it sent them); written to
    ``out/checkpoint-hf`` (with ``model_dir``'s tokenizer and config) for the replay stages."""
    import torch

    from rescue.rehearsal.tiny.policy import digest

    found = sorted(Path(out).glob("runs/*/checkpoints"))
    if len(found) != 1:
        return False, f"expected one run's checkpoints under {out}/runs, found {len(found)}"
    if not trainer_weights:
        return False, "no weight update was recorded on the trainer's side"
    config = json.loads((Path(model_dir) / "config.json").read_text())
    state = megatron_to_hf(read_megatron(found[0]), config)
    last = max(trainer_weights, key=lambda r: int(r["version"]))
    got = digest({k: v.to(torch.bfloat16) for k, v in state.items()}.items())
    if got != last["digest"]:
        return False, (
            f"the checkpoint at {latest(found[0]).name} is not the weights of the last update "
            f"(version {last['version']})"
        )
    target = write_hf(Path(out) / "checkpoint-hf", state, Path(model_dir))
    return True, (
        f"{latest(found[0]).name}: the weights of the last update (version {last['version']}), "
        f"bit for bit; in Hugging Face format at {target}"
    )
