"""Write a Qwen3.5 checkpoint (dense or MoE) with one MTP layer, in the layout LMDeploy 0.18 loads.

    python -m tuning.checkpoint.build OUT_DIR [--hidden 768 --layers 8 ...] [--oracle]
    python -m tuning.checkpoint.build OUT_DIR --preset qwen3.5-moe-35b-a3b-12l --agreement 0.7 --sharpness 30 --device cuda

What LMDeploy 0.18 needs (read from its ``pytorch/models/qwen3_5.py``, ``qwen3_5_mtp.py`` and
``pytorch/configurations/qwen3_5.py``), and therefore what this module writes:

- ``config.json``: ``architectures: ["Qwen3_5ForConditionalGeneration"]``, ``model_type: qwen3_5``, a
  nested ``text_config`` (``model_type: qwen3_5_text``, ``layer_types``, ``linear_*`` shapes,
  ``head_dim``, ``attn_output_gate``, ``rope_parameters`` whose ``mrope_section`` sums to
  ``head_dim * partial_rotary_factor / 2``, ``mtp_num_hidden_layers``) and a ``vision_config``:
  LMDeploy always builds the vision tower, so a one-block tower is written (serve with
  ``--language-model-only``).
- weights named as transformers' ``Qwen3_5ForConditionalGeneration`` (``model.language_model.*``,
  ``model.visual.*``, ``lm_head.weight``) plus the MTP head ``mtp.fc``, ``mtp.norm``,
  ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0.*`` (one full-attention
  decoder layer that shares ``embed_tokens`` and ``lm_head`` with the main model).
- RMSNorm weights stored as ``w`` with scale ``1 + w`` (LMDeploy adds 1 on load for every
  ``*layernorm``, ``q_norm``/``k_norm``, final and MTP norms); the gated norm inside the linear
  attention (``linear_attn.norm``) is a plain scale and is stored as ones.
- ``tokenizer.json`` (byte-level BPE trained on local Python sources), ``tokenizer_config.json`` with
  a chat template, ``special_tokens_map.json``, ``generation_config.json``.

``--oracle`` writes a constructed checkpoint whose MTP head always agrees with the target (every
token-mixing output projection is zero and ``mtp.fc = [I | 0]``): acceptance 100 %, the upper bound.
``--agreement A [--sharpness S]`` writes a constructed checkpoint whose acceptance is set instead
(:mod:`tuning.checkpoint.acceptance`): the MTP head agrees with the target on a share ``A`` of draft
positions, the target's sharpness sets how acceptance falls with temperature, and the build writes
``acceptance.json`` with the accept length it predicts per draft-token count and temperature.
The default writes an initialisation for :mod:`tuning.checkpoint.train`.

MoE shapes (``num_experts > 0``, e.g. ``--preset qwen3.5-moe-35b-a3b-12l``: Qwen3.5-35B-A3B's per-layer
shapes with 12 layers, 23 GB in bf16) are written as ``Qwen3_5MoeForConditionalGeneration``:
``text_config.model_type = qwen3_5_moe_text`` without ``intermediate_size``, fused experts
``mlp.experts.gate_up_proj`` [E, 2I, H] and ``mlp.experts.down_proj`` [E, H, I], router ``mlp.gate``,
``mlp.shared_expert.*`` and ``mlp.shared_expert_gate``; the MTP layer uses the same names under
``mtp.layers.0``. Draw large shapes on a GPU (``--device cuda``).

Needs torch, safetensors and tokenizers only, so the layout can be checked on a CPU machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuning.checkpoint.acceptance import (
    AcceptanceSpec,
    controlled_head,
    predict_from_weights_all,
)
from tuning.checkpoint.errors import CheckpointError
from tuning.checkpoint.tokenizer import TOKENIZER_VOCAB_CAP, collect_source_files, train_tokenizer

__all__ = [
    "CheckpointError",
    "ModelShape",
    "PRESETS",
    "build_checkpoint",
    "make_config",
    "make_weights",
    "mrope_section",
    "predicted_accept_length",
    "weights_sha256",
    "write_checkpoint_files",
]

WEIGHTS_FILE = "model.safetensors"
@dataclass(frozen=True)
class ModelShape:
    """The shape of the text model (and its MTP head).

    Defaults give a ~60M-parameter model that trains to useful acceptance in ~3 minutes on one H200
    and keeps LMDeploy's kernels on their supported paths: ``head_dim`` 128 or 256 (the FA3 build on
    the lent H200 has only those), linear-attention head dims 128, GQA groups that divide evenly.
    """

    hidden_size: int = 768
    num_layers: int = 8
    vocab_size: int = 8192
    intermediate_size: int = 2048
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 128
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 8
    linear_head_dim: int = 128
    linear_conv_kernel: int = 4
    full_attention_interval: int = 4
    mtp_layers: int = 1
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    num_experts: int = 0
    """0: a dense MLP of ``intermediate_size``; otherwise a MoE of this many routed experts."""
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def __post_init__(self) -> None:
        def positive(name: str, lo: int = 1, hi: int = 1 << 20) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise CheckpointError(f"{name}={value!r} is out of range; allowed: integers {lo}..{hi}")

        for name in ("hidden_size", "num_layers", "intermediate_size", "num_heads", "num_kv_heads",
                     "linear_num_key_heads", "linear_num_value_heads", "full_attention_interval"):
            positive(name)
        positive("vocab_size", 512, 1 << 18)
        if self.num_experts:
            positive("num_experts", 1, 1024)
            positive("num_experts_per_tok", 1, self.num_experts)
            positive("moe_intermediate_size")
            positive("shared_expert_intermediate_size")
        positive("linear_conv_kernel", 2, 8)
        positive("mtp_layers", 1, 4)
        if self.head_dim not in (64, 128, 256):
            raise CheckpointError(f"head_dim={self.head_dim} is not supported; allowed: 64, 128, 256 "
                                  "(the FlashAttention-3 build on the lent H200 has 128 and 256 only)")
        if self.linear_head_dim not in (64, 128, 256):
            raise CheckpointError(f"linear_head_dim={self.linear_head_dim}; allowed: 64, 128, 256")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise CheckpointError(f"linear_num_value_heads={self.linear_num_value_heads} must be a multiple of "
                                  f"linear_num_key_heads={self.linear_num_key_heads}")
        if "full_attention" not in self.layer_types():
            raise CheckpointError(f"num_layers={self.num_layers} with full_attention_interval="
                                  f"{self.full_attention_interval} has no full-attention layer; LMDeploy needs at "
                                  "least one (use num_layers >= full_attention_interval)")
        rotary = self.head_dim * self.partial_rotary_factor
        if rotary != int(rotary) or int(rotary) % 2:
            raise CheckpointError(f"head_dim * partial_rotary_factor = {rotary} must be an even integer")

    def layer_types(self) -> list[str]:
        """Every ``full_attention_interval``-th layer is full attention, the rest gated delta-net
        (transformers' default rule for Qwen3.5)."""
        k = self.full_attention_interval
        return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(self.num_layers)]

    @classmethod
    def from_text_config(cls, text: dict[str, Any]) -> ModelShape:
        """The shape of an existing checkpoint (inverse of :func:`make_config`)."""
        rope = text.get("rope_parameters") or {}
        moe = {}
        if text.get("num_experts"):
            moe = dict(num_experts=text["num_experts"], num_experts_per_tok=text["num_experts_per_tok"],
                       moe_intermediate_size=text["moe_intermediate_size"],
                       shared_expert_intermediate_size=text["shared_expert_intermediate_size"])
        return cls(**moe, hidden_size=text["hidden_size"], num_layers=text["num_hidden_layers"],
                   vocab_size=text["vocab_size"], intermediate_size=text.get("intermediate_size", 2048),
                   num_heads=text["num_attention_heads"], num_kv_heads=text["num_key_value_heads"],
                   head_dim=text["head_dim"], linear_num_key_heads=text["linear_num_key_heads"],
                   linear_num_value_heads=text["linear_num_value_heads"],
                   linear_head_dim=text["linear_key_head_dim"], linear_conv_kernel=text["linear_conv_kernel_dim"],
                   full_attention_interval=text.get("full_attention_interval", 4),
                   mtp_layers=text.get("mtp_num_hidden_layers", 1),
                   rope_theta=float(rope.get("rope_theta", 10_000_000.0)),
                   partial_rotary_factor=float(rope.get("partial_rotary_factor", 0.25)),
                   max_position_embeddings=text.get("max_position_embeddings", 32768),
                   rms_norm_eps=text.get("rms_norm_eps", 1e-6))


