"""Workload validation and the datasets (pure, no server)."""
from __future__ import annotations

import json
import random

import pytest

from orchestrator.sim import tokenizer as sim_tokenizer
from tuning.workload import (
    HFTokenCounter,
    RequestSpec,
    Workload,
    WorkloadError,
    build_requests,
    load_tokenizer,
)


# ----- Workload -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("dataset", "alpaca"),
        ("input_len", 0),
        ("output_len", -5),
        ("output_len", 1.5),
        ("range_ratio", 1.5),
        ("range_ratio", -0.1),
        ("num_prompts", 0),
        ("max_concurrency", 0),
        ("request_rate", 0.0),
        ("request_rate", -1.0),
        ("temperature", -0.1),
        ("api", "generate"),
        ("ignore_eos", "yes"),
        ("warmup_requests", -1),
        ("sharegpt_output_len", "auto"),
    ],
)
def test_workload_rejects_invalid_field_naming_it(field, value):
    with pytest.raises(WorkloadError, match=field):
        Workload(**{field: value})


def test_sharegpt_needs_a_path():
    with pytest.raises(WorkloadError, match="sharegpt_path"):
        Workload(dataset="sharegpt")


def test_workload_dict_round_trip_keeps_infinite_rate():
    w = Workload(input_len=4096, output_len=16000, num_prompts=64, max_concurrency=None, name="16k")
    d = w.to_dict()
    assert d["request_rate"] == "inf"
    json.dumps(d)  # JSON-ready
    assert Workload.from_dict(json.loads(json.dumps(d))) == w
    assert Workload.from_dict(Workload(request_rate=4.0).to_dict()).request_rate == 4.0


def test_workload_from_dict_rejects_unknown_keys():
    with pytest.raises(WorkloadError, match="concurency"):
        Workload.from_dict({"concurency": 8})


def test_workload_is_frozen_and_hashable():
    w = Workload()
    with pytest.raises(AttributeError):
        w.input_len = 5  # type: ignore[misc]
    assert hash(w) == hash(Workload())


# ----- random dataset -----------------------------------------------------------------------------


def test_random_lengths_in_range_and_exact_prompt_token_counts():
    w = Workload(input_len=200, output_len=80, range_ratio=0.5, num_prompts=60, seed=3)
    reqs = build_requests(w)
    assert len(reqs) == 60
    for r in reqs:
        assert isinstance(r, RequestSpec)
        assert 100 <= r.prompt_len <= 200
        assert 40 <= r.output_len <= 80
        assert sim_tokenizer.count_tokens(r.prompt) == r.prompt_len
    # lengths actually vary (uniform draw), not all at a bound
    assert len({r.prompt_len for r in reqs}) > 20
    assert len({r.output_len for r in reqs}) > 15


def test_random_range_ratio_one_gives_exact_lengths():
    reqs = build_requests(Workload(input_len=64, output_len=32, range_ratio=1.0, num_prompts=10))
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(64, 32)}


def test_random_dataset_is_deterministic_by_seed():
    w = Workload(input_len=128, output_len=64, num_prompts=20, seed=7)
    assert build_requests(w) == build_requests(w)
    other = build_requests(w.replace(seed=8))
    assert other != build_requests(w)


def test_random_prompts_are_varied_real_text():
    reqs = build_requests(Workload(input_len=300, output_len=10, range_ratio=1.0, num_prompts=20, seed=1))
    prompts = [r.prompt for r in reqs]
    assert len(set(prompts)) == len(prompts)  # no two prompts alike
    for p in prompts:
        words = sim_tokenizer.tokenize(p)
        assert len(set(words)) > 60  # real text, not one token repeated
    # prompts are different spans, not shifts of one span
    starts = {tuple(sim_tokenizer.tokenize(p)[:5]) for p in prompts}
    assert len(starts) == len(prompts)


