"""The SWE agent function end to end on a tiny task repository, without a Docker daemon.

Each trial runs the real ``swe_smith_tasks.agent.run``: mini-swe-agent's DefaultAgent with
its LitellmModel against a scripted OpenAI-compatible server on loopback, in either
mini-swe-agent's LocalEnvironment or its DockerEnvironment driving the stand-in docker
executable (``rescue/rehearsal/standins/docker.py``), then grading in a fresh container.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("minisweagent")
pytest.importorskip("swesmith")

from swe_stubs import (
    FIX,
    IMAGE,
    MAKE_PATCH,
    METADATA,
    PROBLEM,
    RUN_TESTS,
    SUBMIT,
    WRONG_FIX,
    ScriptedOpenAI,
    docker_calls,
    install_fake_docker,
    live_containers,
    make_task_image,
)

from rescue.outcomes import Outcome, classify
from swe_smith_tasks import agent
from swe_smith_tasks.agent import AgentSettings, reward_func
from swe_smith_tasks.sandbox import CONTAINER_PREFIX, DockerContainer, checkout_task

FIX_SCRIPT = [{"command": c} for c in (FIX, RUN_TESTS, MAKE_PATCH, SUBMIT)]
WRONG_SCRIPT = [{"command": c} for c in (WRONG_FIX, MAKE_PATCH, SUBMIT)]
# Small timeouts keep the stall test short; their order is what run() requires. A failing
# endpoint is given up on after a second.
FAST = {
    "command_timeout_s": 20,
    "request_timeout_s": 20,
    "start_timeout_s": 20,
    "endpoint_patience_s": 1,
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea"))
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the task repo's own pytest runs
    # The graders' test command runs ``pytest`` from PATH, as the image's conda env would.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def docker(tmp_path, monkeypatch):
    shim, root = install_fake_docker(tmp_path, monkeypatch)
    make_task_image(root / "images")
    return SimpleNamespace(shim=shim, root=root)


@pytest.fixture
def local_images(tmp_path):
    make_task_image(tmp_path / "images")
    return str(tmp_path / "images")


def play(script, settings, *, metadata=METADATA, request_kwargs=None, base_url=None):
    server = ScriptedOpenAI(script)
    try:
        return asyncio.run(
            agent.run(
                base_url or server.base_url,
                PROBLEM,
                request_kwargs or {},
                dict(metadata),
                settings=settings,
            )
        ), server
    finally:
        server.close()


def test_submitted_fix_is_solved_through_the_docker_code_path(docker):
    settings = AgentSettings(
        docker_executable=docker.shim, docker_run_args=("--cpus", "2"), model_name="qwen", **FAST
    )
    result, server = play(
        FIX_SCRIPT, settings, request_kwargs={"temperature": 0.7, "max_tokens": 256, "top_k": 5}
    )
    assert result["outcome"] == Outcome.SOLVED.value
    assert (result["exit_status"], result["reward"], result["resolved"]) == ("Submitted", 1.0, True)
    assert result["turns"] == 4 and result["agent_metrics"]["turns"] == 4
    assert result["eval_report"]["f2p_passed"] == 1 and result["eval_report"]["p2p_passed"] == 1
    assert result["ran_repo_tests"] and result["ran_tests_after_last_edit"]
    assert result["n_test_runs"] == 1
    assert {"sandbox_s", "agent_s", "grade_s", "queue_s", "tool_s"} <= set(result["timings"])
    # Sampling parameters reach the endpoint: OpenAI ones as such, SGLang ones in the body too.
    assert server.requests[0]["temperature"] == 0.7 and server.requests[0]["top_k"] == 5
    assert server.requests[0]["model"] == "qwen"
    calls = docker_calls(docker.root)
    runs = [c for c in calls if c[0] == "run"]
    assert len(runs) == 2  # the agent's sandbox, then a fresh container for grading
    assert all(c[c.index("--name") + 1].startswith(CONTAINER_PREFIX) for c in runs)
    # The fixed limits, then run_args, which win where they overlap; no --rm (a dead
    # container stays for inspect to say why)
    assert all(flag_values(c, "--cpus")[-1] == "2" for c in runs)
    assert all(flag_values(c, "--memory") == ["10g"] for c in runs)
    assert all(flag_values(c, "--pids-limit") == ["4096"] for c in runs)
    assert not any("--rm" in c for c in runs)
    assert any(c[0] == "exec" and c[-3:-1] == ["bash", "-c"] and c[-1] == FIX for c in calls)
    assert live_containers(docker.root) == []
    assert classify(metadata=result).outcome is Outcome.SOLVED


def flag_values(call: list[str], flag: str) -> list[str]:
    return [call[i + 1] for i, word in enumerate(call[:-1]) if word == flag]


def test_wrong_fix_is_a_scored_submitted_failure(local_images, tmp_path):
    settings = AgentSettings(
        environment="local", local_images=local_images, log_dir=str(tmp_path / "logs"), **FAST
    )
    result, _ = play(WRONG_SCRIPT, settings)
    (trial_dir,) = (tmp_path / "logs" / METADATA["instance_id"]).iterdir()
    assert {"trajectory.json", "patch.diff", "test_output.txt"} <= {
        p.name for p in trial_dir.iterdir()
    }
    assert result["outcome"] == Outcome.SUBMITTED_FAILURE.value
    assert (result["reward"], result["resolved"]) == (0.0, False)
    assert result["eval_report"]["failed_tests"] == ["tests/test_calc.py::test_add"]
    assert not result["ran_repo_tests"] and result["n_test_runs"] == 0


def test_turn_cap_stops_at_exactly_forty_model_calls(local_images):
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    assert settings.step_limit == 40
    result, server = play([{"command": "ls"}], settings)
    assert (result["exit_status"], result["outcome"]) == ("LimitsExceeded", "budget_failure")
    assert result["outcome_reason"] == "turn_cap" and result["reward"] == 0.0
    assert result["turns"] == 40 and len(server.requests) == 40


def test_turn_cap_setting_is_honoured_on_docker(docker):
    settings = AgentSettings(docker_executable=docker.shim, step_limit=3, **FAST)
    result, server = play([{"command": "ls"}], settings)
    assert result["turns"] == 3 and len(server.requests) == 3
    assert result["outcome_reason"] == "turn_cap"
    assert len([c for c in docker_calls(docker.root) if c[0] == "run"]) == 1  # never graded


def test_repeated_format_errors_are_a_budget_failure_labelled_format(local_images):
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    result, _ = play([{"text": "I think the bug is in calc.py."}], settings)
    assert (result["exit_status"], result["outcome"]) == ("RepeatedFormatError", "budget_failure")
    assert result["outcome_reason"] == "format" and result["turns"] == 3


def test_format_errors_from_replies_cut_at_the_length_limit_are_a_context_limit(local_images):
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    result, _ = play(
        [{"text": "Let me think step by step about", "finish_reason": "length"}], settings
    )
    assert (result["exit_status"], result["outcome"]) == ("RepeatedFormatError", "budget_failure")
    assert (result["outcome_reason"], result["last_finish_reason"]) == ("context_limit", "length")


def test_stall_past_the_trial_timeout_is_infra_and_removes_the_sandbox(docker):
    # the endpoint never answers in time: retried off the agent's budget until the trial
    # timeout, which is then the infrastructure's
    settings = AgentSettings(
        docker_executable=docker.shim,
        command_timeout_s=1,
        request_timeout_s=1,
        start_timeout_s=1.5,
        time_budget_s=1,
        trial_timeout_s=5,
        outer_timeout_s=6,
    )
    result, _ = play([{"sleep": 4, "command": "ls"}], settings)
    assert result["outcome"] == Outcome.INFRA_NO_RESULT.value
    assert (result["exit_status"], result["outcome_reason"]) == ("TrialTimeout", "trial_timeout")
    assert result["reward"] is None
    deadline = time.monotonic() + 30  # removal runs in the background
    while live_containers(docker.root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_containers(docker.root) == []


def test_image_that_cannot_be_pulled_is_infra_not_a_failure(docker):
    settings = AgentSettings(docker_executable=docker.shim, **FAST)
    result, server = play(FIX_SCRIPT, settings, metadata={**METADATA, "image": "swebench/absent"})
    assert (result["outcome"], result["outcome_reason"]) == ("infra_no_result", "image_pull")
    assert result["reward"] is None and "pull access denied" in result["error"]
    assert server.requests == []


def test_missing_task_branch_is_infra(docker):
    settings = AgentSettings(docker_executable=docker.shim, **FAST)
    metadata = {**METADATA, "instance_id": METADATA["instance_id"] + "x"}
    result, _ = play(FIX_SCRIPT, settings, metadata=metadata)
    assert (result["outcome"], result["outcome_reason"]) == ("infra_no_result", "checkout_failed")
    assert live_containers(docker.root) == []


def test_unreachable_model_endpoint_is_infra_after_its_patience(local_images):
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    started = time.monotonic()
    result, _ = play(FIX_SCRIPT, settings, base_url="http://127.0.0.1:9")
    assert (result["outcome"], result["outcome_reason"]) == ("infra_no_result", "endpoint_error")
    assert result["reward"] is None and result["error"]
    assert result["exit_status"] not in ("Submitted", "LimitsExceeded", "")
    # retried for the patience (1 s), and none of it is the agent's time
    assert result["timings"]["endpoint_wait_s"] >= 0.9 and time.monotonic() - started >= 0.9
    assert result["timings"].get("model_s", 0.0) < 0.5


def test_the_agents_own_time_is_a_budget_failure(local_images):
    settings = AgentSettings(
        environment="local", local_images=local_images, time_budget_s=1, **FAST
    )
    result, server = play([{"sleep": 1.2, "command": "ls"}], settings)
    assert (result["exit_status"], result["outcome"]) == ("TimeBudgetExceeded", "budget_failure")
    assert (result["outcome_reason"], result["reward"]) == ("time_budget", 0.0)
    assert len(server.requests) == 1 and result["turns"] == 1  # refused before the second call
    assert result["timings"]["model_s"] >= 1.0
    assert classify(metadata=result).outcome is Outcome.BUDGET_FAILURE


def test_time_lost_to_a_failing_endpoint_is_not_the_agents_budget(local_images, monkeypatch):
    from swe_smith_tasks import endpoint

    monkeypatch.setattr(endpoint, "RETRY_WAIT_S", (1.5, 1.5))
    settings = AgentSettings(
        environment="local",
        local_images=local_images,
        time_budget_s=2,
        **{**FAST, "endpoint_patience_s": 30},
    )
    outage = [{"status": 503, "error": "the engine is restarting"}] * 3
    quick = [{"command": c} for c in (FIX, MAKE_PATCH, SUBMIT)]
    result, server = play(outage + quick, settings)
    # the 503s and the waits after them were the endpoint's: more than the 2 s budget, which
    # the agent's own time never reached. (The OpenAI client under litellm retries a 503
    # itself, DEFAULT_MAX_RETRIES = 2 with its own backoff, inside one attempt of the model's
    # loop: the three 503s can be one failed attempt of 1-2 s, then one 1.5 s wait.)
    timings = result["timings"]
    assert timings["endpoint_wait_s"] > 2 > timings["model_s"] + timings.get("tool_s", 0)
    assert timings["endpoint_wait_s"] >= 1.5  # at least the model loop's own wait
    assert (result["outcome"], result["exit_status"]) == ("solved", "Submitted")
    assert len(server.requests) >= 3 + len(quick)


def test_a_cancelled_trial_cancels_and_removes_its_sandbox(docker):
    settings = AgentSettings(docker_executable=docker.shim, **FAST)
    server = ScriptedOpenAI([{"sleep": 3, "command": "ls"}])

    async def cancel_mid_trial():
        task = asyncio.ensure_future(
            agent.run(server.base_url, PROBLEM, {}, dict(METADATA), settings=settings)
        )
        await asyncio.to_thread(server.first_request.wait, 30)
        task.cancel()
        return await task

    try:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(cancel_mid_trial())
    finally:
        server.close()
    deadline = time.monotonic() + 30  # removal runs in the background
    while live_containers(docker.root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_containers(docker.root) == []


def test_trials_run_off_the_loop_at_most_max_concurrency_at_once(monkeypatch):
    running, peak = [0], [0]

    def fake_play(self):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        running[0] -= 1
        return {"outcome": "solved"}

    monkeypatch.setattr(agent.Trial, "play", fake_play)
    settings = AgentSettings(max_concurrency=2)

    async def many():
        ticks = 0

        async def ticker():  # the loop stays free while trials run
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        tick = asyncio.ensure_future(ticker())
        results = await asyncio.gather(
            *(
                agent.run("http://x", PROBLEM, {}, dict(METADATA), settings=settings)
                for _ in range(6)
            )
        )
        tick.cancel()
        return results, ticks

    results, ticks = asyncio.run(many())
    assert len(results) == 6 and peak[0] == 2 and ticks > 3


def test_sandbox_hides_the_task_history(docker):
    container = DockerContainer(IMAGE, role="agent", executable=docker.shim)
    try:
        checkout_task(container, METADATA["instance_id"])
        log = container.exec("git log --all --oneline | wc -l", timeout_s=20)
        assert log.output.strip() == "1"
        assert container.exec("git show HEAD~1", timeout_s=20).returncode != 0
        assert container.exec("test -e tests/test_calc.py", timeout_s=20).returncode != 0
        assert "a - b" in container.exec("cat calc.py", timeout_s=20).output
        assert container.exec("git status --porcelain", timeout_s=20).output == ""
    finally:
        container.close()
    assert live_containers(docker.root) == []
    kept = DockerContainer(IMAGE, role="agent", executable=docker.shim)
    try:
        checkout_task(kept, METADATA["instance_id"], hide_history=False)
        assert kept.exec("git rev-list --count HEAD", timeout_s=20).output.strip() == "3"
    finally:
        kept.close()


def test_settings_order_the_timeouts_and_name_the_variable():
    with pytest.raises(ValueError, match="RESCUE_SWE_TRIAL_TIMEOUT"):
        AgentSettings(trial_timeout_s=7200, outer_timeout_s=7200)
    with pytest.raises(ValueError, match="RESCUE_SWE_COMMAND_TIMEOUT"):
        AgentSettings(command_timeout_s=600, trial_timeout_s=600, outer_timeout_s=900)
    with pytest.raises(ValueError, match="RESCUE_SWE_ENVIRONMENT"):
        AgentSettings(environment="podman")
    with pytest.raises(ValueError, match="RESCUE_SWE_STEP_LIMIT"):
        AgentSettings.from_env({"RESCUE_SWE_STEP_LIMIT": "forty"})
    s = AgentSettings.from_env(
        {
            "RESCUE_SWE_STEP_LIMIT": "12",
            "RESCUE_SWE_TRIAL_TIMEOUT": "900",
            "RESCUE_SWE_TIME_BUDGET": "600",
            "RESCUE_SWE_REQUEST_TIMEOUT": "120",
            "RESCUE_SWE_START_TIMEOUT": "100",
            "MSWEA_DOCKER_EXECUTABLE": "/opt/docker",
            "RESCUE_SWE_DOCKER_RUN_ARGS": "--cpus 2 --memory 8g",
            "RESCUE_SWE_HIDE_HISTORY": "0",
            "AGENT_MODEL_NAME": "qwen",
        }
    )
    assert (s.step_limit, s.trial_timeout_s, s.docker_executable) == (12, 900.0, "/opt/docker")
    assert s.docker_run_args == ("--cpus", "2", "--memory", "8g")
    assert (s.hide_history, s.model_name) == (False, "qwen")
    d = AgentSettings()
    assert d.command_timeout_s < d.trial_timeout_s < d.outer_timeout_s and d.step_limit == 40
    # the agent's budget and one overrun of each kind fit under the trial timeout
    with pytest.raises(ValueError, match=r"RESCUE_SWE_TIME_BUDGET=5000.*RESCUE_SWE_TRIAL_TIMEOUT"):
        AgentSettings(time_budget_s=5000)
    with pytest.raises(ValueError, match="RESCUE_SWE_ENDPOINT_PATIENCE"):
        AgentSettings.from_env({"RESCUE_SWE_ENDPOINT_PATIENCE": "0"})
    s = AgentSettings.from_env({"RESCUE_SWE_TIME_BUDGET": "1800"})
    assert s.time_budget_s == 1800 and d.time_budget_s == 3600


def test_metadata_without_instance_id_is_rejected():
    with pytest.raises(ValueError, match="instance_id"):
        asyncio.run(agent.run("http://x", PROBLEM, {}, {"repo": "x"}, settings=AgentSettings()))


def test_reward_func_reads_the_reward_and_scores_no_result_as_zero():
    solved = SimpleNamespace(metadata={"reward": 1.0, "outcome": "solved"})
    infra = SimpleNamespace(metadata={"reward": None, "outcome": "infra_no_result"})
    assert asyncio.run(reward_func(None, solved)) == 1.0
    assert asyncio.run(reward_func(None, [solved, infra, SimpleNamespace(metadata={})])) == [
        1.0,
        0.0,
        0.0,
    ]


# ── context limits, lost containers, and faults that are not infrastructure ─────────────

SGLANG_CONTEXT_ERRORS = [
    "The input (39012 tokens) is longer than the model's context length (40960 tokens).",
    "Requested token count exceeds the model's maximum context length of 40960 tokens. You "
    "requested a total of 41220 tokens: 33028 tokens from the input messages and 8192 tokens "
    "for the completion. Please reduce the number of tokens in the input messages or the "
    "completion to fit within the limit.",
    "Input length (40100 tokens) exceeds the maximum allowed length (40000 tokens). Use a "
    "shorter input or enable --allow-auto-truncate.",
]


@pytest.mark.parametrize("message", SGLANG_CONTEXT_ERRORS, ids=["input", "total", "scheduler"])
def test_a_request_over_the_context_ends_the_trial_as_a_context_limit(local_images, message):
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    result, server = play([{"command": "ls"}, {"status": 400, "error": message}], settings)
    assert (result["exit_status"], result["outcome"]) == (
        "ContextWindowExceededError",
        "budget_failure",
    )
    assert result["outcome_reason"] == "context_limit" and result["reward"] == 0.0
    assert len(server.requests) == 2  # refused once, never retried
    assert classify(metadata=result).outcome is Outcome.BUDGET_FAILURE


@pytest.mark.parametrize(
    "message",
    [
        "Invalid tool_choice: 'maybe'",
        # max_tokens above the whole context: every request fails, whatever the trajectory
        "max_completion_tokens is too large: 65536.This model supports at most 40960 "
        "completion tokens.",
    ],
)
def test_a_server_error_that_is_not_the_trajectorys_context_stays_infra(local_images, message):
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    result, _ = play([{"status": 400, "error": message}], settings)
    assert (result["outcome"], result["exit_status"]) == ("infra_no_result", "BadRequestError")


def test_a_container_lost_mid_trial_is_infra_not_a_turn_cap(docker):
    def daemon_restart(n):
        if n == 2:  # after two commands ran: every container is gone
            for folder in (docker.root / "containers").iterdir():
                shutil.rmtree(folder)

    settings = AgentSettings(docker_executable=docker.shim, step_limit=6, **FAST)
    server = ScriptedOpenAI([{"command": "ls"}], on_request=daemon_restart)
    try:
        result = asyncio.run(
            agent.run(server.base_url, PROBLEM, {}, dict(METADATA), settings=settings)
        )
    finally:
        server.close()
    assert (result["outcome"], result["outcome_reason"]) == ("infra_no_result", "container_lost")
    assert result["reward"] is None and "No such container" in result["error"]
    assert len(server.requests) == 3  # stopped at the first failed command, not at the cap
    states = [c for c in docker_calls(docker.root) if c[0] == "inspect" and "State" in c[2]]
    assert len(states) == 1


def test_a_sandbox_its_memory_limit_killed_is_the_agents_failure(docker):
    def oom(n):
        if n == 2:  # the agent's processes exhausted the container's memory: docker stops it
            for folder in (docker.root / "containers").iterdir():
                (folder / "state.json").write_text('{"running": false, "oom_killed": true}')

    settings = AgentSettings(docker_executable=docker.shim, step_limit=6, **FAST)
    server = ScriptedOpenAI([{"command": "ls"}], on_request=oom)
    try:
        result = asyncio.run(
            agent.run(server.base_url, PROBLEM, {}, dict(METADATA), settings=settings)
        )
    finally:
        server.close()
    assert (result["outcome"], result["outcome_reason"]) == ("submitted_failure", "sandbox_oom")
    assert result["reward"] == 0.0 and "is not running" in result["error"]
    assert live_containers(docker.root) == []  # the dead container is removed all the same
    assert classify(metadata=result).outcome is Outcome.SUBMITTED_FAILURE


def test_a_full_disk_is_an_observation_the_agent_pays_for(docker):
    # docker exec fails with the daemon's words while the container still runs
    full = "echo 'Error response from daemon: no space left on device' >&2; exit 126"
    settings = AgentSettings(docker_executable=docker.shim, step_limit=3, **FAST)
    result, _ = play([{"command": full}], settings)
    assert (result["outcome"], result["outcome_reason"]) == ("budget_failure", "turn_cap")


def _network_probe(port: int) -> str:
    return (
        'python -c "import socket; socket.create_connection('
        f"('127.0.0.1', {port}), timeout=5)\" >/dev/null 2>&1 "
        "&& echo NETWORK-REACHED || echo NETWORK-UNREACHABLE"
    )


@pytest.mark.parametrize("cut", [True, False], ids=["cut", "not-cut"])
def test_the_sandbox_is_cut_from_the_network_after_checkout_and_grading_still_works(docker, cut):
    from rescue.rehearsal.standins.docker import can_isolate

    if not can_isolate():
        pytest.skip("unshare -rn is not allowed here: the stand-in cannot isolate a network")
    upstream = ScriptedOpenAI([{"text": "the upstream fix"}])  # anything listening
    port = upstream.server.server_address[1]
    script = [{"command": _network_probe(port)}, *FIX_SCRIPT]
    settings = AgentSettings(docker_executable=docker.shim, cut_network=cut, **FAST)
    try:
        result, server = play(script, settings)
    finally:
        upstream.close()
    seen = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert len(seen) == 1  # the probe's observation
    assert ("NETWORK-UNREACHABLE" in seen[0]) is cut and ("NETWORK-REACHED" in seen[0]) is not cut
    assert result["outcome"] == "solved"  # the grader's fresh container kept its network
    runs = [c for c in docker_calls(docker.root) if c[0] == "run"]
    agent_name = runs[0][runs[0].index("--name") + 1]
    cuts = [c for c in docker_calls(docker.root) if c[:2] == ["network", "disconnect"]]
    assert [c[-2:] for c in cuts] == ([["bridge", c[-1]] for c in cuts] if cut else [])
    if cut:
        assert len(cuts) == 1 and agent_name.startswith("rescue-swe-agent-")


def test_a_network_that_cannot_be_cut_is_infra(docker, tmp_path):
    # a docker whose disconnect does nothing: the check afterwards finds the network
    shim = tmp_path / "docker-no-disconnect"
    shim.write_text(f'#!/bin/sh\n[ "$1" = network ] && exit 0\nexec "{docker.shim}" "$@"\n')
    shim.chmod(0o755)
    settings = AgentSettings(docker_executable=str(shim), **FAST)
    result, server = play(FIX_SCRIPT, settings)
    assert (result["outcome"], result["outcome_reason"]) == (
        "infra_no_result",
        "network_cut_failed",
    )
    assert "bridge" in result["error"] and server.requests == []
    assert live_containers(docker.root) == []


def test_a_failing_command_in_a_live_container_is_an_observation(docker):
    settings = AgentSettings(docker_executable=docker.shim, step_limit=3, **FAST)
    result, _ = play(
        [{"command": "docker ps; echo 'Error response from daemon' >&2; exit 1"}], settings
    )
    assert (result["outcome"], result["outcome_reason"]) == ("budget_failure", "turn_cap")


class BrokenModel:
    """A model object whose query has a bug (what a fault in rescue's code looks like)."""

    config = SimpleNamespace(model_name="broken")

    def query(self, messages, **kwargs):
        return {}["choices"]

    def format_message(self, **kwargs):
        return kwargs

    def format_observation_messages(self, message, outputs, template_vars=None):
        return []

    def get_template_vars(self, **kwargs):
        return {}

    def serialize(self):
        return {}


def test_a_fault_in_the_code_raises_instead_of_being_booked_as_infrastructure(local_images):
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    with pytest.raises(KeyError, match="choices"):
        asyncio.run(
            agent.run(
                "http://x", PROBLEM, {}, dict(METADATA), settings=settings, model=BrokenModel()
            )
        )


def test_a_fault_after_the_agent_raises_too(local_images, monkeypatch):
    def broken(*args, **kwargs):
        raise TypeError("read_test_runs() got an unexpected keyword argument")

    monkeypatch.setattr(agent, "read_test_runs", broken)
    settings = AgentSettings(environment="local", local_images=local_images, **FAST)
    with pytest.raises(TypeError, match="unexpected keyword"):
        play(FIX_SCRIPT, settings)


def test_a_task_without_a_profile_is_refused_before_any_container(docker):
    settings = AgentSettings(docker_executable=docker.shim, **FAST)
    metadata = {**METADATA, "repo": "swesmith/nobody__nothing.12345678"}
    with pytest.raises(ValueError, match="no SWE-smith profile"):
        play(FIX_SCRIPT, settings, metadata=metadata)
    assert docker_calls(docker.root) == []


@pytest.mark.parametrize("f2p", [None, [], "[]"])
def test_a_task_without_fail_to_pass_tests_is_refused(docker, f2p):
    settings = AgentSettings(docker_executable=docker.shim, **FAST)
    metadata = {k: v for k, v in METADATA.items() if k != "FAIL_TO_PASS"}
    if f2p is not None:
        metadata["FAIL_TO_PASS"] = f2p
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        play(FIX_SCRIPT, settings, metadata=metadata)
    assert docker_calls(docker.root) == []


def test_task_containers_get_the_same_fixed_limits_on_every_node(monkeypatch):
    fixed = ("--memory", "10g", "--cpus", "2", "--pids-limit", "4096")
    for cores, concurrency in ((64, 128), (16, 16), (224, 64)):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert AgentSettings(max_concurrency=concurrency).docker_limits() == fixed
    env = AgentSettings.from_env(
        {
            "RESCUE_SWE_CONTAINER_MEMORY": "4g",
            "RESCUE_SWE_CONTAINER_CPUS": "1.5",
            "RESCUE_SWE_CONTAINER_PIDS": "512",
        }
    )
    assert env.docker_limits() == ("--memory", "4g", "--cpus", "1.5", "--pids-limit", "512")
    assert env.sandbox()["cpus"] == 1.5 and env.sandbox()["memory"] == "4g"
    off = AgentSettings.from_env(
        {
            "RESCUE_SWE_CONTAINER_MEMORY": "0",
            "RESCUE_SWE_CONTAINER_CPUS": "0",
            "RESCUE_SWE_CONTAINER_PIDS": "0",
        }
    )
    assert off.docker_limits() == ()
    with pytest.raises(ValueError, match="RESCUE_SWE_CONTAINER_CPUS"):
        AgentSettings(container_cpus=-1)
    with pytest.raises(ValueError, match="RESCUE_SWE_CONTAINER_PIDS"):
        AgentSettings(container_pids=-1)
    assert AgentSettings.from_env({"RESCUE_SWE_CUT_NETWORK": "0"}).cut_network is False


def test_a_fault_before_the_agent_raises_instead_of_being_booked_as_infrastructure(
    docker, monkeypatch
):
    def broken(container, instance_id, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'exec'")

    monkeypatch.setattr(agent, "checkout_task", broken)
    settings = AgentSettings(docker_executable=docker.shim, **FAST)
    with pytest.raises(AttributeError, match="no attribute 'exec'"):
        play(FIX_SCRIPT, settings)
    assert live_containers(docker.root) == []  # the sandbox is still removed
