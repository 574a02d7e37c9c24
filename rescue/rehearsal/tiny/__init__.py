"""The rehearsal's tiny model and its inputs: a Qwen3 of a few layers that a CPU can train.

``tokenizer`` trains a tiny offline byte-level BPE of the Qwen3 family and writes the model
folder's config; ``policy`` draws a checkpoint from a seed and answers what SGLang computes
for a request (log-probs, top-k heads, sampling, weights received by name); ``teach`` teaches
it a task with a few hundred supervised steps; ``singleturn`` (``--launcher rlvr``: "box the
digit d") and ``textgames`` (``--launcher agent``: TextWorld cooking) hold each task's seeded
teacher and build the taught model. They import ``rescue.rlvr`` (the prompts' encoding) and
``rescue.envs`` (the games), and torch, transformers, safetensors and tokenizers inside the
functions that use them; never a framework.
"""
