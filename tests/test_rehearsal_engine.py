"""The stand-in SGLang engine replies and fails as SGLang 0.5.x does; the offline tokenizer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from rescue.rehearsal.standins.engine import BEHAVIOURS, Engine, Model, main
from rescue.rehearsal.tiny.tokenizer import SPECIAL_TOKENS, build_model_dir

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
    return build_model_dir(tmp_path_factory.mktemp("model"), TEMPLATE, max_position_embeddings=4096)


def request(task: str = "Task 0: fix calc", **extra) -> dict:
    body = {
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": task}],
        "tools": TOOLS,
        "max_tokens": 512,
        "logprobs": True,
        "return_meta_info": True,
        "input_ids": list(range(40)),
    }
    body.update(extra)
    return body


def test_tokenizer_loads_as_qwen2_with_the_family_tokens_and_one_newline_token(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert type(tok).__name__.startswith("Qwen2Tokenizer")
    assert tok.eos_token == "<|im_end|>"
    assert len(tok.encode("\n", add_special_tokens=False)) == 1
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) != tok.unk_token_id
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["max_position_embeddings"] == 4096


def test_without_a_tool_call_parser_the_call_stays_text_in_content(model_dir):
    status, response, _ = Model(model_dir).chat(request())
    choice = response["choices"][0]
    assert status == 200
    assert choice["message"]["tool_calls"] is None
    assert '<tool_call>\n{"name": "bash"' in choice["message"]["content"]
    assert "<think>" in choice["message"]["content"]  # no reasoning parser either
    assert choice["finish_reason"] == "stop"


def test_qwen25_parser_moves_the_call_to_tool_calls_and_finish_reason_to_tool_calls(model_dir):
    model = Model(model_dir, tool_call_parser="qwen25", reasoning_parser="qwen3")
    status, response, record = model.chat(request())
    assert status == 200
    message = response["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and len(call["id"]) == len("call_") + 24
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "cat calc.py"}
    assert "<tool_call>" not in message["content"] and "[plan" in message["content"]
    assert message["reasoning_content"].strip() == "Turn 1."
    assert response["choices"][0]["finish_reason"] == "tool_calls"
    assert record["tool_calls"] and record["behaviour"] == "solve"


def test_no_tools_in_the_request_means_no_tool_parsing(model_dir):
    model = Model(model_dir, tool_call_parser="qwen25")
    _, response, _ = model.chat(request(tools=None))
    assert response["choices"][0]["message"]["tool_calls"] is None


def test_meta_info_has_one_logprob_per_completion_token_and_the_weight_version(model_dir):
    model = Model(model_dir, tool_call_parser="qwen25")
    model.weight_version = "7"
    _, response, _ = model.chat(request())
    meta = response["choices"][0]["meta_info"]
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert meta["weight_version"] == "7" and meta["prompt_tokens"] == 40
    assert meta["output_token_logprobs"][-1][1] == model.tokenizer.token_to_id("<|im_end|>")
    _, plain, _ = model.chat(request(return_meta_info=False))
    assert "meta_info" not in plain["choices"][0]


def test_a_prompt_that_does_not_fit_the_context_is_sglangs_400(model_dir):
    model = Model(model_dir)
    status, response, record = model.chat(request(input_ids=[1] * 4096))
    assert status == 400 and response["type"] == "BadRequestError"
    assert response["message"] == (
        "The input (4096 tokens) is longer than the model's context length (4096 tokens)."
    )
    status, response, _ = model.chat(request(input_ids=[1] * 4000, max_tokens=200))
    assert status == 400
    assert response["message"].startswith(
        "Requested token count exceeds the model's maximum context length of 4096 tokens. "
        "You requested a total of 4200 tokens: 4000 tokens from the input messages and 200"
    )
    assert record["status"] == 400


def test_a_reply_cut_at_max_tokens_finishes_with_length(model_dir):
    model = Model(model_dir, mixture=("ramble",))
    _, response, _ = model.chat(request(max_tokens=30))
    meta = response["choices"][0]["meta_info"]
    assert response["choices"][0]["finish_reason"] == "length"
    assert meta["finish_reason"] == {"type": "length", "length": 30}
    assert meta["completion_tokens"] == 30


def test_context_length_defaults_to_the_checkpoint_and_can_be_set(model_dir):
    assert Model(model_dir).context_length == 4096
    assert Model(model_dir, context_length=1000).context_length == 1000


def test_each_new_trial_of_a_task_takes_the_next_behaviour_and_keeps_it(model_dir):
    model = Model(model_dir, tool_call_parser="qwen25")
    firsts = [model.chat(request())[2]["behaviour"] for _ in range(4)]
    assert firsts == ["solve", "wrong", "loop", "overrun"]
    assert model.chat(request(task="Task 1: other"))[2]["behaviour"] == "solve"
    # a later turn of the "loop" trial carries its plan back in the assistant message
    _, first, _ = Model(model_dir, mixture=("loop",)).chat(request())
    said = first["choices"][0]["message"]
    later = request()
    later["messages"] += [said, {"role": "tool", "content": "ok", "tool_call_id": "x"}]
    behaviour, turn = model.behaviour_of(later["messages"])
    assert (behaviour, turn) == ("loop", 1)


def test_overrun_replies_grow_the_context_until_the_400(model_dir):
    model = Model(model_dir, tool_call_parser="qwen25", mixture=("overrun",))
    _, response, _ = model.chat(request(max_tokens=2000))
    assert response["choices"][0]["meta_info"]["completion_tokens"] > 4096 // 5 - 10
    assert response["choices"][0]["finish_reason"] == "tool_calls"


def test_the_scripts_submit_a_fix_and_a_wrong_fix():
    assert BEHAVIOURS["solve"][-1].startswith("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    assert "a + b" in BEHAVIOURS["solve"][1] and "a * b" in BEHAVIOURS["wrong"][1]


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"tool_call_parser": "hermes"}, "--tool-call-parser"),
        ({"reasoning_parser": "deepseek"}, "--reasoning-parser"),
        ({"mixture": ("solve", "fly")}, "--mixture"),
    ],
)
def test_bad_settings_name_the_flag(model_dir, kwargs, named):
    with pytest.raises(ValueError, match=named):
        Model(model_dir, **kwargs)


def test_cli_refuses_an_unknown_parser_in_one_line(model_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model-path", str(model_dir), "--tool-call-parser", "nope"])
    assert e.value.code == 2 and "--tool-call-parser" in capsys.readouterr().err


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_endpoints_miles_calls(model_dir, tmp_path):
    record = tmp_path / "turns.jsonl"
    engine = Engine(
        Model(model_dir, tool_call_parser="qwen25"), port=0, base_gpu_id=1, record=record
    ).start()
    base = f"http://127.0.0.1:{engine.port}"
    try:
        for path in ("/health", "/health_generate", "/flush_cache"):
            assert _get(base + path) == {}
        info = _get(base + "/get_server_info")
        assert info["port"] == engine.port and info["base_gpu_id"] == 1
        assert {"host", "nnodes", "node_rank", "gpu_id_step", "tp_size", "dp_size"} <= set(info)
        assert info["tool_call_parser"] == "qwen25"
        assert _get(base + "/model_info")["weight_version"] == "default"
        assert _post(base + "/update_weight_version", {"new_version": "3"})[0] == 200
        assert _get(base + "/get_weight_version")["weight_version"] == "3"
        status, gen = _post(
            base + "/generate",
            {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}},
        )
        assert status == 200 and gen["meta_info"]["finish_reason"]["type"] == "length"
        assert len(gen["output_ids"]) == 8 and gen["meta_info"]["weight_version"] == "3"
        status, chat = _post(base + "/v1/chat/completions", request())
        assert status == 200 and chat["choices"][0]["meta_info"]["weight_version"] == "3"
        status, err = _post(base + "/v1/chat/completions", request(input_ids=[1] * 5000))
        assert status == 400 and "context length" in err["message"]
        for path in ("/abort_request", "/pause_generation", "/continue_generation"):
            assert _post(base + path, {"abort_all": True})[0] == 200
        assert _post(base + "/no_such_thing", {})[0] == 404
    finally:
        engine.close()
    turns = [json.loads(line) for line in record.read_text().splitlines()]
    assert [t["status"] for t in turns] == [200, 400]


def test_the_engine_dies_as_sglang_dies_a_request_in_flight_reset_and_the_port_refused(
    model_dir, tmp_path
):
    """SIGUSR1: a request in flight gets no reply, its connection reset; the process is gone
    (status 137) and the port refuses every later connection."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from rescue.rehearsal.miles.command import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rescue.rehearsal.standins.engine", "--port", str(port),
         "--model-path", str(model_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert "engine ready" in proc.stdout.readline()
        body = json.dumps(request()).encode()
        conn = socket.create_connection(("127.0.0.1", port))
        # the request's head and half its body: the engine is reading it when it dies
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body[: len(body) // 2])  # fmt: skip
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGUSR1)
        assert proc.wait(timeout=30) == 137
        with pytest.raises(ConnectionResetError):  # no reply, not even a clean close
            conn.recv(1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
