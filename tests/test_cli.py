"""The top-level ``rescue`` command: bad input is one line, anything else a traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rescue import cli, identity
from rescue.errors import InputError


def test_input_error_is_one_line_and_exit_status_2(tmp_path, capsys):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"theta": [0.0], "rows": [{"action": 5, "reward": 1}]}))
    assert cli.main(["identity", "--table", str(table)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rescue identity: error: --table")
    assert "rows[0].action=5" in err


def test_input_error_is_a_value_error_for_callers():
    assert issubclass(InputError, ValueError)
    with pytest.raises(ValueError, match="RESCUE_ARM"):
        from rescue.gate import Gate

        Gate(arm="sometimes")


def test_a_value_error_that_is_not_bad_input_keeps_its_traceback(monkeypatch):
    """A numpy shape error inside a command is a bug to report: it must propagate."""

    def broken(args):
        return np.ones(3) @ np.ones(4)  # ValueError from numpy

    monkeypatch.setattr(identity, "main", broken)
    with pytest.raises(ValueError, match="mismatch"):
        cli.main(["identity"])
