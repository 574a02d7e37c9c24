"""The text games through Miles' real synchronous rollout: Miles' data source reads the
prepared rows, ``generate_rollout_async`` runs groups through ``generate_and_rm_group``, which
calls ``rescue.miles.textgame.generate``; the engine is the stand-in SGLang server of
``textgame_engine`` (its player wins, loses, hits the cap, sends invalid actions, or the
engine aborts or dies), and the games are real ones ``tw-make`` made for this session.
Then the census, the mask filter, the reward hook and Miles' conversion to train data."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest
from conftest_games import cooking_games as cooking_games  # a fixture
from miles_env import require_miles
from textgame_engine import EOS, PolicyServer, write_tokenizer

from rescue.outcomes import Outcome
from rescue.samples import rollout_record

#: The player of each member of a clean group (8 = the recipe's group size).
SCRIPTS = ("win", "win", "lose", "lose", "cap", "cap", "invalid", "invalid")
CAP = 12


def _stub_rollout_imports() -> None:
    """What Miles' synchronous rollout imports from GPU-side packages, where they are not
    installed: ``sglang_router.__version__`` (which API lists the engines: the pinned
    rehearsal's version stands in) and the names ``miles.utils.dumper_utils`` imports from
    SGLang's dumper (used only when ``--dumper-*`` phases are on; they are off here, so
    ``configure_sglang`` returns before touching them)."""
    try:
        import sglang_router
    except ImportError:
        sglang_router = sys.modules.setdefault("sglang_router", types.ModuleType("sglang_router"))
        sglang_router.__path__ = []
    if not hasattr(sglang_router, "__version__"):  # (framework_args' import-only stand-in)
        sglang_router.__version__ = "0.3.2"
    name = "sglang.srt.debug_utils.dumper"
    try:
        __import__(name)
    except ImportError:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            if sub not in sys.modules:
                mod = types.ModuleType(sub)
                mod.__path__ = []
                sys.modules[sub] = mod
                if i > 1:
                    setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], mod)
        dumper = sys.modules[name]

        def kv_pairs(raw):  # sglang's DumperConfig._kv_pairs_to_dict, for no pairs only
            if raw:
                raise AssertionError(f"the stand-in dumper has no phases; got {raw!r}")
            return {}

        dumper.DumperConfig = type(
            "DumperConfig", (), {"_kv_pairs_to_dict": staticmethod(kv_pairs)}
        )
        dumper._get_rank = lambda: 0
        dumper.dumper = None


@pytest.fixture
def miles_args(tmp_path, cooking_games):
    """Miles' own parser's defaults for a train.py run of the cooking arm, then the stand-ins."""
    require_miles()
    pytest.importorskip("textworld")
    from framework_args import parse_with_miles

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in cooking_games))
    tok = write_tokenizer(tmp_path / "tok")
    words = [
        "--hf-checkpoint", str(tok), "--prompt-data", str(rows), "--input-key", "prompt",
        "--metadata-key", "metadata", "--rollout-batch-size", "2", "--n-samples-per-prompt", "8",
        "--custom-generate-function-path", "rescue.miles.textgame.generate",
        "--agent-cap", str(CAP), "--rollout-max-response-len", "200",
        "--dynamic-sampling-filter-path", "rescue.miles.textgame.drop_no_result",
        "--rollout-num-gpus", "1", "--rollout-num-gpus-per-engine", "1",
    ]  # fmt: skip
    args, _ = parse_with_miles(words)
    args.over_sampling_batch_size = args.rollout_batch_size  # Miles' validation default
    # SGLang's and the router's own flags (not in the parser here: framework_args): their defaults
    args.sglang_speculative_algorithm = None
    args.sglang_router_policy = "cache_aware"
    args.sglang_router_ip = "127.0.0.1"
    args.num_gpus_per_node = 1
    _stub_rollout_imports()
    return args


class ScriptedSource:
    """Miles' ``RolloutDataSource`` on the rows, with each sample's routing key naming its
    player: the first group drawn has an engine fault in ``fault`` (if any)."""

    def __init__(self, args, fault: str | None, every_group: bool = False):
        from miles.rollout.data_source import RolloutDataSource

        self.source = RolloutDataSource(args)
        self.fault = fault
        self.every_group = every_group
        self.drawn = 0

    def __call__(self, n: int):
        groups = self.source.get_samples(n)
        self.drawn += len(groups)
        for group in groups:
            scripts = list(SCRIPTS)
            if self.fault and (self.every_group or group[0].group_index == 0):
                scripts[-1] = self.fault
            for k, (sample, script) in enumerate(zip(group, scripts, strict=True)):
                sample.routing_key = f"{script}|{sample.metadata['game']}|{k}"
        return groups


@pytest.fixture(autouse=True)
def fresh_watchdog(monkeypatch):
    """Each test's rollout process starts with no watchdog (it is made at the first call)."""
    from rescue.miles import textgame

    monkeypatch.setattr(textgame, "_watchdog", None)


