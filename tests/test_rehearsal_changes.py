"""The CPU-change table, its import hook and faults, and the driver's command rewriting (no
Miles needed)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rescue.rehearsal.miles import hook as hook_module
from rescue.rehearsal.miles.changes import CHANGES, FAULTS
from rescue.rehearsal.miles.command import (
    GPU_ONLY,
    NO_FUSION,
    cpu_flags,
    drop_option,
    launcher_command,
    option_values,
    set_option,
)
from rescue.rehearsal.miles.hook import Hook
from rescue.rehearsal.miles.run import (
    ARMS,
    SETTINGS,
    launcher_settings,
    main,
    megatron_model_args,
    parse_args,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_has_a_kind_and_a_reason_and_patches_name_their_module():
    assert {c.kind for c in CHANGES} <= {"argument", "patch", "probe"}
    assert {c.kind for c in FAULTS.values()} == {"fault"}
    assert all(c.module and c.apply for c in FAULTS.values())
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


def test_cpu_flags_remove_the_gpu_only_flags_and_add_the_cpu_ones():
    flags = [
        "--num-rollout", "7", "--attention-backend", "flash", "--optimizer-cpu-offload",
        "--use-precision-aware-optimizer", "--tensor-model-parallel-size", "1",
    ]  # fmt: skip
    out, removed = cpu_flags(flags, engine_port=1, router_port=2, session_port=3)
    assert removed == ["--attention-backend", "--optimizer-cpu-offload",
                       "--use-precision-aware-optimizer"]  # fmt: skip
    assert set(removed) <= set(GPU_ONLY)
    assert "flash" not in out and option_values(out, "--num-rollout") == ["7"]
    assert option_values(out, "--tensor-model-parallel-size") == ["1"]
    assert option_values(out, "--train-backend") == ["megatron"]
    assert option_values(out, "--transformer-impl") == ["local"]
    assert all(option_values(out, name) == [] for name in NO_FUSION)
    assert option_values(out, "--debug-rollout-only") is None  # Miles trains
    assert option_values(out, "--rollout-external-engine-addrs") == ["127.0.0.1:1"]
    assert option_values(out, "--use-miles-router") == []
    assert option_values(out, "--distributed-backend") == ["gloo"]
    assert option_values(out, "--sglang-router-port") == ["2"]
    assert option_values(out, "--session-server-port") == ["3"]
    sglang, _ = cpu_flags(flags, engine_port=1, router_port=2, session_port=3, router="sglang")
    assert option_values(sglang, "--worker-urls") == ["http://127.0.0.1:1"]
    assert option_values(sglang, "--use-miles-router") is None


def test_the_tiny_models_megatron_flags_are_read_from_its_config():
    config = {
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 1000000.0}, "vocab_size": 1304, "head_dim": 32,
        "tie_word_embeddings": True,
    }  # fmt: skip
    args = megatron_model_args(config).split()
    assert option_values(args, "--num-layers") == ["2"]
    assert option_values(args, "--num-query-groups") == ["1"]
    assert option_values(args, "--rotary-base") == ["1000000"]
    assert option_values(args, "--vocab-size") == ["1304"]
    assert option_values(args, "--kv-channels") == ["32"]
    assert "--untie-embeddings-and-output-weights" not in args
    untied = megatron_model_args({**config, "tie_word_embeddings": False, "rope_theta": 1e4})
    assert "--untie-embeddings-and-output-weights" in untied and "--rotary-base 10000" in untied


def test_the_hook_patches_a_module_right_after_its_first_import(tmp_path, monkeypatch):
    (tmp_path / "rehearsal_target.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def patch(module: types.ModuleType) -> None:
        seen.append(module.f())
        module.f = lambda: 2

    hook = Hook({"rehearsal_target": [patch]})
    sys.meta_path.insert(0, hook)
    try:
        module = importlib.import_module("rehearsal_target")
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("rehearsal_target", None)
    assert seen == [1] and module.f() == 2


def test_a_missing_module_miles_imports_is_a_stand_in_whose_names_fail_when_used(monkeypatch):
    monkeypatch.setattr(hook_module, "MISSING", ("rehearsal_missing_pkg.engine",))
    hook = Hook({})
    sys.meta_path.insert(0, hook)
    try:
        from rehearsal_missing_pkg.engine import TransferEngine  # type: ignore[import-not-found]
    finally:
        sys.meta_path.remove(hook)
        for name in [n for n in sys.modules if n.startswith("rehearsal_missing_pkg")]:
            sys.modules.pop(name)
    with pytest.raises(RuntimeError, match=r"rehearsal_missing_pkg\.engine is not installed"):
        TransferEngine()


def test_the_placeholder_package_fails_when_used_and_only_once_switched_on(monkeypatch):
    monkeypatch.setattr(hook_module, "PLACEHOLDERS", ("rehearsal_absent_pkg",))
    hook = Hook({})
    sys.meta_path.insert(0, hook)
    try:
        monkeypatch.setattr(hook_module, "_placeholders", False)
        with pytest.raises(ImportError):
            importlib.import_module("rehearsal_absent_pkg")
        monkeypatch.setattr(hook_module, "_placeholders", True)
        transforms = importlib.import_module("rehearsal_absent_pkg.transforms")
        mode = transforms.InterpolationMode.BICUBIC  # import-time use works
        with pytest.raises(
            RuntimeError, match=r"rehearsal_absent_pkg\.transforms is not installed"
        ):
            transforms.Compose([mode])
    finally:
        sys.meta_path.remove(hook)
        for name in [n for n in sys.modules if n.startswith("rehearsal_absent_pkg")]:
            sys.modules.pop(name)


def test_sitecustomize_installs_the_hook_only_in_a_rehearsal(tmp_path):
    site = ROOT / "rescue" / "rehearsal" / "miles" / "site"
    code = "import sys; print(any(type(f).__name__ == 'Hook' for f in sys.meta_path))"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    env.pop("RESCUE_REHEARSAL_DIR", None)
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    env["RESCUE_REHEARSAL_DIR"] = str(tmp_path)
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert off.stdout.strip() == "False" and on.stdout.strip() == "True"


def test_a_named_fault_is_installed_and_an_unknown_one_refused(tmp_path):
    site = ROOT / "rescue" / "rehearsal" / "miles" / "site"
    code = (
        "import sys; h = next(f for f in sys.meta_path if type(f).__name__ == 'Hook'); "
        "print(len(h.patches.get('rescue.miles.loss', [])))"
    )
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
           "RESCUE_REHEARSAL_DIR": str(tmp_path)}  # fmt: skip
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    env["RESCUE_REHEARSAL_FAULT"] = "turn-channel"
    broken = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert plain.stdout.strip() == "0" and broken.stdout.strip() == "1"
    env["RESCUE_REHEARSAL_FAULT"] = "gremlins"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "RESCUE_REHEARSAL_FAULT='gremlins'; allowed: turn-channel, missing-head" in bad.stderr


def test_the_turn_channel_fault_makes_the_loss_train_the_scalar_part_only():
    from rescue.rehearsal.miles.patches import fault_turn_channel

    module = types.SimpleNamespace(trained_advantages=lambda batch: "with the channel")
    fault_turn_channel(module)
    assert module.trained_advantages({"advantages": "scalar only"}) == "scalar only"


def test_the_missing_head_fault_drops_the_first_trained_positions_head():
    import numpy as np

    from rescue.rehearsal.miles.patches import fault_missing_head

    class Trainer:
        def rows(self, *args):
            return {"ids": np.zeros((3, 2)), "has": np.array([False, True, True])}

    module = types.SimpleNamespace(Trainer=Trainer)
    fault_missing_head(module)
    assert Trainer().rows().get("has").tolist() == [False, False, True]


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
    from rescue.rehearsal.miles.command import RehearsalError

    with pytest.raises(RehearsalError, match="ARM="):
        launcher_command({"ARM": "sometimes", "MILES_DIR": str(tmp_path)})


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--arm", "keep"], "--arm"),
        (["--router", "nginx"], "--router"),
        (["--steps", "0"], "--steps"),
        (["--offpolicy", "ppo"], "--offpolicy"),
        (["--fault", "gremlins"], "--fault"),
        (["--timeout", "0"], "--timeout"),
        (["--kill-at", "0"], "--kill-at=0; allowed: a step from 1 to --steps=3"),
        (["--kill-at", "1", "--launcher", "rlvr"], "--kill-at applies to --launcher swe"),
        (["--kill-at", "1", "--arm", "protect,pace"], "--kill-at kills one run"),
        (["--kill-at", "1", "--seeds", "2"], "--kill-at kills one run"),
        (["--reference", "somewhere"], "--reference applies with --kill-at"),
        (["--kill-at", "1", "--reference", "nowhere"], "--reference=nowhere: no report.json"),
        (["--kill-engine-at", "4"], "--kill-engine-at=4; allowed: a step from 0 to --steps=3"),
        (["--kill-engine-at", "0", "--kill-at", "1"], "--kill-engine-at breaks one run"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path, capsys, argv, named):
    sources = fake_sources(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([*sources, *argv])
    assert e.value.code == 2 and named in capsys.readouterr().err


#: A stand-in entry point: Miles' own end in this block, which the rehearsal looks for.
ENTRY = 'if __name__ == "__main__":\n    pass\n'


def fake_sources(tmp_path: Path) -> list[str]:
    (tmp_path / "miles").mkdir(exist_ok=True)
    (tmp_path / "miles" / "train_async.py").write_text(ENTRY)
    (tmp_path / "miles" / "train.py").write_text(ENTRY)
    (tmp_path / "megatron" / "megatron" / "training").mkdir(parents=True, exist_ok=True)
    return ["--miles-src", str(tmp_path / "miles"), "--megatron-src", str(tmp_path / "megatron")]


@pytest.mark.parametrize("entry", ["train_async.py", "train.py"])
def test_an_emptied_entry_point_is_refused_before_anything_runs(tmp_path, capsys, entry):
    sources = fake_sources(tmp_path)
    (tmp_path / "miles" / entry).write_text("")  # it would run, print nothing and succeed
    launcher = [] if entry == "train_async.py" else ["--launcher", "rlvr"]
    with pytest.raises(SystemExit) as e:
        main([*sources, *launcher, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"{entry} has no __main__ block (size 0 bytes)" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("which", ["--miles-src", "--megatron-src"])
def test_a_missing_checkout_is_one_line_naming_its_flag(tmp_path, capsys, which):
    sources = fake_sources(tmp_path)
    sources[sources.index(which) + 1] = str(tmp_path / "nothing")
    with pytest.raises(SystemExit) as e:
        main([*sources, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"{which}={tmp_path / 'nothing'}" in err


def test_command_json_round_trips():
    assert json.loads(json.dumps({"flags": ["--a", "b c"]}))["flags"][1] == "b c"


def _settings(tmp_path: Path, *argv: str) -> dict[str, str]:
    args = parse_args([*fake_sources(tmp_path), *argv])
    model = tmp_path / "mdl"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "vocab_size": 600, "head_dim": 32, "tie_word_embeddings": True,
    }))  # fmt: skip
    inputs = {"model": model, "prompts": Path("/p.jsonl")}
    return launcher_settings(args, Path("/m"), Path("/meg"), Path("/o"), inputs)


def test_each_flag_reaches_the_launcher_settings(tmp_path):
    base = _settings(tmp_path)
    assert base["ARM"] == "protect" and base["A"] == "0.5" and base["OFFPOLICY"] == "tis-sc"
    assert base["NUM_ROLLOUT"] == "4" and base["SEED"] == "1" and base["STALENESS"] == "0"
    assert base["HF_CHECKPOINT"] == str(tmp_path / "mdl") and base["PROMPT_DATA"] == "/p.jsonl"
    assert base["OUTPUT_DIR"] == "/o/runs" and base["MILES_DIR"] == "/m"
    assert base["MEGATRON_DIR"] == "/meg" and base["REF_LOAD"] == "/o/ref"
    assert "--num-layers 2" in base["MODEL_ARGS"]
    assert _settings(tmp_path, "--a", "0.25")["A"] == "0.25"
    assert _settings(tmp_path, "--steps", "5")["NUM_ROLLOUT"] == "6"
    assert _settings(tmp_path, "--seed", "9")["SEED"] == "9"
    assert _settings(tmp_path, "--staleness", "2")["STALENESS"] == "2"
    assert _settings(tmp_path, "--arm", "pace")["STALENESS"] == "1"
    assert _settings(tmp_path, "--offpolicy", "tis")["OFFPOLICY"] == "tis"
    extra = _settings(tmp_path, "--extra-args", "--x 1")["EXTRA_ARGS"]
    assert extra == "--async-max-concurrent-samples 16 --x 1"
    drop = _settings(tmp_path, "--arm", "drop")
    assert drop["ARM"] == "drop" and "A" not in drop
    assert drop["EXTRA_ARGS"] == "--async-max-concurrent-samples 12"
    assert drop["AGENT_CONCURRENCY"] == "12"
    assert set(ARMS) == {"drop", "never-drop", "protect", "pace", "zero", "mask", "matched",
                         "step-control", "drgrpo-mask", "survivor", "turn"}  # fmt: skip


def test_a_killed_run_checkpoints_before_the_kill_and_resumes_through_the_launcher(tmp_path):
    from rescue.rehearsal.miles.run import launcher_settings, plan

    args = parse_args([*fake_sources(tmp_path), "--kill-at", "2", "--steps", "4"])
    inputs = {"model": str(tmp_path / "m"), "prompts": "p"}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"num_hidden_layers": 2,
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 100, "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "head_dim": 32}))  # fmt: skip
    [run] = plan(args, tmp_path / "out")
    first = launcher_settings(args, Path("/m"), Path("/g"), Path("/o"), inputs, run)
    assert first["SAVE_INTERVAL"] == "2" and "RESUME" not in first
    run.life = 2
    again = launcher_settings(args, Path("/m"), Path("/g"), Path("/o"), inputs, run)
    assert again["RESUME"] == "1" and again["SAVE_INTERVAL"] == "2"
    dead = parse_args([*fake_sources(tmp_path), "--kill-engine-at", "0"])
    settings = launcher_settings(dead, Path("/m"), Path("/g"), Path("/o"), inputs, run)
    assert settings["WATCHDOG_WINDOW"] == "4"
    assert settings["AGENT_ENV"] == "RESCUE_SWE_ENDPOINT_PATIENCE=20"


def test_router_without_out_and_timeout_flags_are_read(tmp_path):
    sources = fake_sources(tmp_path)
    args = parse_args([*sources, "--router", "sglang", "--without=--x", "--out", "/r",
                       "--timeout", "9", "--fault", "missing-head"])  # fmt: skip
    assert (args.router, args.without, args.out, args.timeout) == ("sglang", ["--x"], "/r", 9)
    assert args.fault == "missing-head"
    assert parse_args(sources).out.startswith(str(ROOT / "runs" / "rehearsal"))


def _sources(tmp_path: Path) -> tuple[Path, Path]:
    """Folders standing in for the Miles and Megatron-LM sources (make checks they are
    folders)."""
    src, meg = tmp_path / "src", tmp_path / "meg"
    src.mkdir()
    meg.mkdir()
    return src, meg


def test_make_rehearsal_passes_its_variables(tmp_path):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / ".stamp").write_text("")
    src, meg = _sources(tmp_path)

    def make(*assignments: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["make", "-n", "rehearsal", f"REHEARSAL_VENV={venv}", *assignments],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip

    run = make(f"MILES_SRC={src}", f"MEGATRON_SRC={meg}", "ARM=drop", "STEPS=5", "OFFPOLICY=tis",
               "REHEARSAL_ARGS=--router sglang")  # fmt: skip
    text = " ".join(run.stdout.replace("\\\n", " ").split())
    assert f'{venv}/bin/python -m rescue.rehearsal.miles --launcher "swe" --arm "drop"' in text
    assert f'--miles-src "{src}"' in text and f'--megatron-src "{meg}"' in text
    assert '--steps "5"' in text and '--offpolicy "tis"' in text and "--router sglang" in text
    assert "--a " not in text
    with_a = make(f"MILES_SRC={src}", f"MEGATRON_SRC={meg}", "A=0.3")
    assert '--arm "protect" --a "0.3"' in " ".join(with_a.stdout.split())

    def joined(result: subprocess.CompletedProcess) -> str:
        return " ".join(result.stdout.replace("\\\n", " ").split())

    assert '--launcher "rlvr" --arm "zero"' in joined(
        make(f"MILES_SRC={src}", f"MEGATRON_SRC={meg}", "LAUNCHER=rlvr")
    )
    agent = make(f"MILES_SRC={src}", f"MEGATRON_SRC={meg}", "LAUNCHER=agent", "ARM=turn")
    assert '--launcher "agent" --arm "turn"' in joined(agent)
    for missing, named in (("MILES_SRC=", "set MILES_SRC"), ("MEGATRON_SRC=", "set MEGATRON_SRC")):
        given = [
            a
            for a in (f"MILES_SRC={src}", f"MEGATRON_SRC={meg}")
            if a.split("=")[0] != missing[:-1]
        ]
        done = subprocess.run(
            ["make", "rehearsal", f"REHEARSAL_VENV={venv}", *given, missing],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 2 and named in done.stdout + done.stderr


def test_make_rehearsal_test_runs_the_markers_it_is_given(tmp_path):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / ".stamp").write_text("")
    src, meg = _sources(tmp_path)
    args = ["make", "-n", "rehearsal-test", f"REHEARSAL_VENV={venv}", f"MILES_SRC={src}",
            f"MEGATRON_SRC={meg}"]  # fmt: skip
    default = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    assert '-m "rehearsal_ci"' in default.stdout and f'MEGATRON_SRC="{meg}"' in default.stdout
    every = subprocess.run([*args, "REHEARSAL_MARKERS=rehearsal"], cwd=ROOT, capture_output=True,
                           text=True)  # fmt: skip
    assert '-m "rehearsal"' in every.stdout


def _miles_with_both_entries(tmp_path: Path) -> Path:
    miles = tmp_path / "miles"
    (miles / "scripts" / "models").mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "train_async.py"):
        (miles / name).write_text("")
    return miles


@pytest.mark.parametrize(
    ("launcher", "env", "entry"),
    [
        ("rlvr", {"ARM": "mask", "CAP": "32"}, "train.py"),
        ("agent", {"ARM": "turn", "ENV": "cooking"}, "train.py"),
    ],
)
def test_the_single_turn_and_text_game_launchers_drop_colocate_for_a_broadcast(
    tmp_path, launcher, env, entry
):
    from rescue.rehearsal.miles.command import launcher_entry
    from rescue.rehearsal.miles.launchers import LAUNCHERS

    spec = LAUNCHERS[launcher]
    miles = _miles_with_both_entries(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    settings = {
        **{k: v.format(out=tmp_path, model=tmp_path / "m", megatron=tmp_path / "mg")
           for k, v, _ in spec.settings},
        **env, "MILES_DIR": str(miles), "MODEL_ARGS": "--num-layers 2",
        "OUTPUT_DIR": str(tmp_path / "out"), "PROMPT_DATA": str(prompts),
        "JOB_PYTHON": sys.executable,
    }  # fmt: skip
    _, got, flags = launcher_entry(settings, spec.script)
    assert got == entry == spec.entry
    assert option_values(flags, "--colocate") == []
    assert option_values(flags, "--ref-load") == [str(tmp_path / "mg")]
    cpu, removed = cpu_flags(flags, engine_port=1, router_port=2, session_port=3)
    assert "--colocate" in removed and option_values(cpu, "--colocate") is None
    assert option_values(cpu, "--rollout-num-gpus") == ["1"]
    assert option_values(cpu, "--num-gpus-per-node") == ["2"]
    assert option_values(cpu, "--rollout-external-engine-addrs") == ["127.0.0.1:1"]
    assert any("--colocate" in c.what for c in CHANGES if c.kind == "argument")


def test_the_swe_launcher_keeps_its_flags_without_colocate(tmp_path):
    flags = ["--num-gpus-per-node", "2", "--rollout-num-gpus", "1"]
    cpu, removed = cpu_flags(flags, engine_port=1, router_port=2, session_port=3)
    assert "--colocate" not in removed and option_values(cpu, "--rollout-num-gpus") == ["1"]


def test_each_launcher_has_its_arms_offpolicy_and_defaults(tmp_path):
    sources = fake_sources(tmp_path)
    rlvr = parse_args([*sources, "--launcher", "rlvr"])
    assert (rlvr.arm, rlvr.a, rlvr.offpolicy) == ("zero", None, "none")
    agent = parse_args([*sources, "--launcher", "agent", "--arm", "turn"])
    assert (agent.arm, agent.offpolicy) == ("turn", "none")
    swe = parse_args(sources)
    assert (swe.arm, swe.a, swe.offpolicy) == ("protect", "0.5", "tis-sc")
    many = parse_args([*sources, "--arm", "drop,protect:0.25,protect", "--seeds", "2"])
    assert many.arm_list == [("drop", None), ("protect", "0.25"), ("protect", "0.5")]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--launcher", "slurm"], "--launcher"),
        (["--launcher", "rlvr", "--arm", "protect"], "--arm"),
        (["--launcher", "agent", "--offpolicy", "tis"], "--offpolicy"),
        (["--arm", "drop:0.5"], "--arm"),
        (["--arm", "drop", "--a", "0.5"], "--a"),
        (["--parallel", "0"], "--parallel"),
        (["--inputs", "x"], "--inputs"),
        (["--launcher", "rlvr", "--cap-file", "/no/such/cap.json"], "--cap-file"),
    ],
)
def test_bad_launcher_flags_are_one_line_naming_the_flag(tmp_path, capsys, argv, named):
    sources = fake_sources(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([*sources, *argv])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and named in err


def test_several_runs_get_a_folder_each_named_by_arm_and_seed(tmp_path):
    from rescue.rehearsal.miles.run import plan

    sources = fake_sources(tmp_path)
    one = parse_args(sources)
    assert [(r.name, r.folder) for r in plan(one, tmp_path)] == [("protect-a0.5-seed1", tmp_path)]
    args = parse_args([*sources, "--arm", "drop,protect:0.25", "--seeds", "2"])
    runs = plan(args, tmp_path)
    assert [r.name for r in runs] == ["drop-seed1", "drop-seed2", "protect-a0.25-seed1",
                                      "protect-a0.25-seed2"]  # fmt: skip
    assert all(r.folder == tmp_path / r.name for r in runs)


def test_the_single_turn_settings_start_the_trainer_from_the_taught_model(tmp_path):
    sources = fake_sources(tmp_path)
    args = parse_args([*sources, "--launcher", "rlvr", "--arm", "mask", "--steps", "2"])
    model = tmp_path / "mdl"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "vocab_size": 600, "head_dim": 32, "tie_word_embeddings": True,
    }))  # fmt: skip
    inputs = {"model": model, "megatron": tmp_path / "mg", "prompts": Path("/p.jsonl"),
              "cap_file": Path("/cap.json")}  # fmt: skip
    s = launcher_settings(args, Path("/m"), Path("/meg"), Path("/o"), inputs)
    assert s["REF_LOAD"] == str(tmp_path / "mg") and s["HF_CHECKPOINT"] == str(model)
    assert s["CAP_FILE"] == "/cap.json" and s["OFFPOLICY"] == "none" and s["ARM"] == "mask"
    assert s["NUM_ROLLOUT"] == "3" and "STALENESS" not in s and "A" not in s
    agent = parse_args([*sources, "--launcher", "agent", "--arm", "zero"])
    t = launcher_settings(agent, Path("/m"), Path("/meg"), Path("/o"), inputs)
    assert "OFFPOLICY" not in t and t["ENV"] == "cooking" and t["CAP"] == "24"


def test_survivors_are_the_run_folders_processes_and_those_of_its_runs(tmp_path):
    from rescue.rehearsal.verdict.processes import survivors

    pytest.importorskip("psutil")
    out = tmp_path / "batch"
    envs = [str(out), str(out / "zero-seed1"), str(tmp_path / "batch-other")]
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         env={**os.environ, "RESCUE_REHEARSAL_DIR": e})
        for e in envs
    ]  # fmt: skip
    try:
        found = {p.pid for p in survivors(out)}
        assert found == {procs[0].pid, procs[1].pid}
        assert {p.pid for p in survivors(out / "zero-seed1")} == {procs[1].pid}
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def finish_calls(monkeypatch) -> list[str]:
    """A stand-in for Miles' ``tracking.finish_tracking`` that records each call."""
    calls: list[str] = []
    tracking = types.ModuleType("miles.utils.tracking_utils.tracking")
    tracking.finish_tracking = lambda: calls.append("finish")
    for name in ("miles", "miles.utils", "miles.utils.tracking_utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "miles.utils.tracking_utils.tracking", tracking)
    return calls


def test_the_rollout_manager_finishes_its_tracking_when_disposed(finish_calls):
    """Miles' rollout manager never finishes its wandb run: the rehearsal's patch finishes it
    after Miles' own dispose, so the last steps' census rows reach the run."""
    from rescue.rehearsal.miles.patches import finish_rollout_tracking

    calls = finish_calls

    class RolloutManager:
        def dispose(self):
            calls.append("dispose")
            raise RuntimeError("a dispose step failed")

    class Modified(RolloutManager):  # Ray's subclass, with the methods copied into it
        dispose = RolloutManager.dispose

    class ActorClass:  # what @ray.remote makes of the class
        __ray_actor_class__ = RolloutManager
        __ray_metadata__ = types.SimpleNamespace(modified_class=Modified)

    finish_rollout_tracking(types.SimpleNamespace(RolloutManager=ActorClass))
    for cls in (RolloutManager, Modified):
        calls.clear()
        with pytest.raises(RuntimeError, match="a dispose step failed"):
            cls().dispose()
        assert calls == ["dispose", "finish"]  # finished even when Miles' own dispose raised
    assert any(c.module == "miles.ray.rollout.rollout_manager" for c in CHANGES)


def test_the_train_actor_finishes_its_tracking_after_the_last_rollouts_update(finish_calls):
    """Miles' train actor never finishes its wandb run (a rehearsal of train.py lost the last
    2 of 4 steps' train/* rows): the patch finishes it after the update that follows the
    last rollout, and not before."""
    from rescue.rehearsal.miles.patches import finish_train_tracking

    calls = finish_calls

    class MegatronTrainRayActor:
        args = types.SimpleNamespace(num_rollout=3)

        def train(self, rollout_id):
            self._last_rollout_id = rollout_id

        def update_weights(self, info):
            calls.append(f"update {self._last_rollout_id}")
            return info

    finish_train_tracking(types.SimpleNamespace(MegatronTrainRayActor=MegatronTrainRayActor))
    actor = MegatronTrainRayActor()
    for rollout_id in range(3):
        actor.train(rollout_id)
        assert actor.update_weights(info="engines") == "engines"
    assert calls == ["update 0", "update 1", "update 2", "finish"]
    assert any(c.module == "miles.backends.megatron_utils.actor" for c in CHANGES)