PRESETS: dict[str, ModelShape] = {
    # Qwen3.5-35B-A3B's per-layer shapes, 12 layers (9 gated delta-net, 3 gated full attention): what a
    # 397B-A17B-class MoE spends per token on expert coverage and verification, on one GPU.
    "qwen3.5-moe-35b-a3b-12l": ModelShape(
        hidden_size=2048, num_layers=12, vocab_size=151_936, num_heads=16, num_kv_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_head_dim=128, num_experts=256,
        num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
    ),
}
"""Named shapes for ``--preset``."""

# ----- config -------------------------------------------------------------------------------------
def mrope_section(head_dim: int, partial_rotary_factor: float) -> list[int]:
    """Split the rotary half-dimension into (t, h, w) sections, largest first, summing exactly to
    ``head_dim * partial_rotary_factor / 2`` as LMDeploy's rotary builder requires
    (256 -> [11, 11, 10] as in released Qwen3.5; 128 -> [6, 5, 5])."""
    half = int(head_dim * partial_rotary_factor) // 2
    base, rem = divmod(half, 3)
    return [base + 1 if i < rem else base for i in range(3)]


def make_config(shape: ModelShape, vocab_size: int, special_ids: dict[str, int]) -> dict[str, Any]:
    """``config.json`` content for ``Qwen3_5ForConditionalGeneration`` or, for a MoE shape,
    ``Qwen3_5MoeForConditionalGeneration`` (text + tiny vision tower)."""
    if shape.is_moe:
        mlp: dict[str, Any] = dict(num_experts=shape.num_experts, num_experts_per_tok=shape.num_experts_per_tok,
                                   moe_intermediate_size=shape.moe_intermediate_size,
                                   shared_expert_intermediate_size=shape.shared_expert_intermediate_size,
                                   router_aux_loss_coef=0.001, output_router_logits=False)
    else:
        mlp = dict(intermediate_size=shape.intermediate_size)
    prefix = "qwen3_5_moe" if shape.is_moe else "qwen3_5"
    text = dict(
        model_type=f"{prefix}_text", vocab_size=vocab_size, hidden_size=shape.hidden_size,
        **mlp, num_hidden_layers=shape.num_layers,
        full_attention_interval=shape.full_attention_interval, layer_types=shape.layer_types(),
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim,
        attn_output_gate=True, attention_bias=False, attention_dropout=0.0,
        linear_conv_kernel_dim=shape.linear_conv_kernel, linear_key_head_dim=shape.linear_head_dim,
        linear_value_head_dim=shape.linear_head_dim, linear_num_key_heads=shape.linear_num_key_heads,
        linear_num_value_heads=shape.linear_num_value_heads,
        hidden_act="silu", rms_norm_eps=shape.rms_norm_eps, max_position_embeddings=shape.max_position_embeddings,
        initializer_range=0.02,
        rope_parameters=dict(rope_type="default", rope_theta=shape.rope_theta,
                             partial_rotary_factor=shape.partial_rotary_factor,
                             mrope_section=mrope_section(shape.head_dim, shape.partial_rotary_factor),
                             mrope_interleaved=True),
        mtp_num_hidden_layers=shape.mtp_layers, mtp_use_dedicated_embeddings=False,
        tie_word_embeddings=False, use_cache=True, dtype="bfloat16",
        bos_token_id=None, eos_token_id=special_ids["<|im_end|>"], pad_token_id=special_ids["<|endoftext|>"],
    )
    vision = dict(model_type=prefix, depth=1, hidden_size=64, hidden_act="gelu_pytorch_tanh",
                  intermediate_size=128, num_heads=2, in_channels=3, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=shape.hidden_size, num_position_embeddings=64,
                  deepstack_visual_indexes=[], initializer_range=0.02)
    arch = "Qwen3_5MoeForConditionalGeneration" if shape.is_moe else "Qwen3_5ForConditionalGeneration"
    return dict(architectures=[arch], model_type=prefix,
                text_config=text, vision_config=vision,
                image_token_id=special_ids["<|image_pad|>"], video_token_id=special_ids["<|video_pad|>"],
                vision_start_token_id=special_ids["<|vision_start|>"],
                vision_end_token_id=special_ids["<|vision_end|>"],
                tie_word_embeddings=False, dtype="bfloat16", transformers_version="5.17.0")


