"""The top-K recorder with the real Miles source: the heads SGLang returns, aligned to the
samples Miles assembles.

SGLang is the rehearsal's stand-in engine (``rescue.rehearsal.standins.engine``: SGLang 0.5.x's
reply layout, ``meta_info.output_top_logprobs`` included); the samples are assembled by
Miles' own code: ``single_turn``'s helpers for ``/generate``, and for the session path the
session server's ``compute_samples_from_openai_records``, ``truncate_samples_by_total_tokens``
and ``merge_samples`` on records shaped as ``SessionCore`` stores them.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest
from miles_env import require_miles

K = 5
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("tokenizers")
    from rescue.rehearsal.tiny.tokenizer import build_model_dir

    return build_model_dir(tmp_path_factory.mktemp("model"), TEMPLATE, max_position_embeddings=4096)


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("RESCUE_SC_TOP_K", str(K))
    monkeypatch.delenv("RESCUE_SC_CAP", raising=False)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    return monkeypatch


def make_args(**overrides):
    base = dict(
        loss_type="custom_loss",
        custom_loss_function_path="rescue.miles.sc_loss.policy_loss",
        custom_generate_function_path="rescue.miles.topk.agentic_generate",
        custom_rollout_log_function_path="rescue.miles.log.log_rollout",
        custom_megatron_before_train_step_hook_path="rescue.miles.train_step.before_train_step",
        advantage_estimator="grpo",
        rollout_temperature=0.8,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        qkv_format="thd",
        use_session_server=True,
        use_miles_router=False,
        save_debug_trajectory_data=None,
        sglang_speculative_algorithm=None,
        use_rollout_routing_replay=False,
        use_rollout_indexer_replay=False,
        num_layers=1,
    )
    return SimpleNamespace(**{**base, **overrides})


# ── SGLang's layout ──────────────────────────────────────────────────────────────────────


def test_head_rows_read_sglangs_layout_and_pad_a_short_head():
    from rescue.miles.topk import head_rows

    sampled = [[-0.5, 7, "a"], [-1.0, 3, "b"]]
    top = [[[-0.5, 7, "a"], [-2.0, 1, "c"]], [[-0.9, 2, None], [-1.0, 3, None], [-3.0, 4, None]]]
    ids, lps = head_rows(top, sampled, 3, "here")
    assert ids.tolist() == [[7, 1, -1], [2, 3, 4]]
    np.testing.assert_allclose(lps, [[-0.5, -2.0, 0.0], [-0.9, -1.0, -3.0]])


@pytest.mark.parametrize(
    ("top", "message"),
    [
        (None, "no meta_info.output_top_logprobs"),
        ([[[-0.5, 7, None]]], "1 rows of output_top_logprobs for 2 output tokens"),
        ([[[-0.5, 7, None]], None], "output position 1 has no head"),
        ([[[-0.5, 7, None]], [[-0.2, 3, None]]], "not one distribution"),
        ([[[-0.5, 7, None]], [[-1.0, 3, None]] * 4], "4 head entries, K=3"),
    ],
)
def test_head_rows_refuse_what_sglang_would_not_send(top, message):
    from rescue.errors import InputError
    from rescue.miles.topk import head_rows

    with pytest.raises(InputError, match=message):
        head_rows(top, [[-0.5, 7, None], [-1.0, 3, None]], 3, "here")


def test_the_stand_in_engine_answers_top_logprobs_as_sglang(model_dir):
    from rescue.rehearsal.standins.model import SAMPLED_LOGPROB, Model

    m = Model(model_dir, tool_call_parser="qwen25")
    body = {"messages": [{"role": "user", "content": "Task 1"}], "tools": TOOLS,
            "max_tokens": 200, "input_ids": list(range(30)), "return_meta_info": True}  # fmt: skip
    _, plain, _ = m.chat({**body, "top_logprobs": K})  # no logprobs: nothing (return_logprob)
    assert "output_top_logprobs" not in plain["choices"][0]["meta_info"]
    _, reply, _ = m.chat({**body, "logprobs": True, "top_logprobs": K})
    meta = reply["choices"][0]["meta_info"]
    assert len(meta["output_top_logprobs"]) == meta["completion_tokens"]
    for (lp, y, _), head in zip(
        meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert len(head) == K and head[0][:2] == [lp, y] and lp == SAMPLED_LOGPROB
        assert all(isinstance(e[2], str) for e in head)  # chat: return_text_in_logprobs
        assert [e[0] for e in head] == sorted((e[0] for e in head), reverse=True)
        assert sum(np.exp(e[0]) for e in head) < 1  # a tail is left
    top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(top) == K and "token" in top[0]  # the OpenAI form: strings, not ids


# ── requests whose log-probs are not q ───────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"temperature": 1.0}, "per-call temperature change"),
        ({"temperature": None}, "temperature None"),
        ({"top_p": 0.95}, "top_p < 1"),
        ({"top_k": 20}, "top_k > 0"),
        ({"min_p": 0.05}, "min_p > 0"),
        ({"logit_bias": {"3": 2.0}}, "logit_bias"),
        ({"regex": "a+"}, "regex"),
        ({"json_schema": "{}"}, "json_schema"),
        ({"response_format": {"type": "json_object"}}, "constrained decoding"),
        ({"tools": [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]}, "strict"),
        ({"tool_choice": "required"}, "forces a call"),
        ({"top_logprobs": 3}, "head of 3 entries"),
    ],
)
def test_a_request_that_does_not_sample_from_q_is_refused(change, message):
    from rescue.errors import InputError
    from rescue.miles.sc_flags import check_request

    good = {"temperature": 0.8, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "tools": TOOLS,
            "tool_choice": "auto", "logprobs": True, "top_logprobs": K}  # fmt: skip
    check_request(good, make_args(), K, "chat request 0")
    with pytest.raises(InputError, match=message):
        check_request({**good, **change}, make_args(), K, "chat request 0")
    payload = {"sampling_params": {"temperature": 0.8, "top_p": 0.5}, "top_logprobs_num": K}
    with pytest.raises(InputError, match="top_p < 1"):
        check_request(payload, make_args(), K, "the /generate request")


def test_more_than_twenty_on_the_chat_path_needs_the_miles_router(env):
    from rescue.errors import InputError
    from rescue.miles.sc_flags import check_sc_flags

    env.setenv("RESCUE_SC_TOP_K", "21")
    with pytest.raises(InputError, match="--use-miles-router"):
        check_sc_flags(make_args())
    check_sc_flags(make_args(use_miles_router=True))
    check_sc_flags(make_args(custom_generate_function_path="rescue.miles.topk.generate"))
    for bad in ("0", "x", "-3"):
        env.setenv("RESCUE_SC_TOP_K", bad)
        with pytest.raises(InputError, match="RESCUE_SC_TOP_K"):
            check_sc_flags(make_args())


# ── the session path: records -> Miles' assembly -> aligned heads ────────────────────────


def session_records(model, tokenizer, turns, *, trim_eos, temperature=0.8):
    """Records of a linear session as ``SessionCore.chat_completions`` stores them, and the
    session's accumulated tokens. Each turn's prompt is the previous prompt, its output (the
    EOS dropped when ``trim_eos``: the template renders its own) and an observation."""
    from miles.rollout.session.types import SessionRecord

    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "Task 7: fix"}]
    prompt = tokenizer.encode("<|im_start|>user\nTask 7: fix<|im_end|>\n<|im_start|>assistant\n")
    records = []
    for turn in range(turns):
        body = {"messages": list(messages), "tools": TOOLS, "temperature": temperature,
                "top_p": 1.0, "max_tokens": 300, "logprobs": True, "top_logprobs": K,
                "return_meta_info": True, "no_stop_trim": False, "input_ids": list(prompt)}  # fmt: skip
        status, response, _ = model.chat(body)
        assert status == 200
        now = time.time()
        records.append(SessionRecord(timestamp=now, request_timestamp=now, method="POST",
                                     path="/v1/chat/completions", status_code=200,
                                     request=body, response=response))  # fmt: skip
        out = [t[1] for t in response["choices"][0]["meta_info"]["output_token_logprobs"]]
        kept = out[:-1] if trim_eos else out
        # trim_eos: the template renders the turn's end itself, so the session trims the EOS
        end = "" if trim_eos else "<|im_end|>"
        observation = tokenizer.encode(
            f"{end}\n<|im_start|>user\nobservation {turn}<|im_end|>\n<|im_start|>assistant\n"
        )
        messages += [
            response["choices"][0]["message"],
            {"role": "tool", "content": f"observation {turn}"},
        ]
        accumulated = list(prompt) + out
        prompt = list(prompt) + kept + observation
    return records, accumulated


def assemble(args, records, tokenizer, accumulated, *, max_trim, max_seq_len=None):
    """Miles' session assembly (``SessionCore.collect_samples``)."""
    from miles.rollout.generate_utils.sample_utils import merge_samples
    from miles.rollout.session.samples.merge import (
        compute_samples_from_openai_records,
        truncate_samples_by_total_tokens,
    )

    samples = compute_samples_from_openai_records(
        args, records, tokenizer, accumulated_token_ids=accumulated, max_trim_tokens=max_trim
    )
    if max_seq_len is not None:
        samples = truncate_samples_by_total_tokens(samples, max_seq_len, tokenizer)
    return merge_samples(samples, tokenizer)


