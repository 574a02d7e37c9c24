"""The stand-in engine's tiny policy and its end of Miles' weight update by broadcast.

The policy's answers are checked against a plain forward pass of the same model (known
answers: the cache changes no number); the weight update against a trainer side built as
Miles builds it (``miles.utils.distributed_utils.init_process_group``: torch's rendezvous, a
``PrefixStore`` named after the group, torch's ``_new_process_group_helper`` on gloo), with
Miles' own function where ``MILES_SRC`` is set.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rescue.rehearsal.standins.engine import Engine  # noqa: E402
from rescue.rehearsal.standins.model import Model  # noqa: E402
from rescue.rehearsal.standins.weights import Receiver, WeightUpdateError  # noqa: E402
from rescue.rehearsal.tiny.policy import Policy, digest, write_checkpoint  # noqa: E402
from rescue.rehearsal.tiny.tokenizer import build_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = build_model_dir(
        tmp_path_factory.mktemp("tiny"), TEMPLATE, max_position_embeddings=4096
    )
    write_checkpoint(folder, seed=3)
    return folder


def reference(policy: Policy, prompt: list[int], output: list[int]) -> list[float]:
    """Log-probs of ``output`` after ``prompt`` from one plain forward pass, no cache."""
    with torch.inference_mode():
        logits = policy.model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) - 1 + len(output)]
    return lp.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def test_a_checkpoint_is_drawn_from_its_seed(tmp_path, model_dir):
    again = build_model_dir(tmp_path / "again", TEMPLATE, max_position_embeddings=4096)
    write_checkpoint(again, seed=3)
    other = build_model_dir(tmp_path / "other", TEMPLATE, max_position_embeddings=4096)
    write_checkpoint(other, seed=4)
    assert Policy(model_dir).state_digest() == Policy(again).state_digest()
    assert Policy(model_dir).state_digest() != Policy(other).state_digest()


def test_scores_are_the_models_log_probs_whatever_the_cache_reuses(model_dir):
    policy = Policy(model_dir)
    rng = random.Random(0)
    prompt = [rng.randrange(policy.vocab) for _ in range(300)]
    output = [rng.randrange(policy.vocab) for _ in range(40)]
    first, heads = policy.score(prompt, output, top_k=5)
    assert first == pytest.approx(reference(policy, prompt, output), abs=1e-5)
    # the next turn of the trajectory: its prefix is cached
    turn = [*prompt, *output, *[rng.randrange(policy.vocab) for _ in range(30)]]
    second, _ = policy.score(turn, output, top_k=5)
    assert second == pytest.approx(reference(policy, turn, output), abs=1e-5)
    # another trial of the group: a shorter shared prefix, then its own tokens
    branch = [*prompt[:200], 7, 8, 9]
    third, _ = policy.score(branch, output, top_k=5)
    assert third == pytest.approx(reference(policy, branch, output), abs=1e-5)
    # each head: the k most likely, in order, of the same distribution
    with torch.inference_mode():
        logits = policy.model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) - 1 + len(output)]
    top = torch.topk(lp, 5, dim=-1)
    assert [[t for _, t in row] for row in heads] == top.indices.tolist()
    flat = [v for row in heads for v, _ in row]
    assert flat == pytest.approx(top.values.flatten().tolist(), abs=1e-5)


def test_samples_stop_at_end_of_turn_or_the_limit_with_their_log_probs(model_dir):
    policy = Policy(model_dir, seed=1)
    prompt = [5, 6, 7]
    ids, logprobs, heads = policy.sample(prompt, 25, eos=None, top_k=3)
    assert len(ids) == len(logprobs) == len(heads) == 25
    assert logprobs == pytest.approx(reference(policy, prompt, ids), abs=1e-4)
    # the same seed draws the same tokens; with one of them as end of turn it stops there
    again, _, _ = Policy(model_dir, seed=1).sample(prompt, 25, eos=ids[4])
    assert again == ids[: ids.index(ids[4]) + 1]


def test_weights_load_by_name_and_refuse_what_the_model_lacks(model_dir):
    policy = Policy(model_dir)
    name, param = next(iter(policy.model.named_parameters()))
    before = policy.state_digest()
    prompt, output = [1, 2, 3, 4], [5, 6]
    old = policy.score(prompt, output)[0]
    policy.load([(name, torch.zeros_like(param, dtype=torch.bfloat16))])
    assert policy.state_digest() != before and float(param.detach().abs().sum()) == 0
    assert policy.score(prompt, output)[0] != old  # the cache was emptied by the load
    with pytest.raises(KeyError, match="not a parameter"):
        policy.load([("model.no_such.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        policy.load([(name, torch.zeros(1))])


def test_digest_covers_names_dtypes_shapes_and_values():
    a = [("w", torch.ones(2, 2)), ("b", torch.zeros(2))]
    assert digest(a) == digest(list(reversed(a)))
    assert digest(a) != digest([("w", torch.ones(2, 2)), ("c", torch.zeros(2))])
    assert digest(a) != digest(
        [("w", torch.ones(2, 2, dtype=torch.bfloat16)), ("b", torch.zeros(2))]
    )
    assert digest(a) != digest([("w", torch.ones(4)), ("b", torch.zeros(2))])
    assert digest(a) != digest([("w", torch.full((2, 2), 2.0)), ("b", torch.zeros(2))])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The trainer's side, in its own process: Miles' init_process_group when MILES_SRC is set,
#: else the same three torch calls it makes; then one broadcast per tensor from rank 0.
TRAINER = r"""
import json, os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
port, group, tensors = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
if os.environ.get("MILES_SRC"):
    sys.path.insert(0, os.environ["MILES_SRC"])
    from miles.utils.distributed_utils import init_process_group