# ----- weights ------------------------------------------------------------------------------------
def make_weights(config: dict[str, Any], *, oracle: bool = False, seed: int = 0,
                 acceptance: AcceptanceSpec | None = None, ordinary_ids: Sequence[int] | None = None,
                 device: str = "cpu") -> dict[str, Any]:
    """Initial (or oracle) bf16 tensors keyed by checkpoint name.

    Initialisation follows transformers' Qwen3.5 (normal(0, 0.02) matrices, zero-centred RMSNorm
    weights, ``dt_bias`` ones, ``A_log`` = log U(1, 16)) with output projections scaled by
    ``1/sqrt(2 * layers)`` so a deeper stack starts stable. In ``oracle`` mode no layer mixes tokens
    (output projections zero), so both the target and the MTP head compute
    ``lm_head(rmsnorm(embed(token)))`` of the same token and every draft is accepted. With
    ``acceptance`` the output projections are zero too and the embedding, ``lm_head``, final norm and
    ``mtp.fc`` come from :func:`tuning.checkpoint.acceptance.controlled_head` over ``ordinary_ids``.
    Tensors are drawn on ``device`` (a GPU for large shapes) and returned there.
    """
    import torch

    t = config["text_config"]
    gen = torch.Generator(device=device).manual_seed(seed)
    bf16 = torch.bfloat16
    constructed = oracle or acceptance is not None
    H, V = t["hidden_size"], t["vocab_size"]
    I = t.get("intermediate_size", 0)  # noqa: E741 (the MLP's usual name)
    E = t.get("num_experts", 0)
    nh, nkv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    nk, nv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv, K = t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"]
    conv_dim = 2 * nk * dk + nv * dv
    out_std = 0.02 / math.sqrt(2 * t["num_hidden_layers"])

    def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * std).to(bf16)

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=bf16, device=device)

    def ones(*shape: int) -> torch.Tensor:
        return torch.ones(*shape, dtype=bf16, device=device)

    def out_proj(*shape: int) -> torch.Tensor:
        return zeros(*shape) if constructed else normal(*shape, std=out_std)

    def full_attention(p: str) -> dict[str, torch.Tensor]:
        return {
            f"{p}.self_attn.q_proj.weight": normal(nh * hd * 2, H),  # query and output gate, per head
            f"{p}.self_attn.k_proj.weight": normal(nkv * hd, H),
            f"{p}.self_attn.v_proj.weight": normal(nkv * hd, H),
            f"{p}.self_attn.o_proj.weight": out_proj(H, nh * hd),
            f"{p}.self_attn.q_norm.weight": zeros(hd),
            f"{p}.self_attn.k_norm.weight": zeros(hd),
        }

    def linear_attention(p: str) -> dict[str, torch.Tensor]:
        a = torch.empty(nv, device=device).uniform_(1, 16, generator=gen)
        return {
            f"{p}.linear_attn.in_proj_qkv.weight": normal(conv_dim, H),
            f"{p}.linear_attn.in_proj_z.weight": normal(nv * dv, H),
            f"{p}.linear_attn.in_proj_b.weight": normal(nv, H),
            f"{p}.linear_attn.in_proj_a.weight": normal(nv, H),
            f"{p}.linear_attn.conv1d.weight": normal(conv_dim, 1, K, std=1 / math.sqrt(K)),
            f"{p}.linear_attn.dt_bias": ones(nv),
            f"{p}.linear_attn.A_log": torch.log(a).to(bf16),
            f"{p}.linear_attn.norm.weight": ones(dv),  # gated RMSNorm: plain scale, not 1 + w
            f"{p}.linear_attn.out_proj.weight": out_proj(H, nv * dv),
        }

    def mlp_and_norms(p: str) -> dict[str, torch.Tensor]:
        norms = {f"{p}.input_layernorm.weight": zeros(H), f"{p}.post_attention_layernorm.weight": zeros(H)}
        if not E:
            return {f"{p}.mlp.gate_proj.weight": normal(I, H), f"{p}.mlp.up_proj.weight": normal(I, H),
                    f"{p}.mlp.down_proj.weight": out_proj(H, I), **norms}
        mi, si = t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
        # The router is random in every mode: tokens spread over experts as real traffic does.
        return {
            f"{p}.mlp.gate.weight": normal(E, H),
            f"{p}.mlp.experts.gate_up_proj": normal(E, 2 * mi, H),
            f"{p}.mlp.experts.down_proj": out_proj(E, H, mi),
            f"{p}.mlp.shared_expert.gate_proj.weight": normal(si, H),
            f"{p}.mlp.shared_expert.up_proj.weight": normal(si, H),
            f"{p}.mlp.shared_expert.down_proj.weight": out_proj(H, si),
            f"{p}.mlp.shared_expert_gate.weight": normal(1, H),
            **norms,
        }

    w: dict[str, torch.Tensor] = {}
    lm = "model.language_model"
    w[f"{lm}.embed_tokens.weight"] = normal(V, H, std=1.0 if constructed else 0.02)
    w[f"{lm}.norm.weight"] = zeros(H)
    w["lm_head.weight"] = normal(V, H, std=1.0 if constructed else 0.02)
    for i, kind in enumerate(t["layer_types"]):
        p = f"{lm}.layers.{i}"
        w.update(full_attention(p) if kind == "full_attention" else linear_attention(p))
        w.update(mlp_and_norms(p))
    w.update(_vision_weights(config["vision_config"], normal, zeros, ones))
    for j in range(t["mtp_num_hidden_layers"]):
        w.update(full_attention(f"mtp.layers.{j}"))
        w.update(mlp_and_norms(f"mtp.layers.{j}"))
    w["mtp.norm.weight"] = zeros(H)
    w["mtp.pre_fc_norm_embedding.weight"] = zeros(H)
    w["mtp.pre_fc_norm_hidden.weight"] = zeros(H)
    if acceptance is not None:
        if ordinary_ids is None:
            raise CheckpointError("a controlled-acceptance build needs the tokenizer's ordinary token ids")
        head = controlled_head(V, H, ordinary_ids, acceptance, seed=seed, device=device)
        w[f"{lm}.embed_tokens.weight"] = head.embed.to(bf16)
        w["lm_head.weight"] = head.lm_head.to(bf16)
        w[f"{lm}.norm.weight"] = head.final_norm.to(bf16)
        w["mtp.fc.weight"] = head.mtp_fc.to(bf16)
    elif oracle:  # fc([emb; hidden]) = emb: the MTP head sees only the token it is given
        w["mtp.fc.weight"] = torch.cat([torch.eye(H, device=device), torch.zeros(H, H, device=device)], dim=1).to(bf16)
    else:
        w["mtp.fc.weight"] = normal(H, 2 * H)
    return {k: v.contiguous() for k, v in w.items()}