def check_heads(sample, heads):
    """Independently: every trained token has a head whose first entry is that token with
    the sampled log-prob (the stand-in's layout), and nothing else has one."""
    prompt = len(sample.tokens) - sample.response_length
    trained = [t for t, m in enumerate(sample.loss_mask) if m]
    assert heads["positions"].tolist() == trained
    assert heads["ids"].shape == (len(trained), K)
    for row, t in enumerate(trained):
        assert heads["ids"][row, 0] == sample.tokens[prompt + t]
        assert heads["logprobs"][row, 0] == pytest.approx(sample.rollout_log_probs[t])


@pytest.fixture
def session_parts(model_dir):
    require_miles()
    from transformers import AutoTokenizer

    from rescue.rehearsal.standins.model import Model

    return Model(model_dir, tool_call_parser="qwen25"), AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("trim_eos", [False, True])
def test_heads_align_to_the_assembled_multi_turn_sample(env, session_parts, trim_eos):
    from rescue.miles.topk import align_records, token_digest

    model, tok = session_parts
    args = make_args()
    records, accumulated = session_records(model, tok, 3, trim_eos=trim_eos)
    sample = assemble(args, records, tok, accumulated, max_trim=1 if trim_eos else 0)
    assert (
        sum(
            1
            for t, m in enumerate(sample.loss_mask)
            if m and (t == 0 or not sample.loss_mask[t - 1])
        )
        == 3
    )
    dumped = [r.model_dump(mode="json") for r in records]  # as GET /sessions/{id} returns them
    heads = align_records(dumped, sample.tokens, sample.response_length, sample.loss_mask, K, args)
    check_heads(sample, heads)
    assert heads["digest"] == token_digest(sample.tokens)
    first_run = sample.loss_mask.index(0)
    outputs = len(records[0].response["choices"][0]["meta_info"]["output_token_logprobs"])
    assert first_run == outputs - (1 if trim_eos else 0)  # the trimmed EOS has no head


