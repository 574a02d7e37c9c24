"""The CPU rehearsal: an arm trained for a few steps through Miles' own loop, on a CPU.

It rehearses the arms of the three launchers (``swe``: the SWE arms on Miles' fully
asynchronous trainer; ``rlvr``: the single-turn arms; ``agent``: the text-game arms) and the
questions' chains (q1–q3 with ``REHEARSAL=1``: ``rescue.questions.chains`` runs their stages
through the driver here and ``rescue.questions.rehearsal``). By job:

- ``standins``: what a CPU cannot run, standing in and failing as the real thing fails: the
  SGLang engine (``engine``, ``model``, ``weights``), ``docker`` and the SWE ``tasks`` it runs;
- ``tiny``: the tiny Qwen3 and its inputs: ``policy``, ``tokenizer``, ``teach`` and the
  taught models of the single-turn (``singleturn``) and text-game (``textgames``) launchers;
- ``verdict``: checking a finished run on what it left on disk: ``report``, ``checks``,
  ``lives`` (a killed and resumed run), ``profile`` and ``processes``;
- ``miles``: the Miles side (the driver, the CPU changes, the import hook, patches and
  probes).

Imports: ``tiny`` imports ``rescue.rlvr`` and ``rescue.envs``; ``standins`` imports
``tiny`` (the engine serves its policy); ``verdict`` imports rescue's core, ``rescue.judge``,
``rescue.replay`` and ``tiny``; none imports Miles, slime, Megatron or SGLang. The tiny model
imports torch, transformers and tokenizers (so do the engine serving it, the weight update's
receiver and the report's weight check), always inside the function that uses them, so
importing any of these modules loads none of them. ``miles`` imports Miles, Megatron and
SGLang lazily, like an adapter. This package itself imports nothing.
"""
