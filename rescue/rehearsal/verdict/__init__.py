"""The checks of a rehearsal, on what a finished run left on disk: is the run sound?

``report`` reads a run once (offline wandb history, the probes, the engine's records, the
rollout dumps, the stand-in docker's log) and prints one line per check; ``checks`` holds
each check's rule; ``lives`` reads a killed and resumed run as one run and checks its
restart; ``profile`` says where the run's seconds went; ``processes`` finds a run's processes
by the run folder in their environment, to reap them and meter their CPU. They import rescue's
core, ``rescue.judge``, ``rescue.replay`` and ``rescue.rehearsal.tiny`` (the weights' digest),
and numpy, scipy, psutil, torch and safetensors inside the functions that use them; never a
framework.
"""
