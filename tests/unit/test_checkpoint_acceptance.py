"""Controlled-acceptance checkpoints (dense and MoE): the layout transformers' Qwen3.5-MoE loads, a target
that walks one cycle through every ordinary token, an MTP head right on the chosen share of positions,
and the accept length the builder predicts. CPU, tiny shapes; skipped without torch / safetensors /
tokenizers (the checkpoint extra)."""
from __future__ import annotations

import importlib.util
import json
import sysconfig
from pathlib import Path

import pytest

for _module in ("torch", "safetensors", "tokenizers"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"needs {_module} (pip install -e '.[checkpoint]')", allow_module_level=True)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tuning.checkpoint.acceptance import (  # noqa: E402
    AcceptanceSpec,
    controlled_head,
    predict_accept_length,
    predict_accept_lengths,
)
from tuning.checkpoint.build import (  # noqa: E402
    PRESETS,
    CheckpointError,
    ModelShape,
    build_checkpoint,
    main,
    make_config,
    predicted_accept_length,
    weights_sha256,
)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

TINY_MOE = ModelShape(hidden_size=128, num_layers=4, vocab_size=1024, num_heads=2, num_kv_heads=1, head_dim=128,
                      linear_num_key_heads=1, linear_num_value_heads=2, linear_head_dim=64, num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe")
    build_checkpoint(out, TINY_MOE, seed=3, text_roots=[STDLIB], tokenizer_bytes=600_000,
                     acceptance=AcceptanceSpec(agreement=0.7))
    return out


def _ordinary(ckpt: Path) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    special = {tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                             "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")}
    return [i for i in range(tok.get_vocab_size()) if i not in special]


def test_moe_config_and_tensor_names_are_qwen35_moe(moe_checkpoint: Path) -> None:
    cfg = json.loads((moe_checkpoint / "config.json").read_text())
    t = cfg["text_config"]
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and cfg["model_type"] == "qwen3_5_moe"
    assert t["model_type"] == "qwen3_5_moe_text" and "intermediate_size" not in t
    assert (t["num_experts"], t["num_experts_per_tok"], t["moe_intermediate_size"]) == (8, 2, 32)
    w = load_file(str(moe_checkpoint / "model.safetensors"))
    for p in ("model.language_model.layers.0", "mtp.layers.0"):
        assert w[f"{p}.mlp.experts.gate_up_proj"].shape == (8, 64, 128)    # [E, 2I, H]
        assert w[f"{p}.mlp.experts.down_proj"].shape == (8, 128, 32)       # [E, H, I]
        assert w[f"{p}.mlp.gate.weight"].shape == (8, 128)
        assert w[f"{p}.mlp.shared_expert_gate.weight"].shape == (1, 128)
        assert w[f"{p}.mlp.shared_expert.down_proj.weight"].shape == (128, 32)
        assert not w[f"{p}.mlp.experts.down_proj"].any()                   # no token mixing, no MLP output
        assert w[f"{p}.mlp.gate.weight"].float().std() > 0                 # the router spreads tokens


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers (Qwen3.5-MoE classes)")
def test_transformers_loads_it_and_its_greedy_target_walks_one_cycle(moe_checkpoint: Path) -> None:
    from transformers import AutoConfig, Qwen3_5MoeForConditionalGeneration

    config = AutoConfig.from_pretrained(moe_checkpoint)
    model = Qwen3_5MoeForConditionalGeneration(config).float().eval()
    weights = {k: v.float() for k, v in load_file(str(moe_checkpoint / "model.safetensors")).items()}
    own = set(model.state_dict())
    assert own - set(weights) == set(), "tensors transformers expects but the build did not write"
    assert {k for k in set(weights) - own if not k.startswith("mtp.")} == set()
    model.load_state_dict({k: v for k, v in weights.items() if k in own}, strict=True)
    ordinary = _ordinary(moe_checkpoint)
    # a sequence through the real model: every position's greedy next token is its token's successor,
    # and following them visits distinct tokens (one long cycle, not a few fixed points)
    seq = [ordinary[5]]
    with torch.no_grad():
        for _ in range(40):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
    assert len(set(seq)) == len(seq)
    assert all(s in set(ordinary) for s in seq)


