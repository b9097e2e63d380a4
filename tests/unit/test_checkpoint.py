"""The project's Qwen3.5 + MTP checkpoint: layout LMDeploy 0.18 loads, and the acceptance predictor.

Runs on CPU with tiny shapes. Skipped where torch / safetensors / tokenizers are missing; the parts
that use transformers' Qwen3.5 classes are skipped where transformers is missing.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

for _module in ("torch", "safetensors", "tokenizers"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"needs {_module} (pip install torch safetensors tokenizers)", allow_module_level=True)

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from tuning.checkpoint.build import (  # noqa: E402
    CheckpointError,
    ModelShape,
    build_checkpoint,
    mrope_section,
)
from tuning.checkpoint.tokenizer import SPECIAL_TOKENS, collect_source_files  # noqa: E402

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers (Qwen3.5 classes)")

TINY = ModelShape(hidden_size=128, num_layers=4, vocab_size=1024, intermediate_size=256, num_heads=2,
                  num_kv_heads=1, head_dim=128, linear_num_key_heads=1, linear_num_value_heads=2)

# What LMDeploy 0.18 reads from text_config (configurations/qwen3_5.py, models/qwen3_5*.py, rotary builder).
LMDEPLOY_TEXT_KEYS = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "rms_norm_eps", "layer_types", "linear_conv_kernel_dim", "linear_key_head_dim",
    "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "attn_output_gate",
    "rope_parameters", "max_position_embeddings", "mtp_num_hidden_layers", "hidden_act", "tie_word_embeddings",
}
# LMDeploy adds 1 on load to weights whose names contain one of these (qwen3_5.py + qwen3_5_mtp.py).
LMDEPLOY_PLUS_ONE = ("model.norm", ".input_layernorm", ".post_attention_layernorm", ".q_norm", ".k_norm",
                     "mtp.norm", ".pre_fc_norm_embedding", ".pre_fc_norm_hidden")


@pytest.fixture(scope="module")
def text_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This Python's standard library (the build reads only the first ``tokenizer_bytes`` of it)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return stdlib


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, text_root: Path) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    build_checkpoint(out, TINY, seed=0, text_roots=[text_root], tokenizer_bytes=600_000)
    return out


@pytest.fixture(scope="module")
def oracle_checkpoint(tmp_path_factory: pytest.TempPathFactory, text_root: Path) -> Path:
    out = tmp_path_factory.mktemp("oracle")
    build_checkpoint(out, TINY, oracle=True, seed=0, text_roots=[text_root], tokenizer_bytes=600_000)
    return out


def _tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_files_written(checkpoint: Path) -> None:
    names = {p.name for p in checkpoint.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json"} <= names


def test_config_has_what_lmdeploy_reads(checkpoint: Path) -> None:
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert cfg["model_type"] == "qwen3_5"
    text = cfg["text_config"]
    assert text["model_type"] == "qwen3_5_text"
    assert LMDEPLOY_TEXT_KEYS <= set(text), LMDEPLOY_TEXT_KEYS - set(text)
    assert text["mtp_num_hidden_layers"] == 1
    assert len(text["layer_types"]) == text["num_hidden_layers"] == 4
    assert text["layer_types"][3] == "full_attention" and set(text["layer_types"][:3]) == {"linear_attention"}
    rope = text["rope_parameters"]
    assert sum(rope["mrope_section"]) == text["head_dim"] * rope["partial_rotary_factor"] / 2
    assert text["vocab_size"] % 64 == 0
    assert {"depth", "hidden_size", "out_hidden_size", "patch_size"} <= set(cfg["vision_config"])
    assert cfg["vision_config"]["out_hidden_size"] == text["hidden_size"]


def test_mrope_section_matches_released_models() -> None:
    assert mrope_section(256, 0.25) == [11, 11, 10]  # Qwen3.5 releases
    assert mrope_section(128, 0.25) == [6, 5, 5]


def test_weights_names_and_shapes(checkpoint: Path) -> None:
    cfg = json.loads((checkpoint / "config.json").read_text())["text_config"]
    w = _tensors(checkpoint)
    H, nh, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    assert w["mtp.fc.weight"].shape == (H, 2 * H)
    for name in ("mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
        assert w[name].shape == (H,)
    assert w["mtp.layers.0.self_attn.q_proj.weight"].shape == (2 * nh * hd, H)  # query + output gate
    assert "mtp.layers.0.mlp.down_proj.weight" in w
    assert w["lm_head.weight"].shape == (cfg["vocab_size"], H)
    assert w["model.language_model.embed_tokens.weight"].shape == (cfg["vocab_size"], H)
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"model.language_model.layers.{i}"
        mixer = f"{p}.self_attn.o_proj.weight" if kind == "full_attention" else f"{p}.linear_attn.out_proj.weight"
        assert mixer in w, mixer
    assert any(k.startswith("model.visual.blocks.0.") for k in w)
    assert all(v.dtype == torch.bfloat16 for v in w.values())


def test_rmsnorm_convention(checkpoint: Path) -> None:
    """Stored ``w`` means scale ``1 + w``: initial scale 1 is stored as 0, except the gated norm in
    the linear attention (a plain scale, not in LMDeploy's +1 list) and the vision LayerNorms."""
    w = _tensors(checkpoint)
    plus_one = [k for k in w if any(key in k for key in LMDEPLOY_PLUS_ONE) and k.endswith("weight")]
    assert "model.language_model.norm.weight" in plus_one and "mtp.norm.weight" in plus_one
    assert any(".q_norm." in k for k in plus_one) and any("pre_fc_norm_hidden" in k for k in plus_one)
    for k in plus_one:
        assert torch.count_nonzero(w[k]) == 0, k
    gated = [k for k in w if k.endswith("linear_attn.norm.weight")]
    assert gated and all(torch.all(w[k] == 1) for k in gated)
    assert not any(key in k for k in gated for key in LMDEPLOY_PLUS_ONE)


def test_oracle_mtp_sees_only_the_token(oracle_checkpoint: Path) -> None:
    w = _tensors(oracle_checkpoint)
    H = w["mtp.norm.weight"].shape[0]
    fc = w["mtp.fc.weight"].float()
    assert torch.equal(fc[:, :H], torch.eye(H)) and torch.count_nonzero(fc[:, H:]) == 0
    for k, v in w.items():
        if k.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            assert torch.count_nonzero(v) == 0, k


def test_tokenizer_and_chat_template(checkpoint: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    text = "def foo(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(text).ids) == text
    cfg = json.loads((checkpoint / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>" and "<|im_start|>" in cfg["chat_template"]
    jinja2 = pytest.importorskip("jinja2")
    rendered = jinja2.Template(cfg["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_eval_split_is_disjoint(text_root: Path) -> None:
    train = set(collect_source_files([text_root], max_bytes=1 << 40, split="train"))
    held = set(collect_source_files([text_root], max_bytes=1 << 40, split="eval"))
    assert held and train and not train & held


def test_shape_validation_names_the_field() -> None:
    with pytest.raises(CheckpointError, match="head_dim"):
        ModelShape(head_dim=96)
    with pytest.raises(CheckpointError, match="full-attention"):
        ModelShape(num_layers=3)
    with pytest.raises(CheckpointError, match="num_kv_heads"):
        ModelShape(num_heads=6, num_kv_heads=4)


def test_walk_steps_counts_like_lmdeploy() -> None:
    from tuning.checkpoint.train import walk_steps

    # drafts: depth 1 always right, depth 2 never -> every step accepts exactly 1 (emits 2 tokens)
    L = 40
    match = [[True] * L, [False] * L]
    steps, accepted, per_pos = walk_steps(match, prompt_len=10, max_tokens=11, num_draft=2)
    assert (steps, accepted, per_pos) == (5, 5, [5, 0])  # 1 (prefill) + 5 * 2 = 11 tokens
    steps, accepted, _ = walk_steps(match, prompt_len=10, max_tokens=11, num_draft=1)
    assert (steps, accepted) == (5, 5)


@needs_transformers
def test_transformers_loads_checkpoint_strictly(checkpoint: Path) -> None:
    from tuning.checkpoint.train import load_model

    model, cfg, other = load_model(checkpoint)
    assert other and all(k.startswith("model.visual.") for k in other)
    names = {k for k, _ in model.named_parameters()}
    assert "mtp.fc.weight" in names and "language_model.layers.3.self_attn.q_proj.weight" in names


@needs_transformers
def test_chain_equals_step_by_step_drafting(checkpoint: Path) -> None:
    """The batched chain (custom masks) equals drafting one token at a time the way LMDeploy's
    spec agent does: true MTP cache up to p, then each draft fed back at the next position."""
    from tuning.checkpoint.train import chain_hidden, load_model

    torch.manual_seed(0)
    model, _, _ = load_model(checkpoint)
    with torch.no_grad():
        for p_ in model.parameters():  # random, non-degenerate weights (initial output projections are small)
            p_.normal_(0, 0.2)
        seqs = torch.randint(20, 1000, (2, 14))
        h, gs, check = chain_hidden(model, seqs, 3)
        assert check < 1e-5
        mtp = model.mtp
        pos = torch.arange(14)[None].expand(2, -1)
        for p in (0, 4, 9):
            toks, hid = [seqs[:, 1: p + 2]], [h[:, : p + 1]]
            for depth in (1, 2, 3):
                n = p + depth  # virtual sequence: true entries 0..p, then the chain
                tok = torch.cat(toks, 1)
                hidden = torch.cat(hid, 1)
                g = mtp(model.embed(tok), hidden, model.rope(h, pos[:, :n]))[:, -1]
                torch.testing.assert_close(g, gs[depth - 1][:, p], rtol=1e-4, atol=1e-4)
                toks.append(seqs[:, p + depth + 1: p + depth + 2])
                hid.append(g[:, None])


@needs_transformers
def test_oracle_prediction_accepts_everything(oracle_checkpoint: Path) -> None:
    from tuning.checkpoint.train import load_model, predict_acceptance

    model, _, _ = load_model(oracle_checkpoint)
    prompts = torch.randint(20, 1000, (2, 8))
    pred = predict_acceptance(model, prompts, max_tokens=10, max_draft=3)
    for n in (1, 2, 3):
        assert pred["per_draft_tokens"][str(n)]["accept_length"] == pytest.approx(1 + n)


@needs_transformers
def test_a_fixed_number_of_steps_trains_the_same_weights_every_run(checkpoint: Path) -> None:
    """``--steps``: the checkpoint of one seed is one model, however fast the machine (wall-time training
    stops wherever the machine got to, so each lease measured another model). Another seed, other weights."""
    from tuning.checkpoint.train import TrainConfig, load_model, train

    data = torch.randint(20, 1000, (4_000,), generator=torch.Generator().manual_seed(0), dtype=torch.int64).int()

    def trained(seed: int) -> tuple[dict[str, torch.Tensor], dict]:
        model, _, _ = load_model(checkpoint)
        model.train()
        report = train(model, data, TrainConfig(steps=3, seq_len=16, batch_size=2, seed=seed), device="cpu",
                       log=lambda _: None)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, report

    first, report = trained(0)
    again, _ = trained(0)
    other, _ = trained(1)
    assert report["steps"] == 3
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)
    untrained, _, _ = load_model(checkpoint)
    assert any(not torch.equal(first[k], v) for k, v in untrained.state_dict().items())
    with pytest.raises(CheckpointError, match="steps=0"):
        TrainConfig(steps=0)