def test_heads_follow_a_truncated_last_turn_and_dropped_turns(env, session_parts):
    from rescue.miles.topk import align_records

    model, tok = session_parts
    args = make_args()
    records, accumulated = session_records(model, tok, 3, trim_eos=False)
    turn2_end = len(records[1].request["input_ids"]) + len(
        records[1].response["choices"][0]["meta_info"]["output_token_logprobs"]
    )
    sample = assemble(args, records, tok, accumulated, max_trim=0, max_seq_len=turn2_end - 4)
    runs = sum(
        1 for t, m in enumerate(sample.loss_mask) if m and (t == 0 or not sample.loss_mask[t - 1])
    )
    assert runs == 2  # turn 2 cut by 4 tokens, turn 3 dropped
    dumped = [r.model_dump(mode="json") for r in records]
    heads = align_records(dumped, sample.tokens, sample.response_length, sample.loss_mask, K, args)
    check_heads(sample, heads)


def test_records_that_are_not_the_samples_are_refused(env, session_parts):
    from rescue.errors import InputError
    from rescue.miles.topk import align_records

    model, tok = session_parts
    args = make_args()
    records, accumulated = session_records(model, tok, 2, trim_eos=False)
    sample = assemble(args, records, tok, accumulated, max_trim=0)
    dumped = [r.model_dump(mode="json") for r in records]
    with pytest.raises(InputError, match="not the sample's trained tokens"):
        align_records(
            dumped[::-1], sample.tokens, sample.response_length, sample.loss_mask, K, args
        )
    with pytest.raises(InputError, match="2 runs of trained tokens but its session recorded 1"):
        align_records(dumped[:1], sample.tokens, sample.response_length, sample.loss_mask, K, args)
    hot = [dict(d, request={**d["request"], "temperature": 1.3}) for d in dumped]
    with pytest.raises(InputError, match=r"chat request 0 of the session: temperature 1\.3"):
        align_records(hot, sample.tokens, sample.response_length, sample.loss_mask, K, args)


