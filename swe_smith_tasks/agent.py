"""The SWE agent function for Miles' ``--custom-agent-function-path``, and its reward function.

Specification
-------------
``run(base_url, prompt, request_kwargs, metadata)`` plays one trial of one SWE-smith task:

1. A container of the task image (``sandbox.DockerContainer``; ``local`` copies a
   directory instead) with the fixed sandbox limits, ``git checkout <instance_id>``, git
   history replaced by one commit, then the container cut from every network
   (``cut_network``): the agent cannot fetch the upstream fix.
2. mini-swe-agent's ``DefaultAgent`` with its ``LitellmModel`` against the
   OpenAI-compatible endpoint ``base_url`` (Miles' session server), with
   ``request_kwargs`` as sampling parameters, the upstream SWE-bench prompt config, at
   most ``step_limit`` model calls (40), each command under ``command_timeout_s``, and
   at most ``time_budget_s`` of its own time (its model calls, failed attempts excluded,
   and its commands), checked before each model call (``TimeBudgetExceeded``).
3. The container removed (``finally``); after a submission, the patch graded in a fresh
   container of the same image (``grading.grade_patch``).
4. The class from ``rescue.outcomes.classify_exit_status``, the one classifier.

The trial runs in its own thread (mini-swe-agent is synchronous), at most
``max_concurrency`` at once per event loop, under ``trial_timeout_s`` (start, agent and
grading; not the wait for a slot). Timeouts are ordered
``command_timeout_s`` and ``request_timeout_s`` < ``trial_timeout_s`` < ``outer_timeout_s``
(the trainer's own limit on one sample), and the time budget leaves room for one request,
one command and a container start below the trial timeout (``agent_settings``), so a
trial timeout is time the infrastructure took. A cancelled trial stops its worker, removes
its containers and re-raises the cancellation.

``reward_func`` (``--custom-rm-path``) also records each finished sample's turn spans in
its metadata (``rescue.turns.TURN_SPANS_KEY``), read by the turn-reached reward hook.

Returned dict (merged into the sample's metadata by Miles): ``reward`` (1.0 solved, 0.0
scored or budget failure, ``None`` with no result), ``exit_status``, ``outcome``,
``outcome_reason``, ``turns`` (``info.model_stats.api_calls``), ``resolved``,
``eval_report``, the ran-tests fields of ``ran_tests.RanTests``, ``timings`` and
``agent_metrics`` (``turns``, ``total_tool_time``, which Miles books as non-generation
time). Every reason is booked by ``rescue.outcomes.because`` (the reason table): an
infrastructure fault (container start or pull, checkout, network cut, a container lost
mid-trial, model endpoint past its patience, grader, trial timeout) gives
``outcome="infra_no_result"`` with the reason and the error text, never a scored
failure; a sandbox the agent's processes killed through its memory limit
(``sandbox_oom``) is a scored failure with reward 0. A request the endpoint refuses for
exceeding the context is a budget failure (``context_limit``, ``endpoint.litellm_model``).

What is *not* infrastructure raises: a task the grader cannot judge (no FAIL_TO_PASS
tests, no SWE-smith profile; ``ValueError`` before any container starts) and any other
exception, which is a fault in rescue or its libraries and must surface as an error, not
be booked as a lost rollout. Infrastructure is ``sandbox.SandboxError`` (containers, the
grader's docker steps) and the model endpoint's errors (``openai.APIError``, which
litellm's errors are, ``OSError``, ``TimeoutError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.outcomes import Outcome, because, classify_exit_status
from rescue.turns import mask_turn_spans, record_turn_spans
from swe_smith_tasks.agent_settings import AgentSettings
from swe_smith_tasks.endpoint import is_endpoint_fault, litellm_model
from swe_smith_tasks.grading import Grade, grade_patch, profile_of, task_instance
from swe_smith_tasks.ran_tests import RanTests, read_test_runs
from swe_smith_tasks.sandbox import (
    Container,
    DockerContainer,
    LocalContainer,
    SandboxError,
    checkout_task,
)

# mini-swe-agent prints a banner and litellm fetches a price map on import; a trainer
# wants neither (cost tracking is off).
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# The model retries a failing endpoint itself, patiently and off the agent's budget
# (swe_smith_tasks.endpoint); mini-swe-agent's own loop would retry every error ten times.
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")


async def run(
    base_url: str,
    prompt: Any,
    request_kwargs: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    *,
    settings: AgentSettings | None = None,
    model: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """One trial of the task in ``metadata`` (module docstring); never raises on infra faults.

    ``settings`` default to ``AgentSettings.from_env()``; ``model`` replaces the litellm
    model (any mini-swe-agent model object). A task the grader cannot judge (no
    ``instance_id``, no FAIL_TO_PASS test, no SWE-smith profile) raises ValueError.
    """
    settings = settings or AgentSettings.from_env()
    instance = task_instance(metadata or {})
    profile_of(instance)  # a task without a profile cannot be graded: refuse it now
    trial = Trial(
        instance=instance,
        task=_task_text(prompt),
        base_url=base_url,
        request_kwargs=dict(request_kwargs or {}),
        settings=settings,
        model=model,
    )
    waited = time.monotonic()
    try:
        async with _slot(settings.max_concurrency):
            trial.timings["queue_s"] = time.monotonic() - waited
            result = await asyncio.wait_for(_in_thread(trial.play), settings.trial_timeout_s)
    except asyncio.TimeoutError:
        trial.abort()
        result = trial.ended("TrialTimeout", "trial_timeout", f"{settings.trial_timeout_s}s")
    except asyncio.CancelledError:
        trial.abort()  # the worker stops at its next model call; containers go
        raise
    return result


async def reward_func(args: Any, samples: Any, **kwargs: Any) -> float | list[float]:
    """Miles ``--custom-rm-path``: the reward ``run`` left in each sample's metadata.

    A sample with no result (``reward`` None or absent) scores 0.0 here because Miles needs
    a number; its ``outcome`` says ``infra_no_result`` and the census and buffer use that.
    """
    if isinstance(samples, list):
        return [_reward(s) for s in samples]
    return _reward(samples)


def _reward(sample: Any) -> float:
    _record_spans(sample)
    reward = (getattr(sample, "metadata", None) or {}).get("reward")
    return float(reward) if reward is not None else 0.0


def _record_spans(sample: Any) -> None:
    """Record the sample's turn spans (``rescue.turns.record_turn_spans``) here, on the
    rollout side as each trial finishes, for the turn-reached reward hook: Miles' session
    server builds the loss mask where rescue has no hook, so this is the first place
    rescue holds the finished sample, and the pass over its mask happens while other
    trials generate instead of in the training step. A mask that cannot be read is left
    to the hook, which reads it again and says what is wrong with it."""
    metadata = getattr(sample, "metadata", None)
    mask = getattr(sample, "loss_mask", None)
    if metadata is None or mask is None:
        return
    try:
        spans = mask_turn_spans(mask)
    except InputError:
        return
    if spans.n_tokens == int(getattr(sample, "response_length", 0) or 0):
        record_turn_spans(metadata, spans)


@dataclass
class Trial:
    """One trial's state, shared by the worker thread and the coroutine that awaits it."""

    instance: dict[str, Any]
    task: str
    base_url: str
    request_kwargs: dict[str, Any]
    settings: AgentSettings
    model: Any = None
    cancel: threading.Event = field(default_factory=threading.Event)
    containers: list[Container] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    agent: Any = None
    tests: RanTests = field(default_factory=RanTests)
    exit_status: str = ""
    error: str = ""
    endpoint_failed: bool = False
    trial_dir: Path | None = None

    def play(self) -> dict[str, Any]:
        """Sandbox, agent, grading; runs in a worker thread."""
        start = time.monotonic()
        iid = self.instance["instance_id"]
        exit_status, patch, messages = "", "", []
        try:
            sandbox = self._container("agent")
            checkout_task(sandbox, iid, hide_history=self.settings.hide_history)
            if self.settings.cut_network:
                sandbox.cut_network()
            self.timings["sandbox_s"] = time.monotonic() - start
            exit_status, patch, messages = self._agent(sandbox)
        except SandboxError as e:  # booked by its reason; any other exception is a fault
            return self.ended(self.exit_status or e.reason, e.reason, _describe(e))
        finally:
            self._close_all()
            self.timings["agent_s"] = time.monotonic() - start - self.timings.get("sandbox_s", 0)
        if self.endpoint_failed:
            return self.ended(exit_status, "endpoint_error", self.error)
        self.tests = read_test_runs(
            messages,
            test_cmd=profile_of(self.instance).test_cmd,
            test_files=self.instance["FAIL_TO_PASS"] + self.instance["PASS_TO_PASS"],
        )
        grade: Grade | None = None
        if exit_status == "Submitted":
            if self.cancel.is_set():
                return self.ended(exit_status, "cancelled", "before grading")
            try:
                grade = grade_patch(
                    self._container("eval"), self.instance, patch, log_dir=self._log_dir()
                )
            except SandboxError as e:  # the grader's containers: no verdict
                grade = Grade("error", False, reason=e.reason, report={"error": _describe(e)})
            finally:
                self._close_all()
            self.timings["grade_s"] = grade.seconds or 0.0
        result = self._result(exit_status, grade)
        if result["outcome"] == Outcome.INFRA_NO_RESULT.value:
            grader_error = str(grade.report.get("error", "")) if grade else ""
            result["error"] = self.error or grader_error
        return result

    def abort(self) -> None:
        """Stop the worker at its next model call and remove its containers (in background)."""
        self.cancel.set()
        threading.Thread(target=self._close_all, daemon=True).start()

    def ended(self, exit_status: str, reason: str, error: str) -> dict[str, Any]:
        """The dict of a trial that ended for ``reason`` before a verdict, booked by the
        reason table: no result (reward ``None``), or the agent's failure (reward 0)."""
        kind = because(reason)
        return {
            **self._result(exit_status, None),
            "reward": None if kind.outcome is Outcome.INFRA_NO_RESULT else 0.0,
            "outcome": kind.outcome.value,
            "outcome_reason": reason,
            "error": error,
        }

    def last_finish_reason(self) -> str | None:
        """The finish reason of the model's last reply (format errors keep the raw response)."""
        for message in reversed(self.agent.messages if self.agent is not None else []):
            response = (message.get("extra") or {}).get("response")
            if isinstance(response, dict) and response.get("choices"):
                return response["choices"][0].get("finish_reason")
        return None

    def _result(self, exit_status: str, grade: Grade | None) -> dict[str, Any]:
        finish_reason = self.last_finish_reason()
        kind = classify_exit_status(
            exit_status,
            resolved=grade.resolved if grade else None,
            eval_status=grade.status if grade else None,
            patch_apply_failed=grade.patch_apply_failed if grade else False,
            finish_reason=finish_reason,
            grader_reason=grade.reason if grade else None,
        )
        reward = {Outcome.SOLVED: 1.0, Outcome.INFRA_NO_RESULT: None}.get(kind.outcome, 0.0)
        timings = {k: round(v, 3) for k, v in self.timings.copy().items()}
        turns = int(self.agent.n_calls) if self.agent is not None else 0
        return {
            "reward": reward,
            "exit_status": exit_status,
            "outcome": kind.outcome.value,
            "outcome_reason": kind.reason,
            "last_finish_reason": finish_reason,
            "turns": turns,
            "resolved": grade.resolved if grade else None,
            "eval_report": grade.as_eval_report() if grade else {},
            **self.tests.as_dict(),
            "timings": timings,
            "agent_metrics": {
                "turns": turns,
                "total_tool_time": timings.get("tool_s", 0.0),
            },
        }

    def _container(self, role: str) -> Container:
        s = self.settings
        image = str(self.instance.get("image") or self.instance.get("image_name") or "")
        if not image:
            image = profile_of(self.instance).image_name
        if s.environment == "local":
            container: Container = LocalContainer(image, role=role, images=str(s.local_images))
        else:
            container = DockerContainer(
                image,
                role=role,
                executable=s.docker_executable,
                run_args=s.docker_run_args,
                limits=s.docker_limits(),
                lifetime_s=s.trial_timeout_s + 60,
                start_timeout_s=s.start_timeout_s,
            )
        self.containers.append(container)
        if self.cancel.is_set():
            raise SandboxError("cancelled", "the trial was cancelled")
        return container

    def _agent(self, sandbox: Container) -> tuple[str, str, list[dict]]:
        config = _mini_config(self.settings.config)
        env = sandbox.mini_environment(
            timeout_s=self.settings.command_timeout_s,
            env=dict(config.get("environment", {}).get("env", {})),
        )
        _time_tool_calls(env, self.timings)
        agent = _agent_class()(
            self.model or self._litellm_model(config.get("model", {})),
            env,
            cancel=self.cancel,
            timings=self.timings,
            time_budget_s=self.settings.time_budget_s,
            **{
                **config.get("agent", {}),
                "step_limit": self.settings.step_limit,
                "cost_limit": 0,
                "output_path": self._log_dir("trajectory.json"),
            },
        )
        self.agent = agent
        try:
            info = agent.run(self.task)
        except Exception as e:  # the agent recorded the exception's name as its exit status
            info = agent.messages[-1].get("extra", {}) if agent.messages else {}
            self.exit_status = str(info.get("exit_status", type(e).__name__))
            self.error = str(info.get("exception_str", str(e)))[:2000]
            if isinstance(e, SandboxError) or not _is_endpoint_fault(e):
                raise  # a lost container (booked by its reason) or a fault
            # the context limit is the trajectory's budget (its exit status says so)
            self.endpoint_failed = is_endpoint_fault(e)
        finally:
            self.timings["endpoint_wait_s"] = float(getattr(agent.model, "endpoint_wait_s", 0.0))
        return str(info.get("exit_status", "")), str(info.get("submission", "")), agent.messages

    def _litellm_model(self, model_config: Mapping[str, Any]) -> Any:
        return litellm_model(
            base_url=self.base_url,
            model_name=self.settings.model_name,
            request_kwargs=self.request_kwargs,
            timeout_s=self.settings.request_timeout_s,
            model_config=model_config,
            patience_s=self.settings.endpoint_patience_s,
            cancel=self.cancel,
        )

    def _log_dir(self, name: str | None = None) -> Path | None:
        if not self.settings.log_dir:
            return None
        if self.trial_dir is None:
            stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            self.trial_dir = Path(self.settings.log_dir) / self.instance["instance_id"] / stamp
        return self.trial_dir / name if name else self.trial_dir

    def _close_all(self) -> None:
        for container in list(self.containers):
            container.close()


