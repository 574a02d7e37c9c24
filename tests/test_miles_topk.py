"""The top-K recorder with the real Miles source: the heads SGLang returns, aligned to the
samples Miles assembles.

SGLang is the rehearsal's stand-in engine (``rescue.rehearsal.engine``: SGLang 0.5.x's
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
    from rescue.rehearsal.tokenizer import build_model_dir

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
    from rescue.rehearsal.model import SAMPLED_LOGPROB, Model

    m = Model(model_dir, tool_call_parser="qwen25")
    body = {"messages": [{"role": "user", "content": "Task 1"}], "tools": TOOLS,
            "max_tokens": 200, "input_ids": list(range(30)), "return_meta_info": True}  # fmt: skip
    _, plain, _ = m.chat({**body, "top_logprobs": K})  # no logprobs: nothing (return_logprob)
    assert "output_top_logprobs" not in plain["choices"][0]["meta_info"]
    _, reply, _ = m.chat({**body, "logprobs": True, "top_logprobs": K})
    meta = reply["choices"][0]["meta_info"]
    assert len(meta["output_top_logprobs"]) == meta["completion_tokens"]
    for (lp, y, _), head in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True):
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
        observation = tokenizer.encode(f"<|im_end|>\n<|im_start|>user\nobservation {turn}<|im_end|>\n<|im_start|>assistant\n")
        messages += [response["choices"][0]["message"], {"role": "tool", "content": f"observation {turn}"}]
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

    from rescue.rehearsal.model import Model

    return Model(model_dir, tool_call_parser="qwen25"), AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("trim_eos", [False, True])
def test_heads_align_to_the_assembled_multi_turn_sample(env, session_parts, trim_eos):
    from rescue.miles.topk import align_records, token_digest

    model, tok = session_parts
    args = make_args()
    records, accumulated = session_records(model, tok, 3, trim_eos=trim_eos)
    sample = assemble(args, records, tok, accumulated, max_trim=1 if trim_eos else 0)
    assert sum(1 for t, m in enumerate(sample.loss_mask) if m and (t == 0 or not sample.loss_mask[t - 1])) == 3
    dumped = [r.model_dump(mode="json") for r in records]  # as GET /sessions/{id} returns them
    heads = align_records(dumped, sample.tokens, sample.response_length, sample.loss_mask, K, args)
    check_heads(sample, heads)
    assert heads["digest"] == token_digest(sample.tokens)


def test_heads_follow_a_truncated_last_turn_and_dropped_turns(env, session_parts):
    from rescue.miles.topk import align_records

    model, tok = session_parts
    args = make_args()
    records, accumulated = session_records(model, tok, 3, trim_eos=False)
    turn2_end = len(records[1].request["input_ids"]) + len(
        records[1].response["choices"][0]["meta_info"]["output_token_logprobs"]
    )
    sample = assemble(args, records, tok, accumulated, max_trim=0, max_seq_len=turn2_end - 4)
    runs = sum(1 for t, m in enumerate(sample.loss_mask) if m and (t == 0 or not sample.loss_mask[t - 1]))
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
        align_records(dumped[::-1], sample.tokens, sample.response_length, sample.loss_mask, K, args)
    with pytest.raises(InputError, match="2 runs of trained tokens but its session recorded 1"):
        align_records(dumped[:1], sample.tokens, sample.response_length, sample.loss_mask, K, args)
    hot = [dict(d, request={**d["request"], "temperature": 1.3}) for d in dumped]
    with pytest.raises(InputError, match="chat request 0 of the session: temperature 1.3"):
        align_records(hot, sample.tokens, sample.response_length, sample.loss_mask, K, args)


# ── the single-turn /generate path through Miles' own helpers ────────────────────────────


@pytest.fixture
def engine(model_dir):
    from rescue.rehearsal.engine import Engine, Model

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
    state = SimpleNamespace(args=args, tokenizer=AutoTokenizer.from_pretrained(model_dir), processor=None)
    params = compute_sampling_params(args, temperature=args.rollout_temperature, top_p=args.rollout_top_p,
                                     top_k=args.rollout_top_k, max_new_tokens=args.rollout_max_response_len)  # fmt: skip
    out = asyncio.run(generate(GenerateFnInput(state=state, sample=sample, sampling_params=params, evaluation=False)))
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
        run_generate(generate_args(engine, rollout_top_p=0.9), model_dir, Sample(index=3, prompt="x"))
