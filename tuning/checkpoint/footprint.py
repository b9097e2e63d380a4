"""What a built checkpoint holds and what LMDeploy keeps per token and per sequence, counted from its shape.
Pure: a :class:`~tuning.checkpoint.build.ModelShape` in, parameter and byte counts out.

Why count rather than estimate: a simulator profile of a constructed checkpoint (e.g. the MoE testbed,
``--preset qwen3.5-moe-35b-a3b-12l``) should carry its architecture as the builder made it, so that its
fitted constants absorb only what the engine does, never a mistyped shape. The counts follow
:func:`tuning.checkpoint.build.make_weights` tensor by tensor (a test compares them with the tensors it
draws for a small shape), split the way the simulator reads weights: routed expert weights (read only for
the experts a step's tokens touch) against everything else (read every step).

What LMDeploy 0.18 keeps (its ``pytorch/configurations/qwen3_5.py``): a paged bf16 KV cache for the
full-attention layers only (K and V, ``num_kv_heads x head_dim`` each), and per sequence, for every gated
delta-net layer, a conv state ``[conv_dim, conv_kernel]`` and a recurrent state ``[v_heads, k_dim, v_dim]``,
both bf16. The vision tower the builder writes (LMDeploy wants one) is served with
``--language-model-only`` and counted apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuning.checkpoint.build import ModelShape

__all__ = ["BF16_BYTES", "Footprint", "footprint"]

BF16_BYTES = 2
"""The builder writes bf16 weights; LMDeploy's KV cache and delta-net states are bf16 by default."""


@dataclass(frozen=True)
class Footprint:
    """Parameter and byte counts of one checkpoint shape (exact integers)."""

    dense_params: int
    """Main-model parameters outside the routed experts: embedding, ``lm_head``, attention and delta-net
    projections, routers, shared experts, norms."""
    expert_params: int
    """Routed expert parameters of the main model (``gate_up_proj`` and ``down_proj`` of every MoE layer)."""
    mtp_dense_params: int
    """The MTP head's own parameters outside its routed experts (``mtp.*``; it shares the main model's
    embedding and ``lm_head``, which are counted once, in ``dense_params``)."""
    mtp_expert_params: int
    vision_params: int
    """The one-block vision tower (not loaded with ``--language-model-only``; in no other figure)."""
    num_experts: int
    experts_per_token: int
    kv_bytes_per_token: int
    """K and V of every full-attention layer of the main model, per token."""
    mtp_kv_bytes_per_token: int
    state_bytes_per_seq: int
    """Conv and recurrent states of every gated delta-net layer, per sequence."""
    attn_flops_per_token_ctx: int
    """Attention FLOPs per query token per context token (QK and PV, 2 FLOPs a multiply-add), full
    attention layers."""
    max_context: int

    def profile_sections(self) -> dict[str, dict[str, Any]]:
        """The architecture numbers in a simulator profile's units (``*_params_b`` in billions), keyed by
        the profile's ``architecture`` and ``mtp`` sections."""
        moe = self.num_experts > 0
        return {
            "architecture": {
                "dense_params_b": self.dense_params / 1e9,
                "expert_params_b": self.expert_params / 1e9,
                "num_experts": self.num_experts if moe else 1,
                "experts_per_token": self.experts_per_token if moe else 1,
                "weight_bytes_per_param": float(BF16_BYTES),
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "state_bytes_per_seq": self.state_bytes_per_seq,
                "attn_flops_per_token_ctx": self.attn_flops_per_token_ctx,
                "max_context": self.max_context,
            },
            "mtp": {
                "mtp_dense_params_b": self.mtp_dense_params / 1e9,
                "mtp_expert_params_b": self.mtp_expert_params / 1e9,
                "mtp_kv_bytes_per_token": self.mtp_kv_bytes_per_token,
            },
        }

    @property
    def total_bytes(self) -> int:
        """Bytes of the weights an engine loads (language model and MTP head, bf16)."""
        return (self.dense_params + self.expert_params + self.mtp_dense_params + self.mtp_expert_params) * BF16_BYTES