# ── the single-turn /generate path through Miles' own helpers ────────────────────────────


@pytest.fixture
def engine(model_dir):
    from rescue.rehearsal.standins.engine import Engine, Model

    e = Engine(Model(model_dir), port=0).start()
    yield e
    e.close()


def run_generate(args, model_dir, sample):
    import miles.utils.http_utils as http_utils
    from miles.rollout.base_types import GenerateFnInput
    from miles.rollout.inference_rollout.inference_rollout_common import compute_sampling_params
    from transformers import AutoTokenizer

    from rescue.miles.topk import generate

    http_utils._http_client = None
    http_utils.init_http_client(args)
    state = SimpleNamespace(
        args=args, tokenizer=AutoTokenizer.from_pretrained(model_dir), processor=None
    )
    params = compute_sampling_params(args, temperature=args.rollout_temperature, top_p=args.rollout_top_p,
                                     top_k=args.rollout_top_k, max_new_tokens=args.rollout_max_response_len)  # fmt: skip
    out = asyncio.run(
        generate(
            GenerateFnInput(state=state, sample=sample, sampling_params=params, evaluation=False)
        )
    )
    return out.samples


def generate_args(engine, **overrides):
    return make_args(
        custom_generate_function_path="rescue.miles.topk.generate",
        sglang_router_ip="127.0.0.1", sglang_router_port=engine.port, sglang_router_policy=None,
        rollout_num_gpus=1, rollout_num_gpus_per_engine=1, sglang_server_concurrency=4,
        eval_num_gpus=0, use_distributed_post=False, rollout_max_response_len=60,
        rollout_max_context_len=None, rollout_stop=None, rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False, **overrides,
    )  # fmt: skip


def test_single_turn_generate_records_the_head_of_every_position(env, model_dir, engine):
    require_miles()
    from miles.utils.types import Sample

    from rescue.miles.topk import KEY, token_digest

    args = generate_args(engine)
    sample = run_generate(args, model_dir, Sample(index=3, prompt="What is 2+2?"))
    heads = sample.metadata[KEY]
    assert sample.response_length > 5 and sample.loss_mask in (None, [1] * sample.response_length)
    sample.loss_mask = [1] * sample.response_length
    check_heads(sample, heads)
    assert heads["digest"] == token_digest(sample.tokens)
    assert engine.requests["/generate"] == 1


def test_single_turn_generate_refuses_a_resumed_response(env, model_dir, engine):
    require_miles()
    from miles.utils.types import Sample

    from rescue.errors import InputError

    args = generate_args(engine)
    sample = Sample(index=3, prompt="What is 2+2?", response="partial", tokens=[1, 2, 3])
    with pytest.raises(InputError, match="already has a response"):
        run_generate(args, model_dir, sample)
    with pytest.raises(InputError, match="--rollout-top-p"):
        run_generate(
            generate_args(engine, rollout_top_p=0.9), model_dir, Sample(index=3, prompt="x")
        )


# ── the agentic path: Miles' own agentic_tool_call.generate around the recorder ──────────
#
# The HTTP layer is replaced by an in-memory session (SESSION) that behaves as Miles'
# SessionCore (session/core.py): a chat request gets ``logprobs``, ``return_meta_info`` and
# ``no_stop_trim=False`` forced (``prepare_chat_request``) and TITO ``input_ids`` (the
# session's tokens plus the new messages), goes to the stand-in engine, and is stored as a
# SessionRecord; ``GET /sessions/{id}`` returns the records as ``get_session`` dumps them;
# the samples op runs Miles' own assembly and samples wire (``collect_samples``,
# ``encode_samples``, ``decode_samples_and_merge_input_sample``).

#: SGLang 0.5.23's ChatCompletionRequest fields Miles' build_chat_request_kwargs keeps.
CHAT_FIELDS = ["messages", "model", "logit_bias", "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens", "n", "response_format", "seed", "stop", "temperature", "top_p", "tools", "tool_choice", "top_k", "min_p", "min_tokens", "regex", "ebnf", "stop_token_ids", "no_stop_trim", "skip_special_tokens", "custom_logit_processor", "chat_template_kwargs"]  # fmt: skip
SESSION: dict = {}