def test_the_mtp_head_is_right_on_the_agreement_share(moe_checkpoint: Path) -> None:
    w = {k: v.float() for k, v in load_file(str(moe_checkpoint / "model.safetensors")).items()}
    ordinary = torch.tensor(_ordinary(moe_checkpoint))
    emb, head = w["model.language_model.embed_tokens.weight"], w["lm_head.weight"]
    H = emb.shape[1]

    def rms(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * (1 + wt)

    x = emb[ordinary]
    target = (rms(x, w["model.language_model.norm.weight"]) @ head.T).argmax(-1)
    mtp_in = torch.cat([rms(x, w["mtp.pre_fc_norm_embedding.weight"]), torch.randn_like(x)], -1)  # hidden ignored
    draft = (rms(mtp_in @ w["mtp.fc.weight"].T, w["mtp.norm.weight"]) @ head.T).argmax(-1)
    agreement = (draft == target).float().mean().item()
    assert abs(agreement - 0.7) < 0.01
    prediction = json.loads((moe_checkpoint / "acceptance.json").read_text())
    assert prediction["agreement"] == 0.7 and prediction["ordinary_tokens"] == len(ordinary)
    assert H == 128


def test_greedy_accept_length_follows_the_agreement(moe_checkpoint: Path) -> None:
    for n in (1, 2, 3, 4):
        expected = 1 + sum(0.7 ** k for k in range(1, n + 1))
        assert predicted_accept_length(moe_checkpoint, n, 0) == pytest.approx(expected, abs=0.12)


def test_acceptance_falls_with_temperature_and_less_when_sharper() -> None:
    V, H = 2048, 256
    ordinary = range(9, V - 64)

    def accept(sharpness: float, temperature: float) -> float:
        h = controlled_head(V, H, ordinary, AcceptanceSpec(agreement=0.9, sharpness=sharpness), seed=0)
        bf = {k: getattr(h, k).to(torch.bfloat16) for k in ("embed", "lm_head", "final_norm", "mtp_fc")}
        return predict_accept_length(embed=bf["embed"], lm_head=bf["lm_head"], final_norm=bf["final_norm"],
                                     mtp_fc=bf["mtp_fc"], mtp_pre_fc_norm_embedding=torch.zeros(H),
                                     mtp_norm=torch.zeros(H), ordinary=h.ordinary, num_draft_tokens=3,
                                     temperature=temperature, samples=1024)

    soft = [accept(2.5, t) for t in (0.0, 0.5, 0.8, 1.0)]
    sharp = [accept(5.0, t) for t in (0.0, 0.5, 0.8, 1.0)]
    assert soft == sorted(soft, reverse=True) and soft[0] > soft[-1] + 0.3
    assert sharp[0] == pytest.approx(soft[0], abs=0.05)    # sharpness leaves greedy acceptance alone
    assert sharp[2] > soft[2] + 0.1                        # and keeps sampled acceptance up


@pytest.mark.parametrize("hidden", [768, 2048])  # the test shape's and the MoE preset's
def test_the_stored_weights_keep_the_sharpness_asked_for(hidden: int) -> None:
    """The successor's logit, from the bf16 tensors a checkpoint stores, is the sharpness asked for within
    1 %: the knob moves in small steps (a final-norm weight near -1 would have rounded it to a multiple of
    hidden / 256, so 7 and 7.5 came out the same)."""
    V = 1024
    for sharpness in (7.0, 7.5, 8.0, 30.0):
        h = controlled_head(V, hidden, range(9, V), AcceptanceSpec(agreement=1.0, sharpness=sharpness), seed=0)
        emb, head, norm = (getattr(h, k).to(torch.bfloat16).float() for k in ("embed", "lm_head", "final_norm"))
        y = h.ordinary[:64]
        x = emb[y] * (emb[y].pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * (1 + norm)
        successor_logit = (x * head[h.successor[y]]).sum(-1)
        assert successor_logit.mean().item() == pytest.approx(sharpness, rel=0.01)
        special_logit = (x * head[0]).sum(-1)  # a special row: far below at any sharpness
        assert special_logit.max().item() == pytest.approx(-hidden, rel=0.01)


def test_top_k_filtering_keeps_acceptance_up() -> None:
    V, H = 2048, 256
    h = controlled_head(V, H, range(9, V - 64), AcceptanceSpec(agreement=1.0, sharpness=4.0), seed=2)
    kw = dict(embed=h.embed, lm_head=h.lm_head, final_norm=h.final_norm, mtp_fc=h.mtp_fc,
              mtp_pre_fc_norm_embedding=torch.zeros(H), mtp_norm=torch.zeros(H), ordinary=h.ordinary,
              num_draft_tokens=2, temperature=1.0, samples=512)
    unfiltered, top40, top1 = (predict_accept_length(**kw, top_k=k) for k in (0, 40, 1))  # 0: the default
    assert unfiltered < top40 < top1 == 3.0
    assert predict_accept_length(**kw, top_k=0, top_p=1e-6) == 3.0  # top_p keeps only the argmax


def test_agreement_one_is_the_oracle_upper_bound() -> None:
    V, H = 1024, 64
    h = controlled_head(V, H, range(9, V), AcceptanceSpec(agreement=1.0), seed=1)
    got = predict_accept_length(embed=h.embed, lm_head=h.lm_head, final_norm=h.final_norm, mtp_fc=h.mtp_fc,
                                mtp_pre_fc_norm_embedding=torch.zeros(H), mtp_norm=torch.zeros(H),
                                ordinary=h.ordinary, num_draft_tokens=4, temperature=0, samples=256)
    assert got == 5.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(agreement=1.5), "agreement"), (dict(agreement=-0.1), "agreement"),
    (dict(sharpness=0), "sharpness"), (dict(sharpness=float("inf")), "sharpness"),
])
def test_bad_acceptance_specs_name_the_field(kwargs, message) -> None:
    with pytest.raises(CheckpointError, match=message):
        AcceptanceSpec(**kwargs)