def _agent_class() -> type:
    """``DefaultAgent`` that stops at its next model call once the trial is cancelled or its
    own time (``timings["model_s"] + timings["tool_s"]``) reached its budget."""
    global _AGENT_CLASS
    if _AGENT_CLASS is None:
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.exceptions import InterruptAgentFlow

        def exit_with(status: str) -> InterruptAgentFlow:
            extra = {"exit_status": status, "submission": ""}
            return InterruptAgentFlow({"role": "exit", "content": status, "extra": extra})

        class CancellableAgent(DefaultAgent):
            def __init__(
                self,
                *args: Any,
                cancel: threading.Event,
                timings: dict[str, float],
                time_budget_s: float,
                **kwargs: Any,
            ) -> None:
                super().__init__(*args, **kwargs)
                self.cancel = cancel
                self.timings = timings
                self.time_budget_s = time_budget_s

            def query(self) -> dict:
                if self.cancel.is_set():
                    raise exit_with("Cancelled")
                spent = self.timings.get("model_s", 0.0) + self.timings.get("tool_s", 0.0)
                if spent >= self.time_budget_s:
                    raise exit_with("TimeBudgetExceeded")
                waited = float(getattr(self.model, "endpoint_wait_s", 0.0))
                started = time.monotonic()
                try:
                    return super().query()
                finally:  # the model call's time, less what a failing endpoint took
                    lost = float(getattr(self.model, "endpoint_wait_s", 0.0)) - waited
                    took = time.monotonic() - started - lost
                    self.timings["model_s"] = self.timings.get("model_s", 0.0) + took

        _AGENT_CLASS = CancellableAgent
    return _AGENT_CLASS