class InMemorySession:
    def __init__(self, model, tokenizer, fail_get=False):
        self.model, self.tok, self.fail_get = model, tokenizer, fail_get
        self.records, self.token_ids, self.requests = [], None, []

    def chat(self, body):
        from miles.rollout.session.types import SessionRecord

        body = {**body, "logprobs": True, "return_meta_info": True, "no_stop_trim": False}
        last = body["messages"][-1]["content"]
        text = f"<|im_start|>user\n{last}<|im_end|>\n<|im_start|>assistant\n"
        new = self.tok.encode(text if self.token_ids is None else "\n" + text)
        body["input_ids"] = (self.token_ids or []) + new
        self.requests.append(body)
        status, response, _ = self.model.chat(body)
        assert status == 200
        out = [t[1] for t in response["choices"][0]["meta_info"]["output_token_logprobs"]]
        self.token_ids = body["input_ids"] + out
        now = time.time()
        self.records.append(SessionRecord(timestamp=now, request_timestamp=now, method="POST",
                                          path="/v1/chat/completions", status_code=200,
                                          request=body, response=response))  # fmt: skip
        return response

    async def collect(self, args, input_sample):
        from miles.rollout.generate_utils.sample_utils import merge_samples
        from miles.rollout.session.samples.codec import (
            decode_samples_and_merge_input_sample,
            encode_samples,
        )
        from miles.rollout.session.samples.merge import compute_samples_from_openai_records

        samples = compute_samples_from_openai_records(
            args, self.records, self.tok, accumulated_token_ids=self.token_ids, max_trim_tokens=1
        )
        payload = encode_samples([merge_samples(samples, self.tok)], {})
        return decode_samples_and_merge_input_sample(payload, input_sample)


async def scripted_agent(base_url, prompt, request_kwargs, metadata, **kwargs):
    """Two model calls with a tool result between them, as the SWE agent's turns."""
    session = SESSION["session"]
    messages = [{"role": "user", "content": "Task 7: fix calc"}]
    for turn in range(2):
        reply = session.chat({"messages": messages, "tools": TOOLS, **request_kwargs})
        messages += [reply["choices"][0]["message"], {"role": "tool", "content": f"ok {turn}"}]
    return {"agent_turns": 2}


@pytest.fixture
def agentic(env, session_parts, monkeypatch):
    import sys

    from pydantic import BaseModel, create_model

    import rescue.miles.topk as topk

    model, tok = session_parts
    SESSION["session"] = InMemorySession(model, tok)
    request = create_model("ChatCompletionRequest", __base__=BaseModel,
                           **{f: (object, None) for f in CHAT_FIELDS})  # fmt: skip
    protocol = sys.modules["sglang.srt.entrypoints.openai.protocol"]
    if getattr(protocol, "__file__", None) is None:  # miles_env's import-only stand-in
        monkeypatch.setattr(protocol, "ChatCompletionRequest", request, raising=False)
    from miles.rollout.generate_hub import agentic_tool_call

    monkeypatch.setattr(agentic_tool_call, "ChatCompletionRequest", request)

    class Tracer:
        session_server_instance_id = None
        session_server_id = "127.0.0.1:1"
        base_url = "http://127.0.0.1:1/sessions/s1"
        session_id = "s1"

        @staticmethod
        async def create(args):
            return Tracer()

        async def collect_samples(self, input_sample, **kwargs):
            return await SESSION["session"].collect(args_seen[-1], input_sample)

    args_seen = []

    async def records(base_url):
        if SESSION["session"].fail_get:
            raise OSError("connection reset")
        assert base_url == Tracer.base_url
        return [r.model_dump(mode="json") for r in SESSION["session"].records]

    monkeypatch.setattr(agentic_tool_call, "OpenAIEndpointTracer", Tracer)
    monkeypatch.setattr(topk, "_session_records", records)
    return args_seen


def run_agentic(args_seen, **overrides):
    from miles.rollout.base_types import GenerateFnInput
    from miles.rollout.inference_rollout.inference_rollout_common import compute_sampling_params
    from miles.utils.types import Sample

    from rescue.miles.topk import agentic_generate

    args = make_args(custom_agent_function_path="test_miles_topk.scripted_agent",
                     session_server_ip="127.0.0.1", session_server_ports=[1], max_seq_len=None,
                     rollout_stop=None, rollout_stop_token_ids=None,
                     rollout_skip_special_tokens=False, **overrides)  # fmt: skip
    args_seen.append(args)
    params = compute_sampling_params(args, temperature=args.rollout_temperature, top_p=1.0,
                                     top_k=-1, max_new_tokens=300)  # fmt: skip
    state = SimpleNamespace(args=args)
    sample = Sample(index=4, prompt="Task 7: fix calc")
    out = asyncio.run(
        agentic_generate(
            GenerateFnInput(state=state, sample=sample, sampling_params=params, evaluation=False)
        )
    )
    return args, out.samples  # fmt: skip


