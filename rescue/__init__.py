"""rescue: unbiased replacements for outcome-dependent exclusion in asynchronous agentic RL.

What imports what:

- The core (this package minus ``rescue.miles`` and ``rescue.slime``) imports the standard
  library and numpy at module level, and never an adapter (``rescue.miles``,
  ``rescue.slime``), ``filters``, ``swe_smith_tasks``, a training framework (Miles, slime,
  Megatron, sglang, Ray) or Docker. ``tests/test_imports.py`` checks this.
- Inside the functions that need them, and only then: ``rescue.replay`` imports torch
  (``dumps``, to unpickle a dump) and transformers (``model``, ``gradients``), the
  ``[replay]`` extra; ``rescue.sim`` imports matplotlib (``plots``) and wandb
  (``run``, when it logs), the ``[sim]`` extra; ``rescue.tracking`` imports wandb (reading
  runs, declaring their axes), wandb-workspaces (saving the workspace, the ``[wandb]``
  extra) and matplotlib (its preview); ``rescue.progress`` imports tqdm (a dependency)
  where a bar is drawn.
- The ``rescue`` command imports each subcommand's module to build its parser; the
  ``swe`` subcommand lives in ``swe_smith_tasks.cli``.
- The adapters import their framework inside the hooks, when Miles or slime calls them;
  ``filters`` (the sample filters) imports the core only.
"""

__version__ = "0.1.0"