_AGENT_CLASS: type | None = None
_SLOTS: weakref.WeakKeyDictionary[Any, tuple[int, asyncio.Semaphore]] = weakref.WeakKeyDictionary()


def _slot(limit: int) -> asyncio.Semaphore:
    """The running loop's semaphore of ``limit`` slots (a new one if the limit changed)."""
    loop = asyncio.get_running_loop()
    held = _SLOTS.get(loop)
    if held is None or held[0] != limit:
        held = (limit, asyncio.Semaphore(limit))
        _SLOTS[loop] = held
    return held[1]


async def _in_thread(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` in a fresh daemon thread; a timed-out trial must not hold a pool worker."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[dict[str, Any]] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error else future.set_result(value)

    def target() -> None:
        try:
            value, error = fn(), None
        except BaseException as e:
            value, error = None, e
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, daemon=True, name="rescue-swe-trial").start()
    return await future


def _mini_config(spec: str) -> dict[str, Any]:
    import yaml
    from minisweagent.config import get_config_path

    return yaml.safe_load(get_config_path(spec).read_text()) or {}


def _time_tool_calls(env: Any, timings: dict[str, float]) -> None:
    execute = env.execute

    def timed(*args: Any, **kwargs: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            return execute(*args, **kwargs)
        finally:
            timings["tool_s"] = timings.get("tool_s", 0.0) + time.monotonic() - t0

    env.execute = timed


def _task_text(prompt: Any) -> str:
    """The problem statement from a string prompt or a chat message list (last user turn)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        for message in reversed(prompt):
            if isinstance(message, Mapping) and message.get("role") == "user":
                return str(message.get("content", ""))
    raise InputError(f"prompt must be a string or a list of chat messages, got {type(prompt)}")


def _is_endpoint_fault(e: BaseException) -> bool:
    """Whether an exception out of the agent's run came from the model endpoint, not from a
    fault in the code.

    litellm's errors subclass ``openai.APIError`` (``ContextWindowExceededError`` too,
    which the classifier books as a budget failure by its name; a request the endpoint
    refused for another reason keeps its class name, booked ``infra_no_result``; one that
    failed past the model's patience is ``endpoint_error``).
    """
    import openai

    return isinstance(e, (openai.APIError, OSError, TimeoutError))


def _describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 2000 else text[:2000] + "\n" + traceback.format_exc()[-1000:]
