"""The rehearsal end to end through Miles' real process tree (marker ``rehearsal``).

Needs ``MILES_SRC`` and the rehearsal's environment (``make rehearsal`` creates
``.venv-rehearsal``; ``REHEARSAL_PY`` names another interpreter); skipped with the reason
otherwise. Run with ``make rehearsal-test MILES_SRC=/path/to/miles``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MILES_SRC = os.environ.get("MILES_SRC") or None
REHEARSAL_PY = os.environ.get("REHEARSAL_PY") or str(ROOT / ".venv-rehearsal" / "bin" / "python")
PARSERS = "--sglang-tool-call-parser qwen25 --sglang-reasoning-parser qwen3"

pytestmark = pytest.mark.rehearsal


def _require() -> None:
    if MILES_SRC is None:
        pytest.skip("needs real Miles sources: set MILES_SRC=/path/to/miles to run")
    if not Path(REHEARSAL_PY).exists():
        pytest.skip(f"no rehearsal environment at {REHEARSAL_PY}: run `make rehearsal` once")
    probe = subprocess.run(
        [REHEARSAL_PY, "-c", "import sglang, sglang_router, ray, transformers"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"{REHEARSAL_PY} lacks the [rehearsal] extra: run `make rehearsal` once")


def _rehearse(tmp_path: Path, *flags: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [REHEARSAL_PY, "-m", "rescue.miles.rehearsal", "--miles-src", MILES_SRC, *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_without_a_tool_call_parser_the_rehearsal_stops_at_preflight_saying_why(tmp_path):
    _require()
    run = _rehearse(
        tmp_path,
        "--out",
        str(tmp_path / "r"),
        "--extra-args",
        "--sglang-reasoning-parser qwen3",
        "--without=--sglang-tool-call-parser",
        timeout=600,
    )
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("rehearsal: FAILED: pre-flight:")
    assert "--sglang-tool-call-parser" in last and "tool_calls" in last
    assert not (tmp_path / "r" / "job.log").exists()  # stopped before Ray


def test_protect_arm_passes_every_check_through_miles(tmp_path):
    _require()
    out = tmp_path / "r"
    # about 2,000 s on 2 idle cores: the steps whose groups all went stale regenerate them
    run = _rehearse(
        tmp_path, "--arm", "protect", "--a", "0.5", "--out", str(out), "--extra-args", PARSERS,
        "--timeout", "2700", timeout=3000,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "rehearsal: PASSED"
    report = json.loads((out / "report.json").read_text())
    assert {c["name"] for c in report["checks"]} == {
        "job", "steps", "weights", "unused", "outcomes", "infra", "replay",
    }  # fmt: skip
    assert "[patch] miles.ray.placement_group._get_placement_group_layout" in run.stdout