def run_rollout(args, fault: str | None = None, source=None):
    """Miles' synchronous rollout of one step: (groups, metrics, server requests)."""
    from miles.rollout.inference_rollout import inference_rollout_common as common
    from miles.rollout.inference_rollout.inference_rollout_train import generate_rollout_async
    from miles.utils import http_utils

    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(args.hf_checkpoint)
    with PolicyServer(tokenizer) as server:
        args.sglang_router_port = server.port
        http_utils._http_client = None
        http_utils.init_http_client(args)
        state = common.GenerateState(args)
        source = source or ScriptedSource(args, fault)
        output, _ = asyncio.run(generate_rollout_async(state, 0, source))
    return output.samples, output.metrics, server.requests


def by_script(groups):
    """{(group index, script): trajectory (its list of step samples)}."""
    out = {}
    for group in groups:
        for trajectory in group:
            samples = trajectory if isinstance(trajectory, list) else [trajectory]
            script = samples[0].routing_key.split("|")[0]
            out.setdefault((samples[0].group_index, script), []).append(samples)
    return out


def test_every_outcome_through_miles_rollout(miles_args):
    groups, metrics, _ = run_rollout(miles_args)
    assert len(groups) == 2 and all(len(g) == 8 for g in groups)
    expected = {
        "win": (Outcome.SOLVED, "won", 1.0),
        "lose": (Outcome.SUBMITTED_FAILURE, "lost", 0.0),
        "cap": (Outcome.BUDGET_FAILURE, "turn_cap", 0.0),
        "invalid": (Outcome.SOLVED, "won", 1.0),
    }
    for (_, script), trajectories in by_script(groups).items():
        for steps in trajectories:
            record = rollout_record(steps)
            outcome, reason, reward = expected[script]
            assert (record.outcome, record.reason, record.reward) == (outcome, reason, reward)
            meta = steps[-1].metadata
            assert meta["turns"] == len(steps) == record.turns
            assert [s.metadata["step"] for s in steps] == list(range(1, len(steps) + 1))
            assert {s.rollout_id for s in steps} == {steps[0].index}
            assert {s.reward for s in steps} == {reward}
            if script == "cap":
                assert len(steps) == CAP and meta["exit_status"] == "max_turns"
            if script == "invalid":
                # no tags at all (inadmissible), then "look" without the think tags (admissible)
                assert meta["invalid_actions"] == 2 and meta["inadmissible_actions"] == 1
            if script == "win":
                assert meta["invalid_actions"] == 0 and len(steps) == meta["walkthrough"]
    assert metrics == {}  # no group dropped


