"""The training command of the rehearsal: the launcher's dry run and the ``argument`` rows.

``launcher_command`` runs a launcher (``launch/swe_arm.sh``, ``rlvr_arm.sh`` or
``agent_arm.sh``) with ``DRY_RUN=1`` and returns the runtime env, the Miles entry point
(``train_async.py``, ``train.py``) and the flags it would submit; ``cpu_flags`` applies the
``argument`` rows of ``rescue.rehearsal.miles.changes.CHANGES`` to them.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


class RehearsalError(RuntimeError):
    """A failure of the rehearsal with its one-line reason."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def option_values(flags: list[str], name: str) -> list[str] | None:
    """Values of the last ``name`` in ``flags`` (None when absent)."""
    found = None
    for i, token in enumerate(flags):
        if token == name:
            j = i + 1
            while j < len(flags) and not flags[j].startswith("--"):
                j += 1
            found = flags[i + 1 : j]
    return found


def set_option(flags: list[str], name: str, *values: str) -> list[str]:
    """``flags`` with every ``name`` removed and ``name values`` appended."""
    return [*drop_option(flags, name), name, *values]


def drop_option(flags: list[str], name: str) -> list[str]:
    out, i = [], 0
    while i < len(flags):
        if flags[i] == name:
            i += 1
            while i < len(flags) and not flags[i].startswith("--"):
                i += 1
            continue
        out.append(flags[i])
        i += 1
    return out


def launcher_command(
    env: dict[str, str], script: str = "launch/swe_arm.sh"
) -> tuple[dict[str, Any], list[str]]:
    """(runtime env, flags) of the dry run of ``script`` with ``env`` (``launcher_entry``
    also names the entry point)."""
    runtime, _, flags = launcher_entry(env, script)
    return runtime, flags


def launcher_entry(
    env: dict[str, str], script: str = "launch/swe_arm.sh"
) -> tuple[dict[str, Any], str, list[str]]:
    """(runtime env, Miles entry point's file name, flags) of ``script``'s dry run."""
    runtime, entry, flags, _ = launcher_dry_run(env, script)
    return runtime, entry, flags


def launcher_dry_run(
    env: dict[str, str], script: str = "launch/swe_arm.sh"
) -> tuple[dict[str, Any], str, list[str], list[str]]:
    """``launcher_entry``'s three and the notes the launcher printed (``# ...`` lines)."""
    proc = subprocess.run(
        ["bash", str(ROOT / script)],
        env={**os.environ, **env, "DRY_RUN": "1"},
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["(no message)"]
        raise RehearsalError(f"launcher: {lines[-1]}")
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ray job submit")), None)
    if line is None:
        raise RehearsalError("launcher printed no `ray job submit` command")
    words = shlex.split(line)
    runtime = json.loads(words[words.index("--runtime-env-json") + 1])
    rest = words[words.index("--") + 1 :]
    notes = [ln[2:] for ln in proc.stdout.splitlines() if ln.startswith("# ")]
    return runtime, Path(rest[1]).name, rest[2:], notes


#: Flags whose fused CUDA kernels (Transformer Engine, Apex) a CPU lacks: each turns one off.
NO_FUSION = (
    "--no-rope-fusion",
    "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion",
    "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion",
    "--no-persist-layer-norm",
)
#: Flags the launcher sets that need a GPU (removed, with their values).
GPU_ONLY = (
    "--attention-backend",
    "--optimizer-cpu-offload",
    "--overlap-cpu-optimizer-d2h-h2d",
    "--use-precision-aware-optimizer",
)


def cpu_flags(
    flags: list[str],
    *,
    engine_port: int,
    router_port: int,
    session_port: int,
    router: str = "miles",
) -> tuple[list[str], list[str]]:
    """The ``argument`` rows applied to ``flags``; returns (flags, removed flag names)."""
    removed = [name for name in GPU_ONLY if option_values(flags, name) is not None]
    for name in removed:
        flags = drop_option(flags, name)
    if option_values(flags, "--colocate") is not None:
        removed.append("--colocate")
        flags = drop_option(flags, "--colocate")
        flags = set_option(flags, "--rollout-num-gpus", "1")
        flags = set_option(flags, "--num-gpus-per-node", "2")
    flags = set_option(flags, "--train-backend", "megatron")
    flags = set_option(flags, "--transformer-impl", "local")
    for name in NO_FUSION:
        flags = set_option(flags, name)
    flags = set_option(flags, "--rollout-external")
    flags = set_option(flags, "--rollout-external-engine-addrs", f"127.0.0.1:{engine_port}")
    if router == "miles":
        flags = set_option(flags, "--use-miles-router")
    else:
        flags = set_option(flags, "--worker-urls", f"http://127.0.0.1:{engine_port}")
    flags = set_option(flags, "--distributed-backend", "gloo")
    flags = set_option(flags, "--sglang-router-port", str(router_port))
    flags = set_option(flags, "--session-server-port", str(session_port))
    return flags, removed