def _vision_weights(v: dict[str, Any], normal, zeros, ones) -> dict[str, Any]:  # noqa: ANN001 (local helpers)
    """A tower with the names and shapes of transformers' ``Qwen3_5VisionModel`` (never run here)."""
    vh, vi, vo = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    merged = vh * v["spatial_merge_size"] ** 2
    p = "model.visual"
    w = {
        f"{p}.patch_embed.proj.weight": normal(vh, v["in_channels"], v["temporal_patch_size"], v["patch_size"],
                                               v["patch_size"]),
        f"{p}.patch_embed.proj.bias": zeros(vh),
        f"{p}.pos_embed.weight": normal(v["num_position_embeddings"], vh),
        f"{p}.merger.norm.weight": ones(vh), f"{p}.merger.norm.bias": zeros(vh),
        f"{p}.merger.linear_fc1.weight": normal(merged, merged), f"{p}.merger.linear_fc1.bias": zeros(merged),
        f"{p}.merger.linear_fc2.weight": normal(vo, merged), f"{p}.merger.linear_fc2.bias": zeros(vo),
    }
    for b in range(v["depth"]):
        q = f"{p}.blocks.{b}"
        w.update({
            f"{q}.norm1.weight": ones(vh), f"{q}.norm1.bias": zeros(vh),
            f"{q}.norm2.weight": ones(vh), f"{q}.norm2.bias": zeros(vh),
            f"{q}.attn.qkv.weight": normal(3 * vh, vh), f"{q}.attn.qkv.bias": zeros(3 * vh),
            f"{q}.attn.proj.weight": normal(vh, vh), f"{q}.attn.proj.bias": zeros(vh),
            f"{q}.mlp.linear_fc1.weight": normal(vi, vh), f"{q}.mlp.linear_fc1.bias": zeros(vi),
            f"{q}.mlp.linear_fc2.weight": normal(vh, vi), f"{q}.mlp.linear_fc2.bias": zeros(vh),
        })
    return w