def test_each_step_is_token_in_token_out_with_the_loss_on_the_reply_only(miles_args):
    from transformers import AutoTokenizer

    groups, _, requests = run_rollout(miles_args)
    tok = AutoTokenizer.from_pretrained(miles_args.hf_checkpoint)
    steps = [s for g in groups for t in g for s in (t if isinstance(t, list) else [t])]
    assert len(steps) == len(requests)
    for s in steps:
        prompt_ids = tok.apply_chat_template(s.prompt, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok.encode(prompt_ids, add_special_tokens=False)
        reply = s.tokens[len(prompt_ids) :]
        assert s.tokens[: len(prompt_ids)] == prompt_ids and reply[-1] == EOS
        assert s.response_length == len(reply) == len(s.loss_mask) == len(s.rollout_log_probs)
        assert set(s.loss_mask) == {1} and s.status.value == "completed"
        assert s.weight_versions == ["0"]
        assert "<action>" in s.response or s.metadata["invalid_actions"] > 0
    # every prompt the engine saw is the recipe's: the first without history
    first = [s for s in steps if s.metadata["step"] == 1]
    assert all("Prior to this step" not in s.prompt[0]["content"] for s in first)


@pytest.mark.parametrize(("fault", "reason"), [("abort", "aborted"), ("fail", "engine_error")])
def test_a_game_without_a_result_drops_its_group_counted_and_another_is_drawn(
    miles_args, monkeypatch, fault, reason
):
    from miles.utils import http_utils

    real_post = http_utils._post

    async def post(url, payload, max_retries=60, action="post", headers=None):
        # Miles' own retries, two of them: the stand-in engine fails every one
        return await real_post(http_utils._http_client, url, payload, 2, action, headers)

    monkeypatch.setattr(http_utils, "post", post)
    groups, metrics, _ = run_rollout(miles_args, fault=fault)
    assert metrics == {f"rollout/dynamic_filter/drop_no_result_{reason}": 1}
    # the faulted group 0 is replaced by another drawn group; which two of the groups in
    # flight finish first is the engine's timing (Miles keeps the first that pass)
    kept = {g[0][0].group_index for g in groups}
    assert len(groups) == 2 == len(kept) and 0 not in kept
    assert all(rollout_record(t).outcome is not Outcome.INFRA_NO_RESULT for g in groups for t in g)


def test_a_fault_in_every_game_stops_the_synchronous_rollout_instead_of_drawing_forever(
    miles_args, monkeypatch
):
    """Miles' synchronous rollout draws groups until enough pass the filter: with every game
    faulted none ever does, and the watchdog ends it with one line naming the reason."""
    from miles.utils import http_utils

    from rescue.watchdog import WatchdogStop

    real_post = http_utils._post

    async def post(url, payload, max_retries=60, action="post", headers=None):
        return await real_post(http_utils._http_client, url, payload, 2, action, headers)

    monkeypatch.setattr(http_utils, "post", post)
    monkeypatch.setenv("RESCUE_WATCHDOG_WINDOW", "3")
    monkeypatch.setenv("RESCUE_WATCHDOG_MAX_NO_RESULT", "0.5")
    source = ScriptedSource(miles_args, "fail", every_group=True)
    with pytest.raises(WatchdogStop, match="3 of the last 3 groups had no result") as stop:
        run_rollout(miles_args, source=source)
    assert "engine_error" in stop.value.line
    assert source.drawn < 20  # it stopped after a few groups, not after the data ran out


def test_the_filter_names_the_fault_and_keeps_every_other_group(miles_args):
    from miles.rollout.filter_hub.base_types import call_dynamic_filter
    from miles.utils.types import Sample

    from rescue.miles.textgame import drop_no_result

    ok = Sample(index=0, group_index=0, reward=0.0, metadata={"exit_status": "max_turns"})
    bad = Sample(index=1, group_index=0, reward=0.0, metadata={"exit_status": "env_error"})
    ok.status = bad.status = Sample.Status.COMPLETED
    assert call_dynamic_filter(drop_no_result, miles_args, [ok, [ok]]).keep is True
    out = call_dynamic_filter(drop_no_result, miles_args, [ok, [bad]])
    assert (out.keep, out.reason) == (False, "no_result_env_error")


def test_the_census_reports_the_three_outcomes_with_their_reasons(miles_args):
    from rescue.miles.log import sample_census

    groups, _, _ = run_rollout(miles_args)
    flat = [s for g in groups for t in g for s in (t if isinstance(t, list) else [t])]
    m = sample_census(flat)
    p = "rollout/census/samples/"
    assert m[f"{p}rollouts"] == 16
    assert m[f"{p}outcome/solved"] == 8 and m[f"{p}outcome/submitted_failure"] == 4
    assert m[f"{p}outcome/budget_failure"] == 4 and m[f"{p}cap_hit_rate"] == 4 / 16


def test_a_prompt_that_no_longer_fits_the_context_ends_the_episode_as_a_budget_failure(
    miles_args, cooking_games
):
    from transformers import AutoTokenizer

    from rescue.envs.episode import Episode
    from rescue.envs.games import open_game

    tok = AutoTokenizer.from_pretrained(miles_args.hf_checkpoint)
    lengths = []
    for row in cooking_games:
        game = open_game("cooking", row["metadata"]["game"])
        ep = Episode(game, env="cooking", cap=CAP)
        ep.start()
        text = tok.apply_chat_template(
            [{"role": "user", "content": ep.prompt}], tokenize=False, add_generation_prompt=True
        )
        lengths.append(len(tok.encode(text, add_special_tokens=False)))
        game.close()
    # room for every first step and its reply; the history that later prompts add soon
    # leaves no room (the reply budget shrinks first: Miles' compute_request_payload)
    miles_args.rollout_max_context_len = max(lengths) + miles_args.rollout_max_response_len + 1
    groups, metrics, _ = run_rollout(miles_args)
    ended = []
    for (_, script), trajectories in by_script(groups).items():
        for steps in trajectories:
            record = rollout_record(steps)
            ended.append(steps[-1].metadata["exit_status"])
            if ended[-1] == "length":
                assert (record.outcome, record.reason) == (Outcome.BUDGET_FAILURE, "context_limit")
                assert {s.reward for s in steps} == {0.0} and len(steps) < CAP
            else:  # the game ended first: a short walkthrough, or an ingredient eaten
                assert script in ("win", "lose") and ended[-1] in ("won", "lost")
    assert "length" in ended and "max_turns" not in ended and metrics == {}


def test_a_reply_cut_by_the_step_budget_is_an_invalid_action_not_an_error(miles_args):
    miles_args.rollout_max_response_len = 8  # the reply's tags never fit
    groups, metrics, _ = run_rollout(miles_args)
    for _key, trajectories in by_script(groups).items():
        for steps in trajectories:
            record = rollout_record(steps)
            assert (record.outcome, record.reason) == (Outcome.BUDGET_FAILURE, "turn_cap")
            assert steps[-1].metadata["invalid_actions"] == CAP == len(steps)
            assert {s.status.value for s in steps} == {"truncated"}
            assert all(s.response_length == 8 for s in steps)
    assert metrics == {}


def test_a_bad_row_is_a_counted_no_result_never_an_exception_miles_would_swallow(miles_args):
    """Miles' synchronous rollout logs an exception of a group's task and draws another
    group, counting nothing: the generate function returns the row aborted, with a reason."""
    from miles.rollout.base_types import GenerateFnInput
    from miles.utils.types import Sample

    from rescue.miles.textgame import drop_no_result, generate

    row = Sample(index=3, group_index=1, prompt="cooking:x", metadata={"env": "webshop"})
    state = types.SimpleNamespace(args=miles_args, tokenizer=None)
    out = asyncio.run(
        generate(GenerateFnInput(state=state, sample=row, sampling_params={}, evaluation=False))
    )
    assert out.samples.status == Sample.Status.ABORTED
    record = rollout_record(out.samples)
    assert (record.outcome, record.reason) == (Outcome.INFRA_NO_RESULT, "InputError")
    assert "env='webshop' is not a text game" in out.samples.metadata["engine_error"]
    assert drop_no_result(miles_args, [out.samples]).reason == "no_result_InputError"
