"""A tiny offline tokenizer of the Qwen3 family, for the rehearsal (no hub download).

``build_model_dir(folder, chat_template)`` trains a byte-level BPE of a few hundred tokens
on a fixed local corpus with ``tokenizers``, adds the family's special tokens, and writes
what ``transformers.AutoTokenizer`` and Miles' session server load:

- ``tokenizer.json`` (the BPE) and ``tokenizer_config.json`` (``Qwen2Tokenizer``,
  ``<|im_end|>`` as end of turn, the chat template given),
- ``config.json``: a qwen3 architecture with no weights, whose
  ``max_position_embeddings`` (default 40960, Qwen3-8B's) is the context a real SGLang
  derives from the checkpoint.

The chat template is passed in (the rehearsal reads the family's template from the Miles
checkout), so nothing here knows a framework.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The Qwen3 family's special tokens (ChatML turns, tool calls, thinking).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)

_CORPUS = (
    "You are a helpful assistant that can interact with a computer shell to solve tasks.",
    "THOUGHT: I will look at the code, fix the bug, run the tests and submit the patch.",
    "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n",
    "sed -i 's/return a - b/return a + b/' calc.py && python -m pytest -q tests",
    "git diff -- calc.py > patch.txt; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt",
    '{"name": "bash", "arguments": {"command": "cat calc.py"}}',
    "<returncode>0</returncode>\n<output>\n1 passed in 0.01s\n</output>",
    "The quick brown fox jumps over the lazy dog. 0123456789 !?.,;:()[]{}<>=+-*/\\|&%$#@^~`\"'",
)


def build_model_dir(
    folder: Path,
    chat_template: str,
    *,
    vocab_size: int = 600,
    max_position_embeddings: int = 40960,
    corpus: tuple[str, ...] = (),
    words: tuple[str, ...] = (),
) -> Path:
    """Write the tokenizer and an architecture-only config into ``folder``; returns it.
    ``corpus``: more text to learn merges from (the agent's prompts, so they take fewer
    tokens), beside the fixed local corpus. ``words``: strings that become one token each
    wherever they appear (not special: decoded as text), e.g. a text game's commands."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([*_CORPUS, *corpus] * 4, trainer=trainer)
    if words:
        tokenizer.add_tokens([AddedToken(w, normalized=False) for w in dict.fromkeys(words)])
    tokenizer.save(str(folder / "tokenizer.json"))
    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": max_position_embeddings,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "added_tokens_decoder": added,
        "chat_template": chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    model = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": tokenizer.token_to_id("<|endoftext|>"),
        "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
    }
    (folder / "config.json").write_text(json.dumps(model, indent=1))
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [model["eos_token_id"]], "temperature": 1.0})
    )
    return folder
