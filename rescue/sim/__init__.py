"""The embedded simulator of asynchronous multi-turn agent RL (``rescue sim``, ``make demo``).

A seeded discrete-event simulation of a fully asynchronous trainer (``engine``) whose
agent solves simulated tasks turn by turn (``env``, ``policy``). It runs the same core
objects as the Miles and slime adapters, not copies: ``rescue.gate.Gate`` decides stale
groups, ``rescue.mask.mask_decision`` masks capped rollouts, ``rescue.advantages``
normalizes rewards, ``rescue.outcomes`` classifies rollouts and ``rescue.census.Census``
counts every group. What it shows is what the cluster runs.

numpy only; matplotlib and wandb (the ``sim`` extra) are imported by ``plots`` and
``runner.log_wandb`` when they write.
"""

from rescue.sim.arms import ARMS, DEFAULT_ARMS, ArmSpec, parse_arms
from rescue.sim.config import SimConfig
from rescue.sim.engine import Simulation

__all__ = ["ARMS", "DEFAULT_ARMS", "ArmSpec", "SimConfig", "Simulation", "parse_arms"]
