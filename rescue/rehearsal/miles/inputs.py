"""What a rehearsal's runs read, built once per rehearsal (``shared``) and once per run
(``for_run``), for each launcher (``rescue.rehearsal.miles.launchers``).

Shared, in the rehearsal's ``inputs/`` folder (or the run folder of a single run):

- ``swe``: a tiny offline Qwen3 tokenizer that learned the agent's prompts and a tiny
  Qwen3 checkpoint drawn from the seed (``model/``); the prompt rows: the given
  ``--prompt-data`` (q3's validated subset) or three tiny tasks, each with the tiny
  repository's tests as its FAIL_TO_PASS and PASS_TO_PASS, plus one task whose image is
  missing (a sandbox fault before any model call);
- ``rlvr``: the taught model of ``rescue.rehearsal.tiny.singleturn`` (or ``--model``) and its
  weights as a Megatron checkpoint (``megatron/``); the prompt rows (``--prompt-data``, else the
  task's rows through ``rescue rlvr prepare``); the cap file (``--cap-file``, else
  ``rescue rlvr calibrate`` against the stand-in engine serving the taught model: the
  ``calibrate`` command of ``rescue.questions.rehearsal``);
- ``agent``: the games and their rows (``--prompt-data``, else ``make agent-prepare``'s
  script ``launch/agent_prepare.sh``) and the taught model of
  ``rescue.rehearsal.tiny.textgames`` (or ``--model``) and its weights as a Megatron checkpoint.

The taught models and the task rows are drawn from ``TEACH_SEED``, whatever the runs'
seeds: they stand for the pretrained checkpoint and the dataset, the same for every seed of
every arm. A shared folder given again (``--inputs``) is reused: what it already holds (the
model, the rows, the games, the cap) is not made again.

Per run, in the run folder: the stand-in docker's state with every task's image (``swe``)
and the empty ``ref/`` the SWE trainer starts from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rescue.rehearsal.miles.command import ROOT, RehearsalError
from rescue.rehearsal.standins import tasks as task_repos

TEMPLATE = "miles/utils/chat_template_utils/templates/qwen3_fixed.jinja"
#: The seed of the taught models and the task rows (module docstring).
TEACH_SEED = 1
#: The text games' set: one game per level, from this seed, levels 0 to 5 (level 0 wins in
#: four moves, level 1 in five, level 5 needs 19 to 24).
GAMES, GAME_SEED, GAME_LEVELS = 1, 0, "0,1,2,3,4,5"


def megatron_model_args(config: dict[str, Any]) -> str:
    """Megatron's architecture flags for a Qwen3 ``config.json`` (as Miles' model scripts
    write them for the family, ``scripts/models/qwen3-*.py``)."""
    rope_theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    args = [
        "--swiglu",
        f"--num-layers {config['num_hidden_layers']}",
        f"--hidden-size {config['hidden_size']}",
        f"--ffn-hidden-size {config['intermediate_size']}",
        f"--num-attention-heads {config['num_attention_heads']}",
        "--group-query-attention",
        f"--num-query-groups {config['num_key_value_heads']}",
        "--use-rotary-position-embeddings",
        "--disable-bias-linear",
        "--normalization RMSNorm",
        f"--norm-epsilon {config['rms_norm_eps']}",
        f"--rotary-base {int(rope_theta)}",
        f"--vocab-size {config['vocab_size']}",
        f"--kv-channels {config['head_dim']}",
        "--qk-layernorm",
    ]
    if not config.get("tie_word_embeddings", False):
        args.append("--untie-embeddings-and-output-weights")
    return " ".join(args)


def agent_prompts() -> tuple[str, ...]:
    """The SWE agent's prompt templates (mini-swe-agent's config the agent reads), so the
    tiny tokenizer learns them: the system prompt takes about 1.1k tokens instead of 3.2k."""
    import yaml
    from minisweagent.config import get_config_path

    from swe_smith_tasks.agent_settings import AgentSettings

    config = yaml.safe_load(get_config_path(AgentSettings().config).read_text()) or {}
    agent = config.get("agent", {})
    return tuple(str(agent[k]) for k in ("system_template", "instance_template") if k in agent)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(*argv: str, what: str) -> None:
    """``python -m rescue ARGV`` in this interpreter; a failure stops the rehearsal."""
    done = subprocess.run(
        [sys.executable, "-m", "rescue", *argv], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RehearsalError(f"{what}: {tail[0]}")


def swe(folder: Path, miles_src: Path, seed: int, prompt_data: str | None) -> dict[str, Any]:
    """The SWE launcher's shared inputs (module docstring)."""
    from rescue.rehearsal.tiny.policy import write_checkpoint
    from rescue.rehearsal.tiny.tokenizer import build_model_dir

    template = (miles_src / TEMPLATE).read_text()
    model = build_model_dir(folder / "model", template, vocab_size=2048, corpus=agent_prompts())
    write_checkpoint(model, seed)
    if prompt_data:
        given = _rows(Path(prompt_data))
        if not given:
            raise RehearsalError(f"--prompt-data={prompt_data}: no task row")
        rows = [{**r, "metadata": _stand_in(r["metadata"])} for r in given]
    else:
        rows = []
        for k in range(3):
            iid = f"{task_repos.INSTANCE_ID[:-4]}{k:04d}"
            metadata = task_repos.task_metadata(iid, f"{task_repos.IMAGE}.t{k}")
            rows.append({"prompt": f"Task {k}: {task_repos.PROBLEM}", "metadata": metadata})
    missing = task_repos.task_metadata(
        f"{task_repos.INSTANCE_ID[:-4]}9999", f"{task_repos.IMAGE}.gone"
    )
    rows.append({"prompt": f"Task 9: {task_repos.PROBLEM}", "metadata": missing})
    prompts = _write_rows(folder / "data" / "tasks.jsonl", rows)
    return {"model": model, "prompts": prompts}