def save_weights(out_dir: Path, weights: dict[str, Any]) -> None:
    """One safetensors file (``format: pt`` metadata, as transformers writes)."""
    from safetensors.torch import save_file

    save_file({k: v.cpu() for k, v in weights.items()}, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})


def weights_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a weights file (of a checkpoint folder: its ``model.safetensors``). It tells two
    checkpoints of one recipe apart (a trained one differs between GPU runs; one built on the CPU, the
    default, is drawn from its seed and is the same bytes wherever the CPU kernels are), or shows them the same."""
    path = Path(path)
    h = hashlib.sha256()
    with open(path / WEIGHTS_FILE if path.is_dir() else path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def write_checkpoint_files(out_dir: Path, config: dict[str, Any], special_ids: dict[str, int]) -> None:
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    gen = dict(eos_token_id=[special_ids["<|im_end|>"], special_ids["<|endoftext|>"]],
               pad_token_id=special_ids["<|endoftext|>"], do_sample=False)
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))


ACCEPTANCE_FILE = "acceptance.json"
PREDICTED_DRAFT_TOKENS = (1, 2, 3, 4)
PREDICTED_TEMPERATURES = (0.0, 0.5, 0.8, 1.0)


def build_checkpoint(out_dir: str | os.PathLike[str], shape: ModelShape = ModelShape(), *, oracle: bool = False,
                     seed: int = 0, text_roots: Sequence[Path] | None = None,
                     tokenizer_bytes: int = 16 << 20, acceptance: AcceptanceSpec | None = None,
                     device: str = "cpu", prediction_samples: int | None = None) -> dict[str, Any]:
    """Write a complete checkpoint into ``out_dir``; return its ``config.json`` content.

    The vocabulary is padded up to a multiple of 64 (kernel-friendly); the padded rows are never
    produced by the tokenizer. With ``acceptance``, ``acceptance.json`` holds the spec and the
    accept length predicted for 1-4 draft tokens at temperatures 0, 0.5, 0.8 and 1.0, averaged over
    every ordinary start token (``prediction_samples``: that many, drawn at random, instead).
    """
    if oracle and acceptance is not None:
        raise CheckpointError("oracle and acceptance are two constructions; pass one (oracle = agreement 1.0)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = collect_source_files(text_roots, max_bytes=tokenizer_bytes, split="train")
    tok = train_tokenizer(out, files, min(shape.vocab_size, TOKENIZER_VOCAB_CAP))
    vocab = max(shape.vocab_size, (tok.vocab_size + 63) // 64 * 64)
    config = make_config(shape, vocab, tok.special_ids)
    write_checkpoint_files(out, config, tok.special_ids)
    special = set(tok.special_ids.values())
    ordinary = [i for i in range(tok.vocab_size) if i not in special]
    weights = make_weights(config, oracle=oracle, seed=seed, acceptance=acceptance, ordinary_ids=ordinary,
                           device=device)
    if acceptance is not None:
        by_temperature = predict_from_weights_all(weights, config["text_config"], ordinary, max(PREDICTED_DRAFT_TOKENS),
                                                  PREDICTED_TEMPERATURES, samples=prediction_samples, seed=seed)
        predicted = {f"{n}@{temp}": round(by_temperature[temp][n - 1], 4)
                     for n in PREDICTED_DRAFT_TOKENS for temp in PREDICTED_TEMPERATURES}
        (out / ACCEPTANCE_FILE).write_text(json.dumps(dict(
            agreement=acceptance.agreement, sharpness=acceptance.sharpness, seed=seed, ordinary_tokens=len(ordinary),
            start_tokens=len(ordinary) if prediction_samples is None else min(prediction_samples, len(ordinary)),
            predicted_accept_length=predicted,
            note="accept length = 1 + accepted drafts per step; key 'N@T' = N draft tokens at temperature T; a "
                 "draft is accepted with the target's temperature-scaled probability over the whole vocabulary "
                 "(LMDeploy 0.18: before top_k/top_p)",
        ), indent=2))
    save_weights(out, weights)
    return config


def predicted_accept_length(checkpoint: str | os.PathLike[str], num_draft_tokens: int, temperature: float) -> float:
    """The accept length ``acceptance.json`` predicts for a built checkpoint (``N@T`` keys)."""
    path = Path(checkpoint) / ACCEPTANCE_FILE
    try:
        table = json.loads(path.read_text())["predicted_accept_length"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: no acceptance prediction ({e}); build with --agreement") from None
    key = f"{num_draft_tokens}@{float(temperature)}"
    if key not in table:
        raise CheckpointError(f"{path}: no prediction for {key}; predicted: {sorted(table)}")
    return float(table[key])


def _shape_args(ap: argparse.ArgumentParser) -> None:
    d = ModelShape()
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="a named shape; the shape flags below then override nothing")
    ap.add_argument("--hidden", type=int, default=d.hidden_size, help="hidden size")
    ap.add_argument("--layers", type=int, default=d.num_layers, help="decoder layers (every 4th full attention)")
    ap.add_argument("--vocab", type=int, default=d.vocab_size, help="BPE vocabulary size (padded to x64)")
    ap.add_argument("--inter", type=int, default=d.intermediate_size, help="MLP intermediate size")
    ap.add_argument("--heads", type=int, default=d.num_heads)
    ap.add_argument("--kv-heads", type=int, default=d.num_kv_heads)
    ap.add_argument("--head-dim", type=int, default=d.head_dim)
    ap.add_argument("--lin-k-heads", type=int, default=d.linear_num_key_heads)
    ap.add_argument("--lin-v-heads", type=int, default=d.linear_num_value_heads)
    ap.add_argument("--experts", type=int, default=d.num_experts, help="routed experts (0: dense MLP)")
    ap.add_argument("--top-k", type=int, default=d.num_experts_per_tok, help="experts per token")
    ap.add_argument("--moe-inter", type=int, default=d.moe_intermediate_size, help="expert intermediate size")
    ap.add_argument("--shared-inter", type=int, default=d.shared_expert_intermediate_size,
                    help="shared-expert intermediate size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text-root", action="append", type=Path, default=None,
                    help="folder of .py files for the tokenizer (repeatable; default: stdlib + torch + transformers)")
    ap.add_argument("--tokenizer-bytes", type=int, default=16 << 20, help="source bytes to train the BPE on")


def shape_from_args(a: argparse.Namespace) -> ModelShape:
    if getattr(a, "preset", None):
        return PRESETS[a.preset]
    return ModelShape(hidden_size=a.hidden, num_layers=a.layers, vocab_size=a.vocab, intermediate_size=a.inter,
                      num_heads=a.heads, num_kv_heads=a.kv_heads, head_dim=a.head_dim,
                      linear_num_key_heads=a.lin_k_heads, linear_num_value_heads=a.lin_v_heads,
                      num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=a.moe_inter,
                      shared_expert_intermediate_size=a.shared_inter)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuning.checkpoint.build", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    _shape_args(ap)
    ap.add_argument("--oracle", action="store_true",
                    help="constructed weights whose MTP head is always right (100%% acceptance)")
    ap.add_argument("--agreement", type=float, default=None,
                    help="constructed weights whose MTP draft is right on this share of positions (0..1)")
    ap.add_argument("--sharpness", type=float, default=AcceptanceSpec().sharpness,
                    help="with --agreement: the successor's logit over the mean at temperature 1 (higher: acceptance falls "
                         "less with temperature)")
    ap.add_argument("--device", default="cpu", help="where tensors are drawn (cuda for large shapes)")
    ap.add_argument("--no-digest", action="store_true",
                    help="skip the weights' sha256 (~14 s for the MoE preset's 23 GB) when nothing compares it")
    a = ap.parse_args(argv)
    try:
        shape = shape_from_args(a)
        spec = None if a.agreement is None else AcceptanceSpec(agreement=a.agreement, sharpness=a.sharpness)
        config = build_checkpoint(a.out_dir, shape, oracle=a.oracle, seed=a.seed, text_roots=a.text_root,
                                  tokenizer_bytes=a.tokenizer_bytes, acceptance=spec, device=a.device)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = config["text_config"]
    kind = "oracle" if a.oracle else "controlled-acceptance" if spec else "initial"
    print(f"wrote {a.out_dir}: {kind} weights, vocab {t['vocab_size']}, layers {t['layer_types']}, "
          f"shape {dataclasses.asdict(shape)}")
    digest = "not computed" if a.no_digest else f"sha256 {weights_sha256(a.out_dir)[:16]}"
    print(f"saved {a.out_dir / WEIGHTS_FILE} ({digest})")
    if spec is not None:
        predicted = json.loads((a.out_dir / ACCEPTANCE_FILE).read_text())["predicted_accept_length"]
        print("predicted accept length (draft tokens @ temperature): "
              + ", ".join(f"{k}: {v:.2f}" for k, v in predicted.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