else:
    from torch.distributed.distributed_c10d import (
        Backend, PrefixStore, _new_process_group_helper, _world, rendezvous)

    def init_process_group(backend, init_method, world_size, rank, group_name):
        store, rank, world_size = next(rendezvous(init_method, rank, world_size,
                                                  timeout=timedelta(seconds=60)))
        store = PrefixStore(group_name, store)
        pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store,
                                          group_name=group_name, backend_options=None,
                                          timeout=timedelta(seconds=60))
        _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
        return pg
pg = init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2,
                        rank=0, group_name=group)
for name, value, shape in tensors:
    dist.broadcast(torch.full(shape, value, dtype=torch.bfloat16), 0, group=pg)
print("sent", flush=True)
os._exit(0)  # as a trainer holds the group: no tear-down of gloo's threads at exit
"""


def _trainer(port: int, group: str, tensors: list) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(port), group, json.dumps(tensors)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_the_receiver_joins_the_trainers_group_and_gets_each_tensor_in_order():
    port, group = _port(), "miles-pp_0"
    tensors = [["a", 1.5, [2, 3]], ["b", -2.0, [4]]]
    trainer = _trainer(port, group, tensors)
    receiver = Receiver(timeout_s=60)
    receiver.join(master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2,
                  group_name=group, backend="gloo")  # fmt: skip
    got = receiver.receive(group, ["a", "b"], ["bfloat16", "torch.bfloat16"], [[2, 3], [4]])
    _, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 0, err
    assert [n for n, _ in got] == ["a", "b"]
    assert got[0][1].dtype == torch.bfloat16 and torch.all(got[0][1] == 1.5)
    assert torch.all(got[1][1] == -2.0) and tuple(got[1][1].shape) == (4,)
    receiver.leave(group)
    with pytest.raises(WeightUpdateError, match="never joined"):
        receiver.receive(group, ["a"], ["bfloat16"], [[1]])


def test_the_receiver_refuses_nccl_a_second_group_and_a_bad_dtype():
    receiver = Receiver(timeout_s=5)
    with pytest.raises(WeightUpdateError, match="only gloo"):
        receiver.join(master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2,
                      group_name="g", backend="nccl")  # fmt: skip
    receiver.groups["g"] = object()
    with pytest.raises(WeightUpdateError, match="already exists"):
        receiver.join(master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2,
                      group_name="g", backend="gloo")  # fmt: skip
    with pytest.raises(WeightUpdateError, match="unknown dtype"):
        receiver.receive("g", ["w"], ["float7"], [[1]])
    with pytest.raises(WeightUpdateError, match="differ in length"):
        receiver.receive("g", ["w"], [], [[1]])


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_the_engine_takes_a_weight_update_as_miles_sends_it_and_records_its_digest(
    model_dir, tmp_path
):
    policy = Policy(model_dir)
    engine = Engine(
        Model(model_dir, policy=policy), port=0, weights_record=tmp_path / "w.jsonl"
    ).start()
    base = f"http://127.0.0.1:{engine.port}"
    try:
        name, param = next(iter(policy.model.named_parameters()))
        port, group = _port(), "miles-pp_0"
        trainer = _trainer(port, group, [[name, 0.25, list(param.shape)]])
        joined = _post(f"{base}/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 2, "group_name": group, "backend": "gloo",
        })  # fmt: skip
        assert joined["success"], joined
        sent = _post(f"{base}/update_weights_from_distributed", {
            "names": [name], "dtypes": ["bfloat16"], "shapes": [list(param.shape)],
            "group_name": group, "weight_version": "7",
        })  # fmt: skip
        assert sent["success"], sent
        assert trainer.wait(timeout=60) == 0
        assert _post(f"{base}/update_weight_version", {"new_version": "7"})["success"]
        assert torch.all(param == 0.25)
        row = json.loads((tmp_path / "w.jsonl").read_text())
        want = digest([(name, torch.full(param.shape, 0.25, dtype=torch.bfloat16))])
        assert row["version"] == "7" and row["digest"] == want and row["tensors"] == 1
        assert row["model_digest"] == policy.state_digest()
        refused = _post(f"{base}/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
            "world_size": 2, "group_name": "other", "backend": "nccl",
        })  # fmt: skip
        assert refused == {"success": False, "message": refused["message"]}
        assert "only gloo" in refused["message"]
    finally:
        engine.close()


def test_a_paused_engine_holds_generation_until_it_continues(model_dir):
    engine = Engine(Model(model_dir, policy=Policy(model_dir)), port=0).start()
    base = f"http://127.0.0.1:{engine.port}"
    try:
        assert _post(f"{base}/pause_generation", {"mode": "in_place"})["success"]
        done: list[dict] = []
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
        t = threading.Thread(target=lambda: done.append(_post(f"{base}/generate", body)))
        t.start()
        t.join(timeout=2)
        assert t.is_alive() and not done  # held while paused
        assert _post(f"{base}/continue_generation", {})["success"]
        t.join(timeout=60)
        assert done and len(done[0]["output_ids"]) <= 4
    finally:
        engine.close()


def test_chat_log_probs_and_heads_are_the_policys(model_dir):
    policy = Policy(model_dir)
    model = Model(model_dir, tool_call_parser="qwen25", policy=policy)
    body = {
        "messages": [{"role": "user", "content": "Task 1: fix it"}],
        "input_ids": [10, 11, 12, 13],
        "logprobs": True,
        "top_logprobs": 4,
        "return_meta_info": True,
    }
    status, response, _ = model.chat(body)
    meta = response["choices"][0]["meta_info"]
    ids = [i for _, i, _ in meta["output_token_logprobs"]]
    assert status == 200
    assert [lp for lp, _, _ in meta["output_token_logprobs"]] == pytest.approx(
        reference(policy, [10, 11, 12, 13], ids), abs=1e-5
    )
    assert all(len(h) == 4 for h in meta["output_top_logprobs"])
    assert os.environ.get("RESCUE_REHEARSAL_DIR") is None  # nothing of a run leaked here
