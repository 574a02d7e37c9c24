"""The fixture of the tests that take Miles' training step on megatron-core's real classes.

``megatron`` (a fixture; import it as ``from megatron_step import megatron as megatron``):
skips without ``MILES_SRC``; starts a one-process gloo world under the test-only CPU patch
(``tests/megatron_cpu.py``), megatron-core's model-parallel state (TP = PP = 1) and Miles'
``ParallelState``; records what Miles' ``tracking.log`` would log (the fixture's value, a
list of ``(metrics, step_key)``); clears ``RESCUE_UPDATE_NORM`` and the trained advantages'
moments. Everything is undone after the test. Nothing here imports torch until the fixture
runs, so the tests that use it are collected without the integration extra.
"""

from __future__ import annotations

import pytest
from miles_env import require_miles

from rescue.miles.train_step import ENV_UPDATE_NORM, MOMENTS


@pytest.fixture
def megatron(monkeypatch):
    """megatron-core's model-parallel state, Miles' ParallelState and a tracking recorder."""
    require_miles()
    from megatron.core import mpu
    from megatron_cpu import cpu_patch, gloo_world, miles_parallel_state
    from miles.utils.tracking_utils import tracking

    logged = []
    monkeypatch.setattr(
        tracking, "log", lambda args, metrics, step_key: logged.append((metrics, step_key))
    )
    monkeypatch.delenv(ENV_UPDATE_NORM, raising=False)
    with gloo_world(), cpu_patch():
        mpu.initialize_model_parallel(1, 1)
        try:
            with miles_parallel_state():
                MOMENTS.reset()
                yield logged
        finally:
            mpu.destroy_model_parallel()
