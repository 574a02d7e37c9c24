"""Running the launchers in tests: a stand-in Miles checkout, stand-in node commands, parsing.

The launchers run against a stand-in Miles checkout (``train_async.py``, the Qwen3-8B model
script, the agentic generate module and the family's chat template) and stand-in node
commands on ``PATH`` (``nvidia-smi`` listing no GPUs, a ``ray`` that fails), so no GPU, Ray
or Miles is needed and nothing can start by accident. Printed commands are split with
``shlex`` into ``{flag: [values]}``; nothing is grepped.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"


#: SGLang server flags the SWE arms pass that no Miles file names: Miles registers SGLang's
#: ServerArgs under the --sglang- prefix (backends/sglang_utils/arguments.py), and
#: sampling_defaults is a ServerArgs field of SGLang 0.5.23 (srt/arg_groups/fields/serving.py).
SGLANG_SERVER_FLAGS = frozenset({"--sglang-sampling-defaults"})


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def miles_dir(tmp_path: Path) -> Path:
    """A stand-in Miles checkout: train_async.py and train.py, the Qwen3-8B and Qwen3-1.7B
    model scripts, the modules a trial imports and the Qwen3 chat template."""
    miles = tmp_path / "miles"
    (miles / "scripts" / "models").mkdir(parents=True)
    (miles / "train_async.py").write_text("")
    (miles / "train.py").write_text("")
    (miles / "scripts" / "models" / "qwen3-8B.py").write_text(
        'def model_args():\n    return "--num-layers 36\\n --hidden-size 4096 "\n'
    )
    (miles / "scripts" / "models" / "qwen3-1.7B.py").write_text(
        'def model_args():\n    return "--num-layers 28 --hidden-size 2048 "\n'
    )
    hub = miles / "miles" / "rollout" / "generate_hub"
    hub.mkdir(parents=True)
    for folder in (miles / "miles", miles / "miles" / "rollout", hub):
        (folder / "__init__.py").write_text("")
    (hub / "agentic_tool_call.py").write_text("async def generate(input):\n    pass\n")
    templates = miles / "miles" / "utils" / "chat_template_utils" / "templates"
    templates.mkdir(parents=True)
    (templates / "qwen3_fixed.jinja").write_text("{{ messages }}")
    return miles


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """Stand-ins for the node's commands; ray fails, so nothing can start by accident."""
    d = tmp_path / "bin"
    d.mkdir()
    executable(d / "nvidia-smi", "#!/bin/sh\nexit 0\n")  # no GPUs
    executable(d / "ray", "#!/bin/sh\necho 'ray must not run in tests' >&2\nexit 99\n")
    return d


def eight_gpus(bin_dir: Path) -> None:
    """nvidia-smi lists eight GPUs."""
    gpus = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(8))
    executable(bin_dir / "nvidia-smi", "#!/bin/sh\n" + gpus)


def launch(
    script: str, bin_dir: Path, miles_dir: Path | None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "JOB_PYTHON": sys.executable,
        "RESCUE_PY": sys.executable,
        "OUTPUT_DIR": "/runs",
    }
    if miles_dir is not None:
        base["MILES_DIR"] = str(miles_dir)
    return subprocess.run(
        ["bash", str(LAUNCH / script)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def command_lines(stdout: str) -> list[list[str]]:
    """The printed commands, each split as the shell would (comment lines skipped)."""
    return [shlex.split(line) for line in stdout.splitlines() if line and not line.startswith("#")]


def flag_dict(words: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2 --switch`` -> ``{"--flag": ["v1", "v2"], "--switch": []}``; no repeats."""
    flags: dict[str, list[str]] = {}
    current = None
    for word in words:
        if word.startswith("--"):
            assert word not in flags, f"flag {word} given twice"
            flags[word] = []
            current = word
        else:
            assert current is not None, f"value {word!r} before any flag"
            flags[current].append(word)
    return flags


def submitted(
    stdout: str, script: str = "train_async.py"
) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """(the trainer's flags, runtime env vars, the words before the trainer's flags) of the one
    ``ray job submit`` printed."""
    submits = [w for w in command_lines(stdout) if w[:3] == ["ray", "job", "submit"]]
    assert len(submits) == 1, stdout
    flags, env, job, _ = split_submit(submits[0], script)
    return flags, env, job


def split_submit(
    words: list[str], script: str
) -> tuple[dict[str, list[str]], dict[str, str], list[str], dict[str, list[str]]]:
    """One ``ray job submit`` line: (trainer flags, runtime env, interpreter and script,
    ``ray job submit``'s own options)."""
    sep = words.index("--")
    ray_opts = flag_dict(words[3:sep])
    (env_json,) = ray_opts["--runtime-env-json"]
    env = json.loads(env_json)["env_vars"]
    job = words[sep + 1 :]
    assert job[1].endswith("/" + script), job[:2]
    return flag_dict(job[2:]), env, job[:2], ray_opts


def dry_run(arm: str, bin_dir: Path, miles_dir: Path, **env: str):
    extra = {"A": "0.5"} if arm == "protect" else {}
    result = launch("swe_arm.sh", bin_dir, miles_dir, ARM=arm, DRY_RUN="1", **{**extra, **env})
    assert result.returncode == 0, result.stderr
    return result