def test_agentic_generate_records_every_calls_head_through_miles_own_generate(agentic):
    from rescue.miles.topk import KEY, RECORDING_AGENT_PATH, token_digest

    args, sample = run_agentic(agentic)
    session = SESSION["session"]
    assert [r["top_logprobs"] for r in session.requests] == [K, K]  # asked of SGLang
    assert all(r["temperature"] == 0.8 for r in session.requests)
    heads = sample.metadata[KEY]
    check_heads(sample, heads)
    assert heads["digest"] == token_digest(sample.tokens)
    assert sample.metadata["agent_turns"] == 2  # Miles merged the agent's metadata
    # the user's agent ran through the recording wrapper; the run's own args are untouched
    assert args.custom_agent_function_path == "test_miles_topk.scripted_agent"
    assert args.custom_agent_function_path != RECORDING_AGENT_PATH


def test_records_that_cannot_be_read_abort_the_sample_never_train_it(agentic):
    from miles.utils.types import Sample

    from rescue.miles.topk import ERROR_KEY, KEY

    SESSION["session"].fail_get = True
    _, sample = run_agentic(agentic)
    assert sample.status == Sample.Status.ABORTED and KEY not in sample.metadata
    assert "connection reset" in sample.metadata[ERROR_KEY]


def test_the_recording_agent_only_runs_inside_the_recorder():
    from rescue.errors import InputError
    from rescue.miles.topk import recording_agent

    with pytest.raises(InputError, match="runs only inside"):
        asyncio.run(recording_agent("http://x", "p", {}, {}))


# ── recorded samples through Miles' loss path (what the training rehearsal will run) ─────


def test_recorded_samples_train_through_miles_loss_path(agentic, model_dir, engine, monkeypatch):
    """Samples recorded by both recorders (single-turn /generate, and the agentic path's two
    model calls), published by the log function, trained by Miles' loss_function with the
    SC loss: the gradient equals the paper's formula on the recorded heads."""
    from miles.utils.types import Sample
    from test_miles_sc_loss import make_args as loss_args
    from test_miles_sc_loss import reference_grad, run_pipeline

    single = [
        run_generate(generate_args(engine), model_dir, Sample(index=i, prompt=f"What is {i}+2?"))
        for i in range(2)
    ]
    agentic_samples = []
    for _ in range(2):
        SESSION["session"] = InMemorySession(SESSION["session"].model, SESSION["session"].tok)
        agentic_samples.append(run_agentic(agentic)[1])
    samples = [*single, *agentic_samples]
    for i, (s, r) in enumerate(zip(samples, [1.0, 0.0, 0.0, 1.0], strict=True)):
        s.group_index, s.index, s.rollout_id, s.reward = i // 2, i, i, r
        s.loss_mask = s.loss_mask or [1] * s.response_length
        s.status = Sample.Status.COMPLETED
    assert sum(1 for m in np.diff([0, *agentic_samples[0].loss_mask]) if m == 1) == 2  # 2 turns
    vocab = 1 + max(max(s.tokens) for s in samples)
    vocab = max(vocab, 1 + max(int(s.metadata["rescue_topk"]["ids"].max()) for s in samples))
    theta0 = np.random.default_rng(0).normal(size=(vocab, vocab)) * 0.5
    args = loss_args(rollout_temperature=0.8, _reward_hook=False, max_tokens_per_gpu=4096,
                     n_samples_per_prompt=2, rollout_batch_size=2, global_batch_size=4,
                     custom_generate_function_path="rescue.miles.topk.agentic_generate")  # fmt: skip
    got, stats, published = run_pipeline(args, samples, theta0, dp_size=2, cp_size=2, rollout_id=77)
    advantages = [
        np.full(s.response_length, a) for s, a in zip(samples, [1, -1, -1, 1], strict=True)
    ]
    want = reference_grad(
        samples, [a / np.sqrt(2) for a in advantages], theta0, cap=2.0, temperature=0.8
    )  # fmt: skip  (GRPO: ±½ over the std √½)
    np.testing.assert_allclose(got, want, rtol=5e-4, atol=5e-5)
    assert published["rollout/rescue/sc/published"] == 4
    assert stats[0] == sum(sum(s.loss_mask) for s in samples)
