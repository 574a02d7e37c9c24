"""Settings of the SWE agent: turn cap, time budget, timeouts and their order, concurrency,
sandbox.

Specification
-------------
Every setting has a default (stated on its field) and an environment variable (``_ENV``)
that ``AgentSettings.from_env`` reads, so launchers set them in the Ray runtime env.
Construction checks the timeout order the trial relies on::

    command_timeout_s, request_timeout_s, start_timeout_s < trial_timeout_s < outer_timeout_s
    time_budget_s + request_timeout_s + command_timeout_s + start_timeout_s < trial_timeout_s

What the agent spends is its budget, what the infrastructure spends is not. The agent's
own time (its model calls and its commands; ``time_budget_s``) is checked before each
model call and may overrun it by one request and one command; with the second line, a
trial can only run past ``trial_timeout_s`` through time the infrastructure took
(container start, the grader, a failing endpoint retried for up to
``endpoint_patience_s``), so the trial timeout is an infrastructure fault and the time
budget a budget failure (``rescue.outcomes.REASONS``).

The sandbox is fixed by setting, never derived from the node: ``container_cpus``,
``container_memory`` and ``container_pids`` are the same for the pilot, every arm and
the grader, whatever the concurrency or the node type.

A violated order or an unknown value is a ``ValueError`` naming the variable.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from rescue.errors import InputError

_ENV = {
    "step_limit": "RESCUE_SWE_STEP_LIMIT",
    "time_budget_s": "RESCUE_SWE_TIME_BUDGET",
    "endpoint_patience_s": "RESCUE_SWE_ENDPOINT_PATIENCE",
    "command_timeout_s": "RESCUE_SWE_COMMAND_TIMEOUT",
    "request_timeout_s": "RESCUE_SWE_REQUEST_TIMEOUT",
    "trial_timeout_s": "RESCUE_SWE_TRIAL_TIMEOUT",
    "outer_timeout_s": "RESCUE_SWE_OUTER_TIMEOUT",
    "start_timeout_s": "RESCUE_SWE_START_TIMEOUT",
    "max_concurrency": "RESCUE_SWE_MAX_CONCURRENCY",
    "model_name": "AGENT_MODEL_NAME",
    "environment": "RESCUE_SWE_ENVIRONMENT",
    "docker_executable": "MSWEA_DOCKER_EXECUTABLE",
    "docker_run_args": "RESCUE_SWE_DOCKER_RUN_ARGS",
    "container_memory": "RESCUE_SWE_CONTAINER_MEMORY",
    "container_cpus": "RESCUE_SWE_CONTAINER_CPUS",
    "container_pids": "RESCUE_SWE_CONTAINER_PIDS",
    "cut_network": "RESCUE_SWE_CUT_NETWORK",
    "local_images": "RESCUE_SWE_LOCAL_IMAGES",
    "config": "RESCUE_SWE_CONFIG",
    "hide_history": "RESCUE_SWE_HIDE_HISTORY",
    "log_dir": "RESCUE_SWE_LOG_DIR",
}


@dataclass(frozen=True)
class AgentSettings:
    """Settings of the SWE agent; ``from_env`` reads each from the variable in ``_ENV``."""

    step_limit: int = 40
    """Turn cap: model calls per trial, format errors included (RESCUE_SWE_STEP_LIMIT)."""
    time_budget_s: float = 3600
    """The agent's own time: seconds in its model calls (failed attempts excluded) and its
    commands; past it, the next model call ends the trial as a budget failure
    (``TimeBudgetExceeded``, reason ``time_budget``)."""
    endpoint_patience_s: float = 1800
    """How long a model request that fails for the endpoint's sake (connection, timeout,
    5xx, 429) is retried, with backoff, before the trial ends as ``endpoint_error``; the
    time is the infrastructure's, not the agent's budget."""
    command_timeout_s: int = 60
    """Limit on one shell command; a timeout is an observation, not an error."""
    request_timeout_s: float = 600
    """Limit on one model request (litellm ``timeout``)."""
    trial_timeout_s: float = 5400
    """Limit on one trial: container start, agent, grading (not the wait for a slot)."""
    outer_timeout_s: float = 7200
    """The trainer's limit on one sample; must exceed ``trial_timeout_s``."""
    start_timeout_s: float = 300
    """Limit on ``docker run``, including an implicit image pull."""
    max_concurrency: int = 32
    """Trials running at once per event loop (Miles: at least rollout batch x n samples)."""
    model_name: str = "model"
    """Served model name; requests go to ``openai/<model_name>`` (AGENT_MODEL_NAME)."""
    environment: str = "docker"
    """``docker`` (task image) or ``local`` (a copy of ``<local_images>/<image>/testbed``)."""
    docker_executable: str | None = None
    """Docker CLI (MSWEA_DOCKER_EXECUTABLE; default ``docker``)."""
    docker_run_args: tuple[str, ...] = ()
    """Extra ``docker run`` arguments, e.g. ``--shm-size 2g`` (shell-split; after the limits,
    so they win)."""
    container_memory: str = "10g"
    """``docker run --memory`` of every task container, as the SWE-smith harness grades
    (``0`` = no limit)."""
    container_cpus: float = 2.0
    """``docker run --cpus`` of every task container, a fixed value (``0`` = no limit)."""
    container_pids: int = 4096
    """``docker run --pids-limit`` of every task container (``0`` = no limit): a fork bomb
    stays in its sandbox."""
    cut_network: bool = True
    """Disconnect the agent's container from every network once the task is checked out."""
    local_images: str | None = None
    """Folder of directory images for ``environment=local``."""
    config: str = "swebench.yaml"
    """mini-swe-agent config for prompts and templates (default: its SWE-bench config)."""
    hide_history: bool = True
    """Replace the task's git history by one commit before the agent starts."""
    log_dir: str | None = None
    """Keep trajectories and grader logs under ``<log_dir>/<instance_id>/<trial>/``."""

    def __post_init__(self) -> None:
        if self.step_limit < 1:
            raise InputError(f"RESCUE_SWE_STEP_LIMIT={self.step_limit}: must be >= 1")
        if self.max_concurrency < 1:
            raise InputError(f"RESCUE_SWE_MAX_CONCURRENCY={self.max_concurrency}: must be >= 1")
        if self.environment not in ("docker", "local"):
            raise InputError(f"RESCUE_SWE_ENVIRONMENT={self.environment!r}; allowed: docker, local")
        if not self.container_cpus >= 0:
            raise InputError(f"RESCUE_SWE_CONTAINER_CPUS={self.container_cpus}: must be >= 0")
        if self.container_pids < 0:
            raise InputError(f"RESCUE_SWE_CONTAINER_PIDS={self.container_pids}: must be >= 0")
        for name in ("time_budget_s", "endpoint_patience_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"{_ENV[name]}={getattr(self, name)}: must be > 0")
        if self.environment == "local" and not self.local_images:
            raise InputError("RESCUE_SWE_ENVIRONMENT=local needs RESCUE_SWE_LOCAL_IMAGES")
        for name in ("command_timeout_s", "request_timeout_s", "start_timeout_s"):
            if not 0 < getattr(self, name) < self.trial_timeout_s:
                raise InputError(
                    f"{_ENV[name]}={getattr(self, name)} must be > 0 and below "
                    f"{_ENV['trial_timeout_s']}={self.trial_timeout_s}"
                )
        overrun = self.request_timeout_s + self.command_timeout_s + self.start_timeout_s
        if not self.time_budget_s + overrun < self.trial_timeout_s:
            raise InputError(
                f"{_ENV['time_budget_s']}={self.time_budget_s} plus one request, one command "
                f"and a container start ({overrun:g} s) must be below "
                f"{_ENV['trial_timeout_s']}={self.trial_timeout_s}: a trial timeout must mean "
                "time the infrastructure took, never the agent's own"
            )
        if not self.trial_timeout_s < self.outer_timeout_s:
            raise InputError(
                f"{_ENV['trial_timeout_s']}={self.trial_timeout_s} must be below "
                f"{_ENV['outer_timeout_s']}={self.outer_timeout_s} (the trainer's timeout)"
            )

    def docker_limits(self) -> tuple[str, ...]:
        """The ``docker run`` resource flags of a task container (``--memory``, ``--cpus``,
        ``--pids-limit``), the same on every node."""
        flags: tuple[str, ...] = ()
        if self.container_memory not in ("", "0", "none"):
            flags += ("--memory", self.container_memory)
        if self.container_cpus > 0:
            flags += ("--cpus", f"{self.container_cpus:g}")
        if self.container_pids > 0:
            flags += ("--pids-limit", str(self.container_pids))
        return flags

    def sandbox(self) -> dict[str, Any]:
        """The sandbox as a run records it (its config, the wandb config)."""
        return {
            "cpus": self.container_cpus,
            "memory": self.container_memory,
            "pids": self.container_pids,
            "cut_network": self.cut_network,
            "time_budget_s": self.time_budget_s,
            "trial_timeout_s": self.trial_timeout_s,
            "command_timeout_s": self.command_timeout_s,
            "step_limit": self.step_limit,
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AgentSettings:
        """Settings from environment variables (unset ones keep their defaults), then overrides."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = _ENV.get(f.name)
            if var is None or not env.get(var):
                continue
            raw = env[var]
            try:
                if f.name == "docker_run_args":
                    values[f.name] = tuple(shlex.split(raw))
                elif f.type == "bool":
                    values[f.name] = raw.strip().lower() not in ("0", "false", "no", "off")
                elif f.type in ("int", "float", "float | None"):
                    values[f.name] = int(raw) if f.type == "int" else float(raw)
                else:
                    values[f.name] = raw
            except ValueError:
                raise InputError(f"{var}={raw!r} is not a valid {f.type}") from None
        return cls(**{**values, **overrides})