def _small_bpe():
    """A real byte-level BPE tokenizer trained on the shipped corpus (stands in for a model's tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = " ".join(sim_tokenizer.sample_tokens(30_000, random.Random(0)))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [text], trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return tok


def test_random_with_hf_tokenizer_cuts_real_text_to_exact_length(tmp_path):
    tok = _small_bpe()
    w = Workload(input_len=150, output_len=20, num_prompts=12, seed=5)
    reqs = build_requests(w, tok)
    for r in reqs:
        assert 75 <= r.prompt_len <= 150
        assert len(tok.encode(r.prompt, add_special_tokens=False).ids) == r.prompt_len
    assert len({r.prompt for r in reqs}) == 12
    # the same tokenizer loaded from a model dir's tokenizer.json gives the same requests
    tok.save(str(tmp_path / "tokenizer.json"))
    assert build_requests(w, str(tmp_path)) == reqs
    assert isinstance(load_tokenizer(tmp_path), HFTokenCounter)


def test_missing_tokenizer_file_is_a_clear_error(tmp_path):
    with pytest.raises(WorkloadError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "nope")


# ----- ShareGPT -----------------------------------------------------------------------------------


def _conv(human: str, gpt: str) -> dict:
    return {"conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


@pytest.fixture
def sharegpt_file(tmp_path):
    rng = random.Random(0)
    data = [
        _conv(sim_tokenizer.sample_text(rng.randint(10, 60), rng), sim_tokenizer.sample_text(rng.randint(10, 90), rng))
        for _ in range(40)
    ]
    data += [
        _conv("hi", sim_tokenizer.sample_text(30, rng)),  # prompt too short
        _conv(sim_tokenizer.sample_text(30, rng), "ok"),  # output too short
        _conv(sim_tokenizer.sample_text(500, rng), sim_tokenizer.sample_text(30, rng)),  # prompt too long
        {"conversations": [{"from": "gpt", "value": "starts with the model"}, {"from": "human", "value": "x y z w"}]},
        {"conversations": [{"from": "human", "value": "only one turn here"}]},
        {"id": "no conversations"},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_dataset_output_lengths_and_filters(sharegpt_file):
    w = Workload(dataset="sharegpt", sharegpt_path=str(sharegpt_file), sharegpt_output_len="dataset",
                 input_len=100, output_len=80, num_prompts=30, seed=2)
    reqs = build_requests(w)
    assert len(reqs) == 30
    data = json.loads(sharegpt_file.read_text())
    gpt_by_prompt = {d["conversations"][0]["value"]: d["conversations"][1]["value"] for d in data if len(d.get("conversations", [])) >= 2}
    for r in reqs:
        assert 4 <= r.prompt_len <= 100 and 4 <= r.output_len <= 80
        assert r.output_len == sim_tokenizer.count_tokens(gpt_by_prompt[r.prompt])
        assert r.prompt_len == sim_tokenizer.count_tokens(r.prompt)
    assert build_requests(w) == reqs  # seeded shuffle
    assert [r.prompt for r in build_requests(w.replace(seed=3))] != [r.prompt for r in reqs]


def test_sharegpt_fixed_output_len(sharegpt_file):
    w = Workload(dataset="sharegpt", sharegpt_path=str(sharegpt_file), output_len=64, input_len=1000, num_prompts=20)
    reqs = build_requests(w)
    assert {r.output_len for r in reqs} == {64}


def test_sharegpt_too_few_conversations_says_what_to_do(sharegpt_file):
    w = Workload(dataset="sharegpt", sharegpt_path=str(sharegpt_file), num_prompts=500)
    with pytest.raises(WorkloadError, match="lower num_prompts"):
        build_requests(w)


def test_sharegpt_unreadable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(WorkloadError, match="not valid JSON"):
        build_requests(Workload(dataset="sharegpt", sharegpt_path=str(bad)))
    with pytest.raises(WorkloadError, match="cannot read"):
        build_requests(Workload(dataset="sharegpt", sharegpt_path=str(tmp_path / "missing.json")))
