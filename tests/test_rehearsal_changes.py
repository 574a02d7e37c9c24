"""The CPU-change table, its import hook, and the driver's command rewriting (no Miles needed)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rescue.miles import cpu_changes
from rescue.miles.cpu_changes import CHANGES, _Hook
from rescue.miles.rehearsal import SETTINGS, launcher_settings, main, parse_args, version_stride
from rescue.miles.rehearsal_command import (
    cpu_flags,
    drop_option,
    launcher_command,
    option_values,
    set_option,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_has_a_kind_and_a_reason_and_patches_name_their_module():
    assert {c.kind for c in CHANGES} <= {"argument", "patch", "probe"}
    for c in CHANGES:
        assert c.what and len(c.reason) >= 15
        if c.apply is not None:
            assert c.module and c.kind in ("patch", "probe")
    kinds = [c.kind for c in CHANGES]
    assert kinds.index("patch") > kinds.index("argument")


def test_option_helpers_replace_and_drop_with_their_values():
    flags = ["--a", "1", "2", "--b", "--c", "x"]
    assert option_values(flags, "--a") == ["1", "2"]
    assert option_values(flags, "--b") == []
    assert option_values(flags, "--z") is None
    assert drop_option(flags, "--a") == ["--b", "--c", "x"]
    assert set_option(flags, "--c", "y") == ["--a", "1", "2", "--b", "--c", "y"]


def test_cpu_flags_remove_unknown_flags_with_their_values_and_add_the_cpu_ones():
    flags = ["--hidden-size", "4096", "--num-rollout", "7", "--context-parallel-size", "2"]
    known = {"--num-rollout", "--context-parallel-size", "--train-backend"}
    out, removed = cpu_flags(flags, known, engine_port=1, router_port=2, session_port=3)
    assert removed == ["--hidden-size"]
    assert "4096" not in out and option_values(out, "--num-rollout") == ["7"]
    assert option_values(out, "--context-parallel-size") == ["1"]
    assert option_values(out, "--train-backend") == ["fsdp"]
    assert option_values(out, "--debug-rollout-only") == []
    assert option_values(out, "--rollout-external-engine-addrs") == ["127.0.0.1:1"]
    assert option_values(out, "--use-miles-router") == []
    assert option_values(out, "--distributed-backend") == ["gloo"]
    assert option_values(out, "--sglang-router-port") == ["2"]
    assert option_values(out, "--session-server-port") == ["3"]
    sglang, _ = cpu_flags(
        flags, known, engine_port=1, router_port=2, session_port=3, router="sglang"
    )
    assert option_values(sglang, "--worker-urls") == ["http://127.0.0.1:1"]
    assert option_values(sglang, "--use-miles-router") is None


def test_the_hook_patches_a_module_right_after_its_first_import(tmp_path, monkeypatch):
    (tmp_path / "rehearsal_target.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def patch(module: types.ModuleType) -> None:
        seen.append(module.f())
        module.f = lambda: 2

    hook = _Hook({"rehearsal_target": [patch]})
    sys.meta_path.insert(0, hook)
    try:
        module = importlib.import_module("rehearsal_target")
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("rehearsal_target", None)
    assert seen == [1] and module.f() == 2


def test_a_missing_module_miles_imports_is_created_empty(monkeypatch):
    monkeypatch.setattr(cpu_changes, "_MISSING", ("rehearsal_missing_mod",))
    hook = _Hook({})
    sys.meta_path.insert(0, hook)
    try:
        module = importlib.import_module("rehearsal_missing_mod")
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("rehearsal_missing_mod", None)
    assert "rehearsal" in module.__doc__


def test_the_placeholder_package_fails_when_used_and_only_once_switched_on(monkeypatch):
    monkeypatch.setattr(cpu_changes, "_PLACEHOLDERS", ("rehearsal_absent_pkg",))
    hook = _Hook({})
    sys.meta_path.insert(0, hook)
    try:
        monkeypatch.setattr(cpu_changes, "_PLACEHOLDERS_ON", False)
        with pytest.raises(ImportError):
            importlib.import_module("rehearsal_absent_pkg")
        monkeypatch.setattr(cpu_changes, "_PLACEHOLDERS_ON", True)
        transforms = importlib.import_module("rehearsal_absent_pkg.transforms")
        mode = transforms.InterpolationMode.BICUBIC  # import-time use works
        with pytest.raises(RuntimeError, match="rehearsal_absent_pkg is not installed"):
            transforms.Compose([mode])
    finally:
        sys.meta_path.remove(hook)
        for name in [n for n in sys.modules if n.startswith("rehearsal_absent_pkg")]:
            sys.modules.pop(name)


def test_sitecustomize_installs_the_hook_only_in_a_rehearsal(tmp_path):
    site = ROOT / "rescue" / "miles" / "rehearsal_site"
    code = "import sys; print(any(type(f).__name__ == '_Hook' for f in sys.meta_path))"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    env.pop("RESCUE_REHEARSAL_DIR", None)
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    env["RESCUE_REHEARSAL_DIR"] = str(tmp_path)
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert off.stdout.strip() == "False" and on.stdout.strip() == "True"


def test_launcher_command_is_the_dry_run_of_the_arm(tmp_path):
    miles = tmp_path / "miles"
    miles.mkdir()
    (miles / "train_async.py").write_text("")
    env = {
        **{name: value for name, value, _ in SETTINGS},
        "ARM": "protect",
        "A": "0.5",
        "MILES_DIR": str(miles),
        "MODEL_ARGS": "--num-layers 2",
        "OUTPUT_DIR": str(tmp_path / "out"),
        "EXTRA_ARGS": "--sglang-tool-call-parser qwen25",
        "JOB_PYTHON": sys.executable,
    }
    runtime, flags = launcher_command(env)
    assert runtime["env_vars"]["RESCUE_ARM"] == "protect"
    assert runtime["env_vars"]["RESCUE_A"] == "0.5"
    assert option_values(flags, "--rollout-batch-size") == ["2"]
    assert option_values(flags, "--n-samples-per-prompt") == ["4"]
    assert option_values(flags, "--sglang-tool-call-parser") == ["qwen25"]
    assert option_values(flags, "--custom-async-data-buffer-path") == [
        "rescue.miles.buffer.RescueDataBuffer"
    ]
    assert option_values(flags, "--num-layers") == ["2"]


def test_launcher_errors_stop_the_rehearsal_with_its_line(tmp_path):
    from rescue.miles.rehearsal_command import RehearsalError

    with pytest.raises(RehearsalError, match="ARM="):
        launcher_command({"ARM": "sometimes", "MILES_DIR": str(tmp_path)})


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--arm", "keep"], "--arm"),
        (["--router", "nginx"], "--router"),
        (["--steps", "0"], "--steps"),
        (["--version-stride", "0"], "--version-stride"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path, capsys, argv, named):
    with pytest.raises(SystemExit) as e:
        main(["--miles-src", str(tmp_path), *argv])
    assert e.value.code == 2 and named in capsys.readouterr().err


def test_missing_miles_checkout_is_one_line(tmp_path, capsys):
    assert main(["--miles-src", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rehearsal: FAILED: MILES_SRC=") and "train_async.py" in err


def test_command_json_round_trips():
    assert json.loads(json.dumps({"flags": ["--a", "b c"]}))["flags"][1] == "b c"


def _settings(*argv: str) -> dict[str, str]:
    args = parse_args(["--miles-src", "/m", *argv])
    inputs = {"model": Path("/mdl"), "prompts": Path("/p.jsonl")}
    return launcher_settings(args, Path("/m"), Path("/o"), inputs, "/py")


def test_each_flag_reaches_the_launcher_settings():
    base = _settings()
    assert base["ARM"] == "protect" and base["A"] == "0.5"
    assert base["NUM_ROLLOUT"] == "7" and base["SEED"] == "1"
    assert "STALENESS" not in base and "CENSUS_BUFFER" not in base
    assert base["HF_CHECKPOINT"] == "/mdl" and base["PROMPT_DATA"] == "/p.jsonl"
    assert base["OUTPUT_DIR"] == "/o/runs" and base["MILES_DIR"] == "/m"
    assert _settings("--a", "0.25")["A"] == "0.25"
    assert _settings("--steps", "3")["NUM_ROLLOUT"] == "4"
    assert _settings("--seed", "9")["SEED"] == "9"
    assert _settings("--staleness", "0")["STALENESS"] == "0"
    assert _settings("--extra-args", "--x 1")["EXTRA_ARGS"] == "--x 1"
    drop = _settings("--arm", "drop")
    assert drop["ARM"] == "drop" and "A" not in drop


def test_version_stride_defaults_to_k_plus_one_and_can_be_chosen():
    assert version_stride(None, ["--max-weight-staleness", "2"]) == 3
    assert version_stride(None, []) == 1
    assert version_stride(5, ["--max-weight-staleness", "2"]) == 5


def test_router_without_out_and_timeout_flags_are_read():
    args = parse_args(
        [
            "--miles-src",
            "/m",
            "--router",
            "sglang",
            "--without=--x",
            "--out",
            "/r",
            "--timeout",
            "9",
        ]
    )
    assert (args.router, args.without, args.out, args.timeout) == ("sglang", ["--x"], "/r", 9)
    assert parse_args(["--miles-src", "/m"]).out.startswith(str(ROOT / "runs" / "rehearsal"))


def test_make_rehearsal_passes_its_variables(tmp_path):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / ".stamp").write_text("")
    run = subprocess.run(
        [
            "make", "-n", "rehearsal", f"REHEARSAL_VENV={venv}", "MILES_SRC=/src", "ARM=drop",
            "STEPS=3", "REHEARSAL_ARGS=--router sglang",
        ],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    text = " ".join(run.stdout.replace("\\\n", " ").split())
    line = next(ln for ln in text.split(" && ") if "rescue.miles.rehearsal" in ln)
    assert f'{venv}/bin/python -m rescue.miles.rehearsal --arm "drop"' in line
    assert '--miles-src "/src"' in line and '--steps "3"' in line and "--router sglang" in line
    assert "--a " not in line
    with_a = subprocess.run(
        ["make", "-n", "rehearsal", f"REHEARSAL_VENV={venv}", "MILES_SRC=/src", "A=0.3"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert '--arm "protect" --a "0.3"' in " ".join(with_a.stdout.split())
    missing = subprocess.run(
        ["make", "rehearsal", f"REHEARSAL_VENV={venv}", "MILES_SRC="],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert missing.returncode == 2 and "set MILES_SRC" in missing.stdout
