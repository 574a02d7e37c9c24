"""The Miles side of the CPU rehearsal: the CPU-change table, its import hook, the training
command and the driver. It drives Miles and patches Miles' modules in-process, so like an
adapter it imports Miles, Megatron and SGLang only where a patch applies, never at import time.
"""
