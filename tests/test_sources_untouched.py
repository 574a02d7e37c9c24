"""A test session that changes a file of the framework sources it reads (MILES_SRC,
SLIME_SRC, MEGATRON_SRC) fails, naming the file (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")


def _session(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    miles = tmp_path / "miles"
    miles.mkdir(exist_ok=True)
    (miles / "train.py").write_text("print('train')\n")
    (miles / "__pycache__").mkdir(exist_ok=True)
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    shutil.copy(CONFTEST, suite / "conftest.py")
    (suite / "test_one.py").write_text(
        "import os\nfrom pathlib import Path\n\n\ndef test_one():\n"
        "    src = Path(os.environ['MILES_SRC'])\n" + body
    )
    env = {**os.environ, "MILES_SRC": str(miles)}
    env.pop("SLIME_SRC", None)
    env.pop("MEGATRON_SRC", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_test_that_empties_a_source_file_fails_the_session(tmp_path):
    result = _session(tmp_path, "    (src / 'train.py').write_text('')\n")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed" in result.stdout  # the test itself passed: the session fails
    assert "tests changed the framework sources they read:" in result.stdout
    assert f"MILES_SRC: {tmp_path / 'miles' / 'train.py'} changed" in result.stdout


def test_reading_and_caching_byte_code_leave_the_session_alone(tmp_path):
    body = (
        "    assert (src / 'train.py').read_text()\n"
        "    (src / '__pycache__' / 'train.cpython-311.pyc').write_bytes(b'')\n"
    )
    result = _session(tmp_path, body)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tests changed" not in result.stdout
