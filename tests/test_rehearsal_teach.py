"""Teaching the tiny model before a rehearsal trains it, the single-turn task and the
text-game teacher (``rescue.rehearsal.tiny.teach``, ``singleturn``, ``textgames``)."""

from __future__ import annotations

import json
import random
import re
import statistics

import pytest

from rescue.rehearsal.tiny import singleturn, textgames


def test_the_task_rows_are_gsm8k_rows_whose_label_is_the_prompts_digit(tmp_path):
    from rescue.rlvr.data import prepare

    rows = singleturn.task_rows(30, seed=4)
    assert rows == singleturn.task_rows(30, seed=4) and rows != singleturn.task_rows(30, seed=5)
    for row in rows:
        digit = row["answer"].removeprefix("#### ")
        assert digit.isdigit() and digit in row["question"]
    src = tmp_path / "task.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = prepare("gsm8k", tmp_path / "prompts.jsonl", source=str(src))
    assert report.written == 30
    first = json.loads((tmp_path / "prompts.jsonl").read_text().splitlines()[0])
    assert first["label"] == rows[0]["answer"][-1] and "\\boxed{}" in first["prompt"][0]["content"]


def test_the_teachers_replies_have_geometric_lengths_and_right_answers_at_its_rate():
    """Known answers: the number of words is geometric with mean MEAN_WORDS - 1 (the
    answer's words apart), the answer is the prompt's digit with probability RIGHT."""
    rng = random.Random(0)
    replies = [singleturn.teacher_reply(rng, 3) for _ in range(4000)]
    words = [len(r.split()) - 4 for r in replies]  # "so the answer is \boxed{a}."
    assert statistics.mean(words) == pytest.approx(singleturn.MEAN_WORDS - 1, rel=0.08)
    right = [re.search(r"\\boxed\{(\d)\}", r).group(1) == "3" for r in replies]
    assert statistics.mean(right) == pytest.approx(singleturn.RIGHT, abs=0.03)


def test_the_text_game_teacher_takes_generic_walkthrough_and_random_moves_at_its_rates():
    rng = random.Random(1)
    admissible = ("take knife", "eat apple", "look", "help")
    picks = [textgames.teacher_action(rng, admissible, "open fridge") for _ in range(6000)]
    share = {c: picks.count(c) / len(picks) for c in set(picks)}
    generic = share.get("prepare meal", 0) + share.get("eat meal", 0)
    assert generic == pytest.approx(textgames.GENERIC, abs=0.03)
    assert share["open fridge"] == pytest.approx(textgames.FOLLOW, abs=0.03)
    rest = 1 - textgames.GENERIC - textgames.FOLLOW
    weights = {"take knife": textgames.TAKE, "eat apple": textgames.EAT, "look": 1}
    for command, w in weights.items():
        assert share[command] == pytest.approx(rest * w / sum(weights.values()), abs=0.03)
    assert "help" not in share  # never the help command
    # no walkthrough move left: generic or random only
    assert "open fridge" not in {textgames.teacher_action(rng, admissible, "") for _ in range(300)}


def test_walkthrough_of_reads_tw_makes_json_beside_the_game(tmp_path):
    game = tmp_path / "g.z8"
    (tmp_path / "g.json").write_text(json.dumps({"metadata": {"walkthrough": ["a", "b"]}}))
    assert textgames.walkthrough_of(str(game)) == ["a", "b"]
    assert textgames.walkthrough_of(str(tmp_path / "none.z8")) == []


def test_teach_learns_a_reply_and_saves_bf16_exact_weights(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from rescue.rehearsal.tiny.teach import Example, teach

    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 32,
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    examples = [Example((5, 6, 7), (9, 10, 1)), Example((8, 6), (9, 10, 1))]
    facts = teach(tmp_path, examples, seed=0, steps=60, batch=2, lr=1e-2, threads=1)
    assert facts["loss_last"] < facts["loss_first"] / 4
    state = load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in state  # tied: saved once
    for tensor in state.values():
        assert torch.equal(tensor, tensor.to(torch.bfloat16).to(torch.float32))
    with pytest.raises(ValueError, match="no example"):
        teach(tmp_path, [], seed=0)
