"""What wandb holds of a rescue run, read and shown one way.

- ``history``: the one reader of a run's records, offline (``offline-run-*`` folders, through
  wandb's own reader of the transaction log) and online (``online``: a project through
  ``wandb.Api``, cached on disk), with one key convention: a nested key is joined with
  ``.``, as wandb's reader, its API and its app name it;
- ``metrics``: the ``define_metric`` declarations the Miles and slime adapters and the
  simulator make, so every key plots against its step;
- ``workspace``: the saved workspace (sections and panels; ``wandb-workspaces``, the
  ``[wandb]`` extra) and ``preview``, the same panels drawn from offline runs;
- ``cli``: ``rescue wandb workspace`` and ``rescue wandb preview``.

wandb and wandb-workspaces are imported inside the functions that need them, so
``import rescue.tracking`` works on a bare install.
"""