def _stand_in(metadata: dict[str, Any]) -> dict[str, Any]:
    """A task row's metadata with the tiny repository's tests as the task's (its image is
    the tiny repository under the task's own id and image name)."""
    return {**metadata, "FAIL_TO_PASS": list(task_repos.F2P), "PASS_TO_PASS": list(task_repos.P2P)}


def rlvr(
    folder: Path, miles_src: Path, *, model: str | None, prompt_data: str | None,
    cap_file: str | None,
) -> dict[str, Any]:  # fmt: skip
    """The single-turn launcher's shared inputs (module docstring)."""
    from rescue.rehearsal.tiny import singleturn

    model_dir = Path(model) if model else folder / "model"
    if not (model_dir / "model.safetensors").is_file():
        singleturn.build(model_dir, (miles_src / TEMPLATE).read_text(), TEACH_SEED)
    megatron = megatron_copy(model_dir, folder / "megatron")
    prompts = Path(prompt_data) if prompt_data else folder / "data" / "prompts.jsonl"
    if not prompts.is_file():
        rows = singleturn.task_rows(40, TEACH_SEED)
        source = _write_rows(folder / "data" / "task.jsonl", rows)
        _cli("rlvr", "prepare", "--dataset", "gsm8k", "--source", str(source), "--out",
             str(prompts), what="rescue rlvr prepare")  # fmt: skip
    cap = Path(cap_file) if cap_file else folder / "cap.json"
    if not cap.is_file():
        calibrate(model_dir, prompts, cap, seed=TEACH_SEED)
    return {"model": model_dir, "megatron": megatron, "prompts": prompts, "cap_file": cap}


def calibrate(model_dir: Path, prompts: Path, out: Path, *, seed: int) -> None:
    """The rehearsal's calibration (``python -m rescue.questions.rehearsal calibrate``, the
    command q2's calibrate stage runs): ``rescue rlvr calibrate`` against a stand-in engine
    serving the taught model, so the rate is the model's own."""
    done = subprocess.run(
        [sys.executable, "-m", "rescue.questions.rehearsal", "calibrate", "--data",
         str(prompts), "--model", str(model_dir), "--out", str(out), "--seed", str(seed)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RehearsalError(f"calibration: {tail[0]}")


def agent(
    folder: Path, miles_src: Path, *, model: str | None, prompt_data: str | None
) -> dict[str, Any]:
    """The text-game launcher's shared inputs (module docstring)."""
    from rescue.rehearsal.tiny import textgames

    prompts = Path(prompt_data) if prompt_data else folder / "data" / "agent-cooking.jsonl"
    if not prompts.is_file():  # rescue agent prepare, as make agent-prepare runs it, + level 0
        _cli("agent", "prepare", "--env", "cooking", "--games-dir", str(folder / "games"),
             "--out", str(prompts), "--games", str(GAMES), "--seed", str(GAME_SEED),
             "--cap", _setting("agent", "CAP"), "--levels", GAME_LEVELS,
             what="rescue agent prepare")  # fmt: skip
    rows = _rows(prompts)
    model_dir = Path(model) if model else folder / "model"
    if not (model_dir / "model.safetensors").is_file():
        template = (miles_src / TEMPLATE).read_text()
        textgames.build(model_dir, template, rows, TEACH_SEED, cap=int(_setting("agent", "CAP")))
    megatron = megatron_copy(model_dir, folder / "megatron")
    levels = sorted({r["metadata"].get("difficulty") for r in rows}, key=str)
    return {"model": model_dir, "megatron": megatron, "prompts": prompts, "levels": levels}


def _setting(launcher: str, name: str) -> str:
    from rescue.rehearsal.miles.launchers import LAUNCHERS

    return next(v for k, v, _ in LAUNCHERS[launcher].settings if k == name)


def megatron_copy(model_dir: Path, target: Path) -> Path:
    """``target``: the model's weights as a Megatron checkpoint, written in the rehearsal's
    own folder (the model folder, another stage's output, is only read)."""
    from safetensors.torch import load_file

    from rescue.rehearsal.miles.checkpoint import write_megatron

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return write_megatron(target, load_file(str(Path(model_dir) / "model.safetensors")), config)


def for_run(launcher: str, run: Path, shared: dict[str, Any]) -> dict[str, Any]:
    """The run's own inputs (module docstring): the SWE docker state and empty ``ref/``."""
    out = dict(shared)
    if launcher != "swe":
        return out
    docker_root = task_repos.docker_state(run / "docker")
    out["docker_root"] = docker_root
    out["shim"] = task_repos.write_docker_shim(run / "bin", sys.executable)
    made: dict[str, str] = {}
    for row in _rows(shared["prompts"]):
        meta = row["metadata"]
        if meta["image"].endswith(".gone"):
            continue
        folder = task_repos.image_folder(docker_root / "images", meta["image"])
        if meta["image"] not in made:
            task_repos.make_task_image(docker_root / "images", meta["image"], meta["instance_id"])
            made[meta["image"]] = meta["instance_id"]
        else:  # tasks of one repository share its image: each has its own branch there
            subprocess.run(
                ["git", "branch", "-f", meta["instance_id"], made[meta["image"]]],
                cwd=folder, check=True, capture_output=True,
            )  # fmt: skip
    (run / "ref").mkdir(exist_ok=True)
    return out
