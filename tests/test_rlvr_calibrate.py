"""The cap calibration against a stand-in SGLang ``/generate`` (``sglang_generate``)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from sglang_generate import EOS, GenerateServer, write_tokenizer

from rescue.cli import main as rescue_main
from rescue.errors import InputError
from rescue.rlvr import calibrate as cal

pytest.importorskip("transformers")

PROMPTS = 12
#: The k-th response of prompt i has 100 + 300 k + 50 (i mod 3) tokens (stop token included).
N = 4


def natural(ids, k: int) -> int:
    i = ids[ids.index(3) + 1] - 4  # "question" is token 3, the prompt's number 100 + i is 4 + i
    return 100 + 300 * k + 50 * (i % 3)


def expected_rate(cap: int) -> float:
    cut = [sum(100 + 300 * k + 50 * (i % 3) >= cap for k in range(N)) / N for i in range(PROMPTS)]
    return sum(cut) / PROMPTS


@pytest.fixture
def setup(tmp_path):
    """(prompt JSONL, tokenizer folder, the words of each prompt)."""
    words = ["question"] + [str(100 + i) for i in range(PROMPTS)] + ["user", "assistant", "w"]
    tokenizer = write_tokenizer(tmp_path / "tok", words)
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"prompt": [{"role": "user", "content": f"question {100 + i}"}], "label": "1"}
            )
            + "\n"
            for i in range(PROMPTS)
        )
    )
    return data, tokenizer


def run(data: Path, tokenizer: Path, url: str, out: Path, caps: str, **extra: str) -> int:
    argv = [
        "rlvr",
        "calibrate",
        "--data",
        str(data),
        "--model",
        str(tokenizer),
        "--base-url",
        url,
        "--caps",
        caps,
        "--out",
        str(out),
        "--prompts",
        str(PROMPTS),
        "--n",
        str(N),
        "--concurrency",
        "8",
    ]
    for k, v in extra.items():
        argv += [f"--{k}", v]
    return rescue_main(argv)


def test_the_smallest_cap_in_the_window_is_written_with_every_rate(setup, tmp_path, capsys):
    data, tokenizer = setup
    out = tmp_path / "cap.json"
    with GenerateServer(natural) as server:
        code = run(data, tokenizer, server.url, out, "256 512 768 1024", temperature="0.8")
    assert code == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    rates = {r["cap"]: r["rate"] for r in record["rates"]}
    assert rates == pytest.approx({c: expected_rate(c) for c in (256, 512, 768, 1024)})
    # 256: 0.75, 512: 0.5, 768: 1/3 (in [0.2, 0.4]), 1024: 1/6
    assert record["cap"] == 768 and record["rate"] == pytest.approx(1 / 3)
    assert record["model"] == str(tokenizer) and record["data"] == str(data)
    assert (record["prompts"], record["n"], record["window"]) == (PROMPTS, N, [0.2, 0.4])
    assert "cap 768 (truncated 33.3%) written" in capsys.readouterr().out
    # one pass at the largest cap, PROMPTS x N responses, sampled as Miles samples
    assert len(server.requests) == PROMPTS * N
    params = server.requests[0]["sampling_params"]
    assert params == {
        "temperature": 0.8,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 1024,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


def test_prompts_are_rendered_with_the_chat_template_and_encoded_without_special_tokens(setup):
    data, tokenizer = setup
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    prompts = cal.read_prompts(data, PROMPTS, seed=1)
    ids = cal.encode_prompts(str(tokenizer), prompts)
    text = tok.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "question" in text
    assert ids[0] == tok.encode(text, add_special_tokens=False)
    assert ids[0][0] == 1  # <|im_start|>, no BOS added


def test_one_pass_at_the_largest_cap_equals_sampling_at_each_cap(setup):
    """Under the stand-in, whose k-th response of a prompt is the same whatever the cap,
    the rates read from one pass equal the share of ``length`` finishes at each cap."""
    data, tokenizer = setup
    ids = cal.encode_prompts(str(tokenizer), cal.read_prompts(data, PROMPTS, seed=1))
    caps = [256, 400, 700, 1000, 1100]
    with GenerateServer(natural) as server:
        lengths = cal.sample_lengths(
            ids, n=N, max_cap=max(caps), temperature=1.0, base_url=server.url, progress=False
        )
    one_pass = {r.cap: r.rate for r in cal.truncation_rates(lengths, caps)}
    for cap in caps:
        with GenerateServer(natural) as server:
            cut = 0
            for prompt in ids:
                for _ in range(N):
                    reply = cal.post_generate(
                        server.url,
                        {"input_ids": prompt, "sampling_params": cal.sampling_params(1.0, cap)},
                        30,
                    )
                    cut += reply["meta_info"]["finish_reason"]["type"] == "length"
        assert one_pass[cap] == pytest.approx(cut / (PROMPTS * N)), cap


def test_a_stop_token_at_the_cap_reports_length_as_sglang_does(setup):
    """400 tokens with the stop token last: SGLang checks the length first, so at cap 400 the
    response is truncated (Miles' TRUNCATED), and so is it in the one-pass reading."""
    with GenerateServer(lambda ids, k: 400) as server:
        reply = cal.post_generate(
            server.url, {"input_ids": [1, 2], "sampling_params": cal.sampling_params(1, 400)}, 30
        )
        assert reply["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
        reply = cal.post_generate(
            server.url, {"input_ids": [1, 2], "sampling_params": cal.sampling_params(1, 800)}, 30
        )
    assert reply["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    length = cal.response_length(reply, 800)
    assert length == (400, False)
    (rate,) = cal.truncation_rates([[length]], [400])
    assert rate.rate == 1.0


def test_no_cap_in_the_window_is_refused_showing_every_rate(setup, tmp_path, capsys):
    data, tokenizer = setup
    out = tmp_path / "cap.json"
    with GenerateServer(natural) as server:
        code = run(data, tokenizer, server.url, out, "256 512 1024")
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "rescue rlvr: error: no candidate cap has a truncation rate in [0.2, 0.4]:\n" in err
    for cap, rate in ((256, "75.0%"), (512, "50.0%"), (1024, "16.7%")):
        assert re.search(rf"cap +{cap}: truncated +{re.escape(rate)}", err), (cap, err)
    assert "above" in err and "below" in err and "set CAL_CAPS" in err


def test_the_window_is_a_setting(setup, tmp_path):
    data, tokenizer = setup
    out = tmp_path / "cap.json"
    with GenerateServer(natural) as server:
        assert run(data, tokenizer, server.url, out, "256 512 768", low="0.45", high="0.6") == 0
    assert json.loads(out.read_text())["cap"] == 512


def test_an_engine_error_is_not_a_length_and_writes_nothing(setup, tmp_path, capsys):
    data, tokenizer = setup
    out = tmp_path / "cap.json"
    with GenerateServer(natural, context_length=500) as server:
        code = run(data, tokenizer, server.url, out, "256 512")
    assert code == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "the engine failed: prompt " in err
    assert "HTTP 400" in err and "maximum context length of 500 tokens" in err


def test_an_abort_is_an_engine_error():
    reply = {
        "meta_info": {
            "finish_reason": {"type": "abort", "message": "Abort before prefill"},
            "completion_tokens": 0,
        }
    }
    with pytest.raises(cal.EngineError, match="aborted the request: Abort before prefill"):
        cal.response_length(reply, 100)
    with pytest.raises(cal.EngineError, match="without meta_info"):
        cal.response_length({"text": "x"}, 100)


def test_the_interval_is_students_t_over_prompts():
    from scipy import stats

    # three prompts, truncated fractions 0, 0.5, 1 at cap 10
    lengths = [[(5, False), (6, False)], [(5, False), (12, False)], [(10, True), (20, True)]]
    (r,) = cal.truncation_rates(lengths, [10])
    half = stats.t.ppf(0.975, 2) * 0.5 / math.sqrt(3)
    assert r.rate == pytest.approx(0.5)
    assert (r.low, r.high) == pytest.approx((max(0, 0.5 - half), min(1, 0.5 + half)))


@pytest.mark.parametrize(
    ("caps", "message"), [("512 x", "'x' is not a positive integer"), ("", "--caps is empty")]
)
def test_bad_caps_are_refused(caps, message):
    with pytest.raises(InputError, match=message):
        cal.parse_caps(caps)


def test_read_cap_refuses_other_data_and_a_missing_file(tmp_path):
    path = tmp_path / "cap.json"
    with pytest.raises(InputError, match="no cap file"):
        cal.read_cap(path)
    cal.write_cap_file(path, cal.CapRate(512, 0.3, 0.2, 0.4), [], model="/m", data="/d")
    assert cal.read_cap(path, model="/m", data="/d") == 512
    with pytest.raises(InputError, match="calibrated with data /d, not /e"):
        cal.read_cap(path, model="/m", data="/e")


# ── the CPU rehearsal's stand-in engine ─────────────────────────────────────────────────


@pytest.fixture(scope="module")
def rehearsal_engine(tmp_path_factory):
    """The rehearsal's stand-in SGLang engine (``rescue.rehearsal.standins.engine``) on a free port,
    with its offline Qwen-style tokenizer; its ``/generate`` answers every prompt with the
    same scripted reply."""
    pytest.importorskip("tokenizers")
    from rescue.rehearsal.standins.engine import Engine, Model
    from rescue.rehearsal.tiny.tokenizer import build_model_dir

    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    folder = build_model_dir(
        tmp_path_factory.mktemp("model"), template, max_position_embeddings=4096
    )
    engine = Engine(Model(folder), port=0).start()
    yield folder, f"http://127.0.0.1:{engine.port}"
    engine.close()


def test_calibration_reads_the_rehearsal_engines_truncation_as_it_reports_it(
    rehearsal_engine, setup, tmp_path, capsys
):
    folder, url = rehearsal_engine
    data, _ = setup
    ids = cal.encode_prompts(str(folder), cal.read_prompts(data, PROMPTS, seed=1))
    lengths = cal.sample_lengths(
        ids, n=2, max_cap=1024, temperature=1.0, base_url=url, concurrency=4, progress=False
    )
    (k,) = {n for responses in lengths for n, cut in responses}  # one scripted reply, k tokens
    assert 4 < k < 1024 and not any(cut for r in lengths for _, cut in r)
    caps = [k // 2, k - 1, k + 1, 1024]
    one_pass = {r.cap: r.rate for r in cal.truncation_rates(lengths, caps)}
    for cap in caps:  # what the engine reports when asked at each cap
        reply = cal.post_generate(
            url, {"input_ids": ids[0], "sampling_params": cal.sampling_params(1.0, cap)}, 30
        )
        reported = reply["meta_info"]["finish_reason"]["type"] == "length"
        assert one_pass[cap] == float(reported), cap
    # no candidate in the window: refused with the rates, nothing written
    out = tmp_path / "cap.json"
    code = run(data, folder, url, out, " ".join(map(str, caps)))
    assert code == 2 and not out.exists()
    assert "no candidate cap has a truncation rate in [0.2, 0.4]" in capsys.readouterr().err
    # a request beyond the engine's context is its 400, an engine error, not a length
    assert run(data, folder, url, out, "8192") == 1
    assert "maximum context length of 4096 tokens" in capsys.readouterr().err


def test_a_refused_connection_is_retried_then_an_engine_error(monkeypatch):
    import socket

    monkeypatch.setattr(cal.time, "sleep", lambda s: None)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(cal.EngineError, match=f"failed {cal.CONNECT_ATTEMPTS} times"):
        cal.post_generate(f"http://127.0.0.1:{port}", {"input_ids": [1]}, 5)


def test_concurrency_seed_and_timeout_are_the_flags(setup, tmp_path, capsys, monkeypatch):
    data, tokenizer = setup
    out = tmp_path / "cap.json"
    with GenerateServer(natural) as server:
        server.delay_s = 0.01
        assert run(data, tokenizer, server.url, out, "768 1024", concurrency="1") == 0
        assert server.most_in_flight == 1
    with GenerateServer(natural) as server:
        server.delay_s = 0.05
        assert run(data, tokenizer, server.url, out, "768 1024", concurrency="6", seed="7") == 0
        assert server.most_in_flight > 1
    assert json.loads(out.read_text())["seed"] == 7
    # the seed draws the prompts
    assert cal.read_prompts(data, 5, seed=1) != cal.read_prompts(data, 5, seed=2)
    monkeypatch.setattr(cal.time, "sleep", lambda s: None)
    with GenerateServer(natural) as server:
        server.delay_s = 1.0
        assert run(data, tokenizer, server.url, out, "768", timeout="0.05") == 1
    assert "failed 4 times: " in capsys.readouterr().err
