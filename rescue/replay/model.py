"""The causal LM whose gradients replay compares, and its per-sample score vectors.

``build_model`` loads a local model, builds one from a config, or builds a tiny random
one for tests; ``Scorer`` gives each response token's log-probability and the flattened
gradient of a weighted sum of them. torch and transformers are imported inside the
functions (the ``[replay]`` extra).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rescue.errors import InputError

DTYPES = ("float32", "float64")
#: Built-in randomly initialized models for tests: (transformers config class, kwargs).
TINY_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-gpt2": ("GPT2Config", {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 4096}),
    "tiny-llama": (
        "LlamaConfig",
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "max_position_embeddings": 4096,
        },
    ),
}


def build_model(
    spec: str, *, vocab_size: int, seed: int = 0, dtype: str = "float32", device: str = "cpu"
):
    """A causal LM in eval mode (no dropout) from a local path, a config, or a built-in name.

    ``spec``: a directory with weights (``from_pretrained``, local files only); a config
    JSON file or a directory with only ``config.json`` (randomly initialized with ``seed``);
    or ``tiny-gpt2`` / ``tiny-llama`` (2 layers, width 32, vocabulary ``vocab_size``).
    """
    import torch
    import transformers

    if dtype not in DTYPES:
        raise InputError(f"--dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(seed)
    weights = (
        "model.safetensors",
        "pytorch_model.bin",
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    )
    if spec in TINY_MODELS:
        cls_name, kwargs = TINY_MODELS[spec]
        config = getattr(transformers, cls_name)(vocab_size=vocab_size, **kwargs)
        model = transformers.AutoModelForCausalLM.from_config(config)
    elif os.path.isdir(spec) and any(os.path.exists(os.path.join(spec, w)) for w in weights):
        model = transformers.AutoModelForCausalLM.from_pretrained(spec, local_files_only=True)
    elif os.path.isfile(spec) or os.path.isfile(os.path.join(spec, "config.json")):
        config = transformers.AutoConfig.from_pretrained(spec, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        raise InputError(
            f"--model={spec!r}: not a local model directory, a config file or one of {', '.join(TINY_MODELS)}"
        )
    if model.config.vocab_size < vocab_size:
        raise InputError(
            f"--model={spec!r} has vocab_size {model.config.vocab_size}; the dumps use token ids up to {vocab_size - 1}"
        )
    return model.to(device=device, dtype=torch_dtype).eval()


class Scorer:
    """Per-sample log-probabilities and flattened weighted score vectors of one model."""

    def __init__(self, model, device: str = "cpu") -> None:
        self.model, self.device = model, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.size = sum(p.numel() for p in self.params)
        self.dtype = self.params[0].dtype
        self.param_device = self.params[0].device

    def logprobs(self, sample: dict, where: str):
        """``log π(y_t | y_<t)`` of each response token, with its graph."""
        import torch

        tokens, R = list(sample["tokens"]), int(sample["response_length"])
        P = len(tokens) - R
        if P < 1:
            raise InputError(
                f"{where}: {len(tokens)} tokens and response_length {R}; a response needs a prompt token before it"
            )
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device)[None]
        logits = self.model(input_ids=ids).logits[0, P - 1 : -1]
        return torch.log_softmax(logits, dim=-1).gather(1, ids[0, P:, None])[:, 0]

    def grad(self, logp, weights: np.ndarray):
        """``∇ Σ_t weights_t log π_t`` flattened (keeps the graph for the next call)."""
        import torch

        w = torch.as_tensor(weights, dtype=logp.dtype, device=logp.device)
        gs = torch.autograd.grad(
            (w * logp).sum(), self.params, retain_graph=True, allow_unused=True
        )
        return torch.cat(
            [
                (g if g is not None else torch.zeros_like(p)).reshape(-1)
                for g, p in zip(gs, self.params, strict=True)
            ]
        )