def _full_attention(s: ModelShape) -> int:
    H, hd = s.hidden_size, s.head_dim
    q = s.num_heads * hd * 2 * H  # query and output gate
    kv = 2 * s.num_kv_heads * hd * H
    o = H * s.num_heads * hd
    return q + kv + o + 2 * hd  # + q_norm, k_norm


def _conv_dim(s: ModelShape) -> int:
    return 2 * s.linear_num_key_heads * s.linear_head_dim + s.linear_num_value_heads * s.linear_head_dim


def _linear_attention(s: ModelShape) -> int:
    H, nv, dv = s.hidden_size, s.linear_num_value_heads, s.linear_head_dim
    conv = _conv_dim(s)
    return (conv * H + nv * dv * H + 2 * nv * H  # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
            + conv * s.linear_conv_kernel + 2 * nv + dv  # conv1d, dt_bias, A_log, norm
            + H * nv * dv)  # out_proj


def _mlp(s: ModelShape) -> tuple[int, int]:
    """(dense, routed expert) parameters of one layer's MLP and its two norms."""
    H = s.hidden_size
    norms = 2 * H
    if not s.is_moe:
        return 3 * s.intermediate_size * H + norms, 0
    E, mi, si = s.num_experts, s.moe_intermediate_size, s.shared_expert_intermediate_size
    experts = E * 2 * mi * H + E * H * mi
    dense = E * H + 3 * si * H + H + norms  # router, shared expert, shared-expert gate
    return dense, experts


def _vision(s: ModelShape) -> int:
    """The tower :func:`tuning.checkpoint.build.make_config` describes (depth 1, hidden 64)."""
    vh, vi, merged = 64, 128, 64 * 2**2
    patch = vh * 3 * 2 * 16 * 16 + vh
    pos = 64 * vh
    merger = 2 * vh + merged * merged + merged + s.hidden_size * merged + s.hidden_size
    block = 4 * vh + 3 * vh * vh + 3 * vh + vh * vh + vh + vi * vh + vi + vh * vi + vh
    return patch + pos + merger + block


def footprint(shape: ModelShape, *, vocab_size: int | None = None) -> Footprint:
    """The counts of a checkpoint of ``shape`` (``vocab_size``: the padded vocabulary the build wrote, by
    default the shape's own, which is what the build writes whenever the tokenizer's is smaller)."""
    s, H = shape, shape.hidden_size
    V = vocab_size or s.vocab_size
    types = s.layer_types()
    n_full, n_linear = types.count("full_attention"), types.count("linear_attention")
    mlp_dense, mlp_experts = _mlp(s)
    dense = (2 * V * H + H  # embed_tokens, lm_head, final norm
             + n_full * _full_attention(s) + n_linear * _linear_attention(s) + s.num_layers * mlp_dense)
    mtp_dense = s.mtp_layers * (_full_attention(s) + mlp_dense) + 3 * H + H * 2 * H  # 3 norms + fc
    kv_per_layer = 2 * s.num_kv_heads * s.head_dim * BF16_BYTES
    state = n_linear * (_conv_dim(s) * s.linear_conv_kernel
                        + s.linear_num_value_heads * s.linear_head_dim * s.linear_head_dim) * BF16_BYTES
    return Footprint(
        dense_params=dense, expert_params=s.num_layers * mlp_experts,
        mtp_dense_params=mtp_dense, mtp_expert_params=s.mtp_layers * mlp_experts, vision_params=_vision(s),
        num_experts=s.num_experts, experts_per_token=s.num_experts_per_tok if s.is_moe else 1,
        kv_bytes_per_token=n_full * kv_per_layer, mtp_kv_bytes_per_token=s.mtp_layers * kv_per_layer,
        state_bytes_per_seq=state, attn_flops_per_token_ctx=n_full * s.num_heads * s.head_dim * 4,
        max_context=s.max_position_embeddings)
