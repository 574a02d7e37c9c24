"""The pilot samples as training samples: one set of settings, the same request at SGLang.

Training's request is built by Miles' own code from the launcher's flags (parsed by Miles'
parser): ``compute_sampling_params`` and ``build_chat_request_kwargs``, sent by the agent's
model (``endpoint.litellm_model``), then changed by Miles' session server as
``session/core.py`` ``prepare_chat_request`` does (lines 186-205: ``no_stop_trim`` False,
the family's ``chat_template_kwargs`` as Miles resolves them, ``logprobs`` and
``return_meta_info`` on). The pilot's request is ``rescue swe pilot``'s, from the pilot
launcher's command, through the same model. Both bodies are captured on the wire.
"""

from __future__ import annotations

import argparse
import json
import os

import pytest
import sglang_chat_request
from launch_env import bin_dir as bin_dir  # a fixture
from launch_env import command_lines, dry_run, flag_dict, launch, submitted
from launch_env import miles_dir as miles_dir  # a fixture
from swe_stubs import ScriptedOpenAI

from swe_smith_tasks import cli as swe_cli
from swe_smith_tasks.sampling import Sampling, check_server

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

#: Keys Miles' session server adds that do not change what is sampled.
SESSION_ONLY = {"logprobs", "return_meta_info"}
SETTINGS = [
    {},
    # a truncated distribution: TIS alone (score centering refuses top_p < 1 and top_k > 0)
    {
        "TEMPERATURE": "0.7",
        "TOP_P": "0.95",
        "TOP_K": "20",
        "MAX_RESPONSE_LEN": "4096",
        "OFFPOLICY": "tis",
    },
]


def sent_body(request_kwargs: dict) -> dict:
    """The JSON body the agent's model sends for ``request_kwargs`` (one request)."""
    pytest.importorskip("minisweagent")
    from swe_smith_tasks.endpoint import litellm_model

    server = ScriptedOpenAI([{"text": "done"}])
    try:
        model = litellm_model(
            base_url=server.base_url,
            model_name="m",
            request_kwargs=request_kwargs,
            timeout_s=30,
            patience_s=1,
        )
        model._query([{"role": "user", "content": "hi"}])
    finally:
        server.close()
    (body,) = server.requests
    return {k: v for k, v in body.items() if k not in ("messages", "tools", "model")}


def miles_training_body(flags: dict[str, list[str]]) -> dict:
    """What SGLang receives in training for these train_async.py flags (module docstring)."""
    from framework_args import miles_parser

    words = [w for flag, values in flags.items() for w in (flag, *values)]
    parser = miles_parser(words)
    args, _ = parser.parse_known_args(words)
    sglang_chat_request.install()
    from miles.rollout.generate_hub.agentic_tool_call import build_chat_request_kwargs
    from miles.rollout.inference_rollout.inference_rollout_common import compute_sampling_params
    from miles.utils.chat_template_utils import resolve_fixed_chat_template
    from miles.utils.chat_template_utils.tito_tokenizer import TITOTokenizerType

    sampling = compute_sampling_params(
        args,
        temperature=args.rollout_temperature,
        top_p=args.rollout_top_p,
        top_k=args.rollout_top_k,
        max_new_tokens=args.rollout_max_response_len,
    )
    body = sent_body(build_chat_request_kwargs(sampling))
    _, family_kwargs = resolve_fixed_chat_template(TITOTokenizerType(args.tito_model))
    body.update(no_stop_trim=False, chat_template_kwargs=dict(family_kwargs))
    body.update(logprobs=True, return_meta_info=True)
    return body


def pilot_body(stdout: str) -> dict:
    (cmd,) = [w for w in command_lines(stdout) if "pilot" in w]
    parser = argparse.ArgumentParser()
    swe_cli.configure(parser)
    args = parser.parse_args(cmd[cmd.index("swe") + 1 :])
    return sent_body(swe_cli.pilot_sampling(args).request_kwargs())


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "custom"])
def test_the_pilot_sends_what_miles_sends_for_the_same_settings(settings, bin_dir):
    from miles_env import require_miles

    miles_src = require_miles()
    train, _, _ = submitted(dry_run("drop", bin_dir, miles_src, **settings).stdout)
    result = launch("pilot.sh", bin_dir, miles_src, DRY_RUN="1", PILOT_TASKS="5", **settings)
    assert result.returncode == 0, result.stderr
    pilot = pilot_body(result.stdout)
    training = miles_training_body(train)
    assert {k: v for k, v in training.items() if k not in SESSION_ONLY} == pilot
    assert pilot["temperature"] == float(settings.get("TEMPERATURE", 1.0))
    assert pilot["top_k"] == int(settings.get("TOP_K", -1))
    assert pilot["max_tokens"] == int(settings.get("MAX_RESPONSE_LEN", 8192))
    assert pilot["chat_template_kwargs"] == {"clear_thinking": False}
    # and neither server fills what the request omits from the checkpoint
    assert train["--sglang-sampling-defaults"] == ["openai"]
    (server,) = [w for w in command_lines(result.stdout) if "sglang.launch_server" in w]
    assert flag_dict(server[server.index("sglang.launch_server") + 1 :])["--sampling-defaults"] == [
        "openai"
    ]


def test_the_pilot_launcher_checks_the_sampling_defaults_and_pulls_first(bin_dir, miles_dir):
    result = launch(
        "pilot.sh", bin_dir, miles_dir, DRY_RUN="1", PILOT_TASKS="5", TOP_P="0.9", OFFPOLICY="tis"
    )
    assert result.returncode == 0, result.stderr
    lines = command_lines(result.stdout)
    steps = [
        next(w for w in ("pull", "probe", "pilot") if w in line)
        for line in lines
        if {"pull", "probe", "pilot"} & set(line)
    ]
    assert steps == ["pull", "probe", "pilot"]
    (probe,) = [w for w in lines if "probe" in w]
    assert "--check-sampling" in probe
    (cmd,) = [w for w in lines if "pilot" in w]
    flags = flag_dict(cmd[cmd.index("pilot") + 1 :])
    assert flags["--top-p"] == ["0.9"] and flags["--max-infra-fraction"] == ["0.05"]
    assert "--skip-sampling-check" not in flags
    assert (
        launch(
            "pilot.sh", bin_dir, miles_dir, DRY_RUN="1", PILOT_TASKS="5", PILOT_PULL="0"
        ).stdout.count(" pull ")
        == 0
    )


def test_the_request_carries_every_setting_and_the_servers_defaults_are_checked():
    s = Sampling(temperature=0.6, top_p=0.9, top_k=5, max_tokens=100, chat_template_kwargs={"x": 1})
    assert s.request_kwargs() == {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 5,
        "max_tokens": 100,
        "skip_special_tokens": False,
        "no_stop_trim": False,
        "chat_template_kwargs": {"x": 1},
    }
    assert check_server({"sampling_defaults": "openai", "preferred_sampling_params": None}) == []
    (problem,) = check_server({"sampling_defaults": "model"})
    assert "--sampling-defaults openai" in problem and "generation_config.json" in problem
    assert json.dumps(Sampling().request_kwargs())  # plain JSON