def test_bad_moe_shapes_and_mixed_constructions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="num_experts_per_tok"):
        ModelShape(num_experts=4, num_experts_per_tok=8)
    with pytest.raises(CheckpointError, match="one"):
        build_checkpoint(tmp_path, TINY_MOE, oracle=True, acceptance=AcceptanceSpec(), text_roots=[STDLIB],
                         tokenizer_bytes=100_000)
    with pytest.raises(CheckpointError, match="no acceptance prediction"):
        predicted_accept_length(tmp_path, 3, 0)


def test_the_preset_is_the_target_moe_shape() -> None:
    shape = PRESETS["qwen3.5-moe-35b-a3b-12l"]
    t = make_config(shape, shape.vocab_size, {k: i for i, k in enumerate(
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|vision_start|>",
         "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"))})["text_config"]
    assert t["layer_types"].count("full_attention") == 3 and t["num_hidden_layers"] == 12
    assert (t["hidden_size"], t["num_experts"], t["num_experts_per_tok"], t["vocab_size"]) == (2048, 256, 8, 151_936)
    assert (t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]) == (16, 2, 256)
    assert (t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"]) == (16, 32, 128)


def test_cli_prints_the_prediction_and_the_weights_digest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The digest is what shows two GPU runs' checkpoints the same: a build of one seed is the same bytes
    every time (drawn on the CPU), another seed other bytes."""
    def build(name: str, seed: int) -> tuple[int, str]:
        rc = main([str(tmp_path / name), "--hidden", "128", "--layers", "4", "--vocab", "1024", "--heads", "2",
                   "--kv-heads", "1", "--lin-k-heads", "1", "--lin-v-heads", "2", "--experts", "4", "--top-k", "2",
                   "--moe-inter", "32", "--shared-inter", "32", "--agreement", "0.5", "--text-root", str(STDLIB),
                   "--tokenizer-bytes", "300000", "--seed", str(seed)])
        return rc, capsys.readouterr().out

    rc, out = build("c", 0)
    assert rc == 0 and "controlled-acceptance" in out and "3@0.0:" in out
    assert predicted_accept_length(tmp_path / "c", 1, 0) == pytest.approx(1.5, abs=0.1)
    digest = weights_sha256(tmp_path / "c")
    assert f"saved {tmp_path / 'c' / 'model.safetensors'} (sha256 {digest[:16]})" in out
    assert build("again", 0)[0] == 0 and weights_sha256(tmp_path / "again") == digest
    assert build("other", 1)[0] == 0 and weights_sha256(tmp_path / "other") != digest
    assert main([str(tmp_path / "c"), "--agreement", "0.5", "--text-root", str(STDLIB), "--tokenizer-bytes", "300000",
                 "--hidden", "128", "--layers", "4", "--vocab", "1024", "--heads", "2", "--kv-heads", "1",
                 "--lin-k-heads", "1", "--lin-v-heads", "2", "--no-digest"]) == 0
    assert "model.safetensors (not computed)" in capsys.readouterr().out
    assert main([str(tmp_path / "d"), "--agreement", "2"]) == 2


def test_the_prediction_averages_over_every_start_token_and_gives_every_draft_count_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy, the construction's chain is known exactly: a draft from token ``y`` is right unless ``y`` is in
    the disagreement set, and the next draft starts from ``y``'s successor. Averaged over every ordinary start
    token the prediction is that walk's mean, not a sample of it (a few hundred random starts miss it by
    ~0.03 per draft at agreement 0.5, which the GPU comparison at ±0.15 noticed)."""
    import tuning.checkpoint.acceptance as acceptance

    V, H = 1024, 64
    h = controlled_head(V, H, range(9, V), AcceptanceSpec(agreement=0.5), seed=4)
    ordinary = h.ordinary.tolist()
    exact = []
    for n in (1, 2, 3, 4):
        total = 0.0
        for y in ordinary:
            for _ in range(n):
                if h.disagrees[y]:
                    break
                total += 1.0
                y = int(h.successor[y])
        exact.append(1.0 + total / len(ordinary))
    kw = dict(embed=h.embed, lm_head=h.lm_head, final_norm=h.final_norm, mtp_fc=h.mtp_fc,
              mtp_pre_fc_norm_embedding=torch.zeros(H), mtp_norm=torch.zeros(H), ordinary=h.ordinary)
    every = predict_accept_lengths(**kw, max_draft_tokens=4, temperatures=(0.0, 0.8))
    assert every[0.0] == pytest.approx(exact, abs=1e-9)
    assert every[0.8][0] < every[0.0][0] and list(every[0.8]) == sorted(every[0.8])
    assert predict_accept_length(**kw, num_draft_tokens=3, temperature=0) == pytest.approx(exact[2], abs=1e-9)
    # chunked passes give the same figures (the preset's vocabulary takes a few hundred tokens per chunk)
    monkeypatch.setattr(acceptance, "_CHUNK_LOGITS", 7 * V)
    chunked = predict_accept_lengths(**kw, max_draft_tokens=4, temperatures=(0.0, 0.8))
    assert chunked[0.0] == pytest.approx(every[0.0], abs=1e-12) and chunked[0.8] == pytest.approx(every[0.8], abs=1e-6)
    # a sample of start tokens is an estimate, and it is not drawn with the construction's own seed (whose first
    # draws are the disagreement set): with seed 4 its greedy MTP-1 acceptance stays near the agreement
    sampled = predict_accept_lengths(**kw, max_draft_tokens=4, temperatures=(0.0,), samples=256, seed=4)[0.0]
    assert sampled != pytest.approx(exact, abs=1e-9) and abs(sampled[0] - 1.5) < 0.12
    with pytest.raises(ValueError, match="samples"):
        predict_accept_lengths(**kw, max_draft_tokens=2, temperatures=(0.0,), samples=0)
    with pytest.raises(ValueError, match="ordinary is empty"):
        predict_accept_lengths(**{**kw, "ordinary": []}, max_draft_tokens=2, temperatures=(0.0,))
