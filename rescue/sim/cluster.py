"""The arm-seed grid as Ray tasks (``rescue sim --ray ADDRESS``).

Specification
-------------
Each (arm, seed) run is one Ray task calling ``run.run_one``, the function a local run
calls, with the same ``SimConfig``; a run is deterministic in its seed, so the results
(the census JSONL, ``runs.json``, the summary) are the same, byte for byte, as a local
run's. The driver connects to the cluster at ``ADDRESS`` (``auto``: the cluster this
machine is a node of), ships this ``rescue`` package to the workers (Ray's
``runtime_env`` ``py_modules``, so the nodes need only numpy, not rescue), waits for the
tasks (reporting the steps of the finished ones to ``on_progress``, the runner's progress
bar), and disconnects. It never starts or stops a cluster. ``connect`` reaches the cluster
on its own: ``rescue sim`` calls it before it touches its output folder, so a cluster that
is not there is one line and nothing else. An interrupt (or any error) while the tasks run
cancels the tasks still running before it disconnects.

Ray is an optional dependency (the ``ray`` extra, and in Miles' stack already); it is
imported here, inside the function, only when ``--ray`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rescue.errors import InputError
from rescue.sim.arms import ArmSpec
from rescue.sim.config import SimConfig
from rescue.sim.run import RunResult, run_one

Job = tuple[SimConfig, ArmSpec, int]

#: Seconds between two looks at the tasks (the progress report's refresh).
POLL_S = 0.5


def connect(address: str) -> None:
    """Connect this driver to the Ray cluster at ``address`` (``auto``: the one this machine
    is a node of), shipping the ``rescue`` package; an error naming ``--ray`` when Ray is
    not installed or no cluster answers there. Nothing when already connected."""
    if not address:
        raise InputError("--ray needs an address: host:port of the cluster's head, or auto")
    try:
        import ray
    except ImportError:
        raise InputError(
            f"--ray {address}: Ray is not installed (pip install 'rescue[ray]')"
        ) from None
    import rescue

    if ray.is_initialized():
        return
    try:
        ray.init(
            address=address,
            runtime_env={"py_modules": [rescue]},
            log_to_driver=False,
            configure_logging=False,
        )
    except Exception as e:  # ConnectionError, or Ray's RpcError when its GCS never answers
        raise InputError(f"--ray {address}: no Ray cluster there ({str(e).strip()})") from None


def run_on_ray(
    address: str,
    jobs: Sequence[Job],
    *,
    on_progress: Callable[[int], None] | None = None,
    keep: Sequence[str] | None = None,
) -> list[RunResult]:
    """``RunResult`` of each ``(config, arm, seed)`` of ``jobs``, in order, run on Ray;
    ``on_progress(steps)`` with the steps of the finished runs at every look; ``keep`` as
    ``run_one``'s."""
    connect(address)
    import ray

    pending: list = []
    try:
        task = ray.remote(num_cpus=1)(run_one)
        refs = [task.remote(cfg, arm, seed, keep=keep) for cfg, arm, seed in jobs]
        steps = {ref: cfg.steps for ref, (cfg, _, _) in zip(refs, jobs, strict=True)}
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            if on_progress is not None:
                on_progress(sum(steps.values()) - sum(steps[r] for r in pending))
        return ray.get(refs)
    except BaseException:
        for ref in pending:  # nothing of this run keeps running on the cluster
            ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()  # disconnects this driver; the cluster keeps running
