"""Train a small Qwen3.5 and its MTP head together, then predict LMDeploy's MTP accept length.

    python -m tuning.checkpoint.train OUT_DIR --minutes 3 [--seed 0] [build options]
    python -m tuning.checkpoint.train OUT_DIR --steps 480 [--seed 0]     # as many steps in every run

Builds the checkpoint first when ``OUT_DIR/config.json`` is missing (see :mod:`tuning.checkpoint.build`),
trains on local Python sources for ``--minutes`` of optimiser time (or ``--steps`` steps), writes the trained bf16 weights
back into ``OUT_DIR/model.safetensors`` and then writes ``OUT_DIR/mtp_expected.json``: the accept
length that LMDeploy's greedy ``qwen3_5_mtp`` decoding should report for 1..4 draft tokens on
held-out prompts that the file also contains.

The main model is transformers' own ``Qwen3_5TextModel`` (gated delta-net and gated full attention
per ``layer_types``), loaded from the checkpoint with strict name checking, so names and semantics
are those LMDeploy loads. Only the MTP head is implemented here, following LMDeploy 0.18's
``pytorch/models/qwen3_5_mtp.py``:

    x = fc([pre_fc_norm_embedding(embed(token_{i+1})) ; pre_fc_norm_hidden(h_i)])
    g_i = mtp.norm(decoder_layer(x, position i))        # one full-attention layer, own KV cache
    draft = argmax(lm_head(g_i))                        # embed_tokens and lm_head shared with the target

where ``h_i`` is the target's final (normed) hidden state. Drafts after the first are chained the
way LMDeploy's spec agent does: draft ``k`` feeds draft ``k-1``'s token and the MTP head's own
output ``g`` back in at the next position, attending to the true MTP cache up to the verified
position plus the chain's own entries. The training loss covers the first two chain depths.

Why the prediction is exact rather than a proxy: with greedy sampling, a verification step accepts
the longest prefix of drafts that equal the target's greedy tokens. This module generates the
target's greedy continuation, computes every chain depth for every possible step start in one
batched pass (custom attention masks over [true cache | chain entries]), then walks the
continuation step by step exactly as the engine does (one emitted token per prefill, ``1 + accepted``
per verification step), counting drafts and accepted tokens as LMDeploy's
``lmdeploy:spec_decode_*`` counters do.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuning.checkpoint.build import (
    WEIGHTS_FILE,
    CheckpointError,
    _shape_args,
    build_checkpoint,
    shape_from_args,
    weights_sha256,
)
from tuning.checkpoint.tokenizer import collect_source_files, read_texts

__all__ = ["MtpHead", "Qwen35WithMtp", "TrainConfig", "chain_hidden", "chain_matches", "load_model",
           "predict_acceptance", "walk_steps", "main"]

EXPECTED_FILE = "mtp_expected.json"


def _disable_fla() -> None:
    """Make ``import fla`` fail so transformers picks its PyTorch gated delta rule (a fallback when the
    FLA Triton kernels don't run on this torch/triton)."""
    sys.modules["fla"] = None  # type: ignore[assignment]


@dataclass(frozen=True)
class TrainConfig:
    minutes: float = 3.0
    seq_len: int = 1024
    batch_size: int = 32
    peak_lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    mtp_weight: float = 0.5
    mtp_depth2_weight: float = 0.5
    train_bytes: int = 64 << 20
    seed: int = 0
    steps: int | None = None
    """A fixed number of optimiser steps instead of ``minutes`` of wall time, which trains as far as the
    machine gets (another step count and learning-rate schedule every time). With steps, every lease trains
    the same recipe for as long; the weights still differ by GPU nondeterminism and by the installed sources
    the text comes from, so how close two leases' checkpoints measure is for a measurement to show."""

    def __post_init__(self) -> None:
        if not 0 < self.minutes <= 120:
            raise CheckpointError(f"minutes={self.minutes}; allowed: (0, 120]")
        if self.steps is not None and not 1 <= self.steps <= 1_000_000:
            raise CheckpointError(f"steps={self.steps}; allowed: 1..1000000")
        if self.seq_len < 16 or self.batch_size < 1:
            raise CheckpointError("seq_len must be >= 16 and batch_size >= 1")


# ----- model ----------------------------------------------------------------------------------------
def _modeling():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    return modeling_qwen3_5


def _torch():
    import torch

    return torch


def text_config_from_checkpoint(ckpt: Path):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    cfg = json.loads((ckpt / "config.json").read_text())
    text = dict(cfg["text_config"])
    text.pop("model_type", None)
    text.pop("full_attention_interval", None)  # layer_types is given explicitly
    for key in ("attn_output_gate", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "dtype"):
        text.pop(key, None)
    return Qwen3_5TextConfig(**text), cfg


@functools.lru_cache(maxsize=None)
def _classes():
    """(``Qwen35WithMtp``, ``MtpHead``), defined on first use so importing this module needs no torch."""
    torch = _torch()
    nn = torch.nn
    m = _modeling()

    class MtpHead(nn.Module):
        """The Qwen3.5 MTP head; attribute names give exactly the checkpoint's ``mtp.*`` names."""

        def __init__(self, config, num_layers: int = 1) -> None:
            super().__init__()
            H, eps = config.hidden_size, config.rms_norm_eps
            # One full-attention decoder layer per MTP layer: transformers' layer class, built from a copy
            # of the text config in which the layer at index 0 is full attention.
            layer_cfg = copy.deepcopy(config)
            layer_cfg.layer_types = ["full_attention"] * max(num_layers, 1)
            self.layers = nn.ModuleList([m.Qwen3_5DecoderLayer(layer_cfg, i) for i in range(num_layers)])
            self.norm = m.Qwen3_5RMSNorm(H, eps=eps)
            self.pre_fc_norm_hidden = m.Qwen3_5RMSNorm(H, eps=eps)
            self.pre_fc_norm_embedding = m.Qwen3_5RMSNorm(H, eps=eps)
            self.fc = nn.Linear(2 * H, H, bias=False)

        def fuse(self, token_embeds, prev_hidden):
            return self.fc(torch.cat([self.pre_fc_norm_embedding(token_embeds),
                                      self.pre_fc_norm_hidden(prev_hidden)], dim=-1))

        def forward(self, token_embeds, prev_hidden, position_embeddings):
            """Teacher-forced causal pass over a whole sequence (training, and depth 1 of the chain)."""
            x = self.fuse(token_embeds, prev_hidden)
            for layer in self.layers:  # LMDeploy uses layer (step % num_layers); one layer here
                x = layer(x, position_embeddings=position_embeddings)
            return self.norm(x)

    class Qwen35WithMtp(nn.Module):
        """transformers' ``Qwen3_5TextModel`` + ``lm_head`` + :class:`MtpHead`.

        ``state_dict`` names map one-to-one onto the checkpoint: ``language_model.*`` is stored as
        ``model.language_model.*``; ``lm_head.*`` and ``mtp.*`` as they are.
        """

        def __init__(self, config, mtp_layers: int = 1) -> None:
            super().__init__()
            self.language_model = m.Qwen3_5TextModel(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.mtp = MtpHead(self.language_model.config, mtp_layers)

        def embed(self, ids):
            return self.language_model.embed_tokens(ids)

        def hidden(self, ids):
            """Final normed hidden states of the target (what LMDeploy hands the MTP head)."""
            return self.language_model(input_ids=ids).last_hidden_state

        def rope(self, x, positions):
            """cos/sin for 1-D text positions ``[B, T]`` (mrope with t = h = w, as for text in LMDeploy)."""
            return self.language_model.rotary_emb(x, positions[None].expand(3, -1, -1))

        def losses(self, ids, *, depth2: bool = True):
            """Next-token loss of the target and the MTP head's depth-1 (and depth-2) losses."""
            F = torch.nn.functional
            B, T = ids.shape
            h = self.hidden(ids)
            logits = self.lm_head(h[:, :-1])
            out = {"main": F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())}
            pos = torch.arange(T, device=ids.device)[None].expand(B, -1)
            # depth 1: position i sees token i+1 and h_i, predicts token i+2
            g1 = self.mtp(self.embed(ids[:, 1:]), h[:, :-1], self.rope(h, pos[:, :-1]))
            out["mtp1"] = F.cross_entropy(self.lm_head(g1[:, :-1]).float().flatten(0, 1), ids[:, 2:].flatten())
            if depth2:  # chained: position i+1 sees token i+2 and g1_i, predicts token i+3
                g2 = self.mtp(self.embed(ids[:, 2:]), g1[:, :-1], self.rope(h, pos[:, 1:-1]))
                out["mtp2"] = F.cross_entropy(self.lm_head(g2[:, :-1]).float().flatten(0, 1), ids[:, 3:].flatten())
            return out

    return Qwen35WithMtp, MtpHead


def MtpHead(*args, **kwargs):  # noqa: N802 (the class needs torch + transformers, so it is made on first use)
    return _classes()[1](*args, **kwargs)


def Qwen35WithMtp(*args, **kwargs):  # noqa: N802
    return _classes()[0](*args, **kwargs)


def checkpoint_name(module_name: str) -> str:
    return "model." + module_name if module_name.startswith("language_model.") else module_name


def load_model(ckpt: Path, *, device: str = "cpu", dtype=None):
    """Build :class:`Qwen35WithMtp` from a checkpoint with strict name checking.

    Returns ``(model, config_dict, other_weights)`` where ``other_weights`` holds the checkpoint
    tensors the text model doesn't use (the vision tower), to be written back unchanged.
    """
    torch = _torch()
    from safetensors.torch import load_file

    text_config, cfg = text_config_from_checkpoint(ckpt)
    text_config._attn_implementation = "sdpa"
    model = Qwen35WithMtp(text_config, cfg["text_config"].get("mtp_num_hidden_layers", 1))
    weights = load_file(str(ckpt / WEIGHTS_FILE))
    own = {checkpoint_name(k): k for k in model.state_dict()}
    missing = sorted(set(own) - set(weights))
    other = {k: v for k, v in weights.items() if k not in own}
    unexpected = sorted(k for k in other if not k.startswith("model.visual."))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {ckpt} does not match transformers' Qwen3.5 + MTP layout: "
                              f"missing {missing[:8]} unexpected {unexpected[:8]}; rebuild it with "
                              "python -m tuning.checkpoint.build")
    model.load_state_dict({own[k]: weights[k] for k in own}, strict=True)
    model.to(device=device)
    cast_parameters(model, dtype or torch.float32)
    return model, cfg, other


def cast_parameters(model, dtype) -> None:
    """Cast parameters only: ``Module.to(dtype)`` would also round the rotary ``inv_freq`` buffers to
    bf16, which LMDeploy (and transformers' own loading) keep in float32."""
    for p in model.parameters():
        p.data = p.data.to(dtype)


def save_model(model, ckpt: Path, other_weights: dict[str, Any]) -> None:
    torch = _torch()
    from safetensors.torch import save_file

    tensors = {checkpoint_name(k): v.detach().to("cpu", torch.bfloat16).contiguous()
               for k, v in model.state_dict().items()}
    tensors.update({k: v.to(torch.bfloat16).contiguous() for k, v in other_weights.items()})
    tmp = ckpt / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, ckpt / WEIGHTS_FILE)


# ----- MTP chain, the way LMDeploy runs it -------------------------------------------------------------
def _attention_inputs(attn, x, cos, sin):
    m = _modeling()
    B, T, _ = x.shape
    hd = attn.head_dim
    q, gate = _torch().chunk(attn.q_proj(x).view(B, T, -1, hd * 2), 2, dim=-1)
    q = attn.q_norm(q).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(x).view(B, T, -1, hd)).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
    q, k = m.apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v, gate.reshape(B, T, -1)


def mtp_layer_forward(layer, x, cos, sin, extra_kv=None, mask=None):
    """One MTP decoder layer written out with transformers' sub-modules, so the attention can see
    an arbitrary key set: ``extra_kv`` (keys, values) are put in front of the layer's own keys and
    ``mask`` ([Tq, Tk] bool, True = attend) says which to use. Returns (output, own k, own v)."""
    torch = _torch()
    m = _modeling()
    attn = layer.self_attn
    residual = x
    q, k, v, gate = _attention_inputs(attn, layer.input_layernorm(x), cos, sin)
    keys, values = (k, v) if extra_kv is None else (torch.cat([extra_kv[0], k], 2), torch.cat([extra_kv[1], v], 2))
    keys = m.repeat_kv(keys, attn.num_key_value_groups)
    values = m.repeat_kv(values, attn.num_key_value_groups)
    if mask is None:
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=attn.scaling)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
    B, T = x.shape[:2]
    out = out.transpose(1, 2).reshape(B, T, -1) * torch.sigmoid(gate)
    x = residual + attn.o_proj(out)
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x, k, v


def chain_hidden(model, seqs, max_draft: int):
    """The MTP head's output ``g`` for every chain depth and every step start, batched.

    Depth 1 at start ``p`` sees (token ``p+1``, target hidden ``h_p``) at position ``p``: the
    teacher-forced pass, whose K/V are the true MTP cache. Depth ``d > 1`` sees (token ``p+d``,
    ``g_{d-1}(p)``) at position ``p+d-1`` and attends to the true cache at positions ``<= p`` and to
    the chain's own earlier entries, as LMDeploy's draft loop does (it only matters when every earlier
    draft was accepted, so the tokens fed are the target's own).

    Returns ``(target hidden [B, L, H], [g_1 [B, L-1, H], g_2 [B, L-2, H], ...], self_check)`` where
    ``self_check`` is the largest difference between the written-out layer and transformers' layer.
    """
    torch = _torch()
    mtp = model.mtp
    layer = mtp.layers[0]
    B, L = seqs.shape
    dev = seqs.device
    h = model.hidden(seqs)
    pos = torch.arange(L, device=dev)[None].expand(B, -1)
    x1 = mtp.fuse(model.embed(seqs[:, 1:]), h[:, :-1])
    cos, sin = model.rope(h, pos[:, :-1])
    y1, k_true, v_true = mtp_layer_forward(layer, x1, cos, sin)
    gs = [mtp.norm(y1)]
    check = (mtp(model.embed(seqs[:, 1:]), h[:, :-1], (cos, sin)) - gs[0]).abs().max().item()
    chain_k, chain_v = [], []
    for depth in range(2, max_draft + 1):
        n = L - depth  # chain starts p = 0..n-1
        x = mtp.fuse(model.embed(seqs[:, depth:]), gs[-1][:, :n])
        cos, sin = model.rope(h, pos[:, depth - 1: depth - 1 + n])
        p_idx = torch.arange(n, device=dev)[:, None]
        blocks = [torch.arange(L - 1, device=dev)[None, :] <= p_idx]  # true cache, j <= p
        blocks += [torch.arange(ck.shape[2], device=dev)[None, :] == p_idx for ck in chain_k]  # same chain
        blocks.append(torch.eye(n, dtype=torch.bool, device=dev))  # itself
        extra = (torch.cat([k_true] + chain_k, dim=2), torch.cat([v_true] + chain_v, dim=2))
        y, k, v = mtp_layer_forward(layer, x, cos, sin, extra, torch.cat(blocks, dim=1))
        gs.append(mtp.norm(y))
        chain_k.append(k)
        chain_v.append(v)
    return h, gs, check


def chain_matches(model, seqs, max_draft: int):
    """``[max_draft, B, L]`` bools: does draft ``k`` of the chain started at ``p`` equal token
    ``p + k + 1`` (False where undefined); plus the layer self-check of :func:`chain_hidden`."""
    torch = _torch()
    B, L = seqs.shape
    _, gs, check = chain_hidden(model, seqs, max_draft)
    match = torch.zeros(max_draft, B, L, dtype=torch.bool, device=seqs.device)
    for depth, g in enumerate(gs, start=1):
        m = L - depth - 1  # starts whose target token p + depth + 1 exists
        draft = model.lm_head(g[:, :m]).argmax(-1)
        match[depth - 1, :, :m] = draft == seqs[:, depth + 1:]
    return match, check


def walk_steps(match_row, prompt_len: int, max_tokens: int, num_draft: int) -> tuple[int, int, list[int]]:
    """Replay one request: prefill emits one token; each verification step emits ``1 + accepted``.

    Args:
        match_row: ``[max_draft, L]`` bools for one sequence (from :func:`chain_matches`).
    Returns:
        (verification steps, accepted draft tokens, steps that accepted >= k drafts for k = 1..num_draft)
    """
    steps = accepted = 0
    per_pos = [0] * num_draft
    p, generated = prompt_len - 1, 1
    while generated < max_tokens:
        a = 0
        while a < num_draft and bool(match_row[a][p]):
            a += 1
        steps += 1
        accepted += a
        for i in range(a):
            per_pos[i] += 1
        generated += a + 1
        p += a + 1
    return steps, accepted, per_pos


def greedy_generate(model, prompts, new_tokens: int, batch: int = 64):
    """Greedy continuation by full forward passes (no cache: simple, and the same function as training)."""
    torch = _torch()
    out = []
    for i in range(0, prompts.shape[0], batch):
        seq = prompts[i: i + batch]
        for _ in range(new_tokens):
            nxt = model.lm_head(model.hidden(seq)[:, -1]).argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
        out.append(seq)
    return torch.cat(out)


def predict_acceptance(model, prompt_ids, *, max_tokens: int, max_draft: int = 4, batch: int = 16) -> dict[str, Any]:
    """Expected LMDeploy accept length for greedy MTP with 1..max_draft draft tokens.

    ``prompt_ids`` is a ``[B, P]`` tensor (equal-length prompts). Accept length is
    ``1 + accepted / verification steps`` summed over all requests, as LMDeploy's counters give it.
    """
    torch = _torch()
    P = prompt_ids.shape[1]
    with torch.no_grad():
        seqs = greedy_generate(model, prompt_ids, max_tokens + max_draft + 1)
        rows, checks = [], []
        for i in range(0, seqs.shape[0], batch):
            match, check = chain_matches(model, seqs[i: i + batch], max_draft)
            rows.append(match.cpu())
            checks.append(check)
    match = torch.cat(rows, dim=1).numpy()
    result: dict[str, Any] = {"per_draft_tokens": {}, "layer_self_check_max_abs_diff": max(checks)}
    for n in range(1, max_draft + 1):
        steps = accepted = 0
        per_pos = [0] * n
        for b in range(match.shape[1]):
            s, a, pp = walk_steps(match[:, b], P, max_tokens, n)
            steps, accepted = steps + s, accepted + a
            per_pos = [x + y for x, y in zip(per_pos, pp)]
        result["per_draft_tokens"][str(n)] = {
            "accept_length": 1 + accepted / steps, "steps": steps, "accepted": accepted,
            "draft_tokens": steps * n, "per_position_accept_rate": [x / steps for x in per_pos]}
    # teacher-forced rates over the generated part: P(draft k right | all earlier right)
    gen = slice(P - 1, P - 1 + max_tokens)
    first = float(match[0, :, gen].mean())
    result["depth1_agreement_on_generated"] = first
    result["greedy_token_ids"] = seqs[:, P: P + max_tokens].tolist()
    return result


# ----- data -----------------------------------------------------------------------------------------------
def load_tokenizer(ckpt: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ckpt / "tokenizer.json"))


def token_stream(tokenizer, texts: Sequence[str], eos_id: int):
    """All texts as one int32 token tensor, files separated by ``<|endoftext|>``."""
    torch = _torch()
    parts = []
    for enc in tokenizer.encode_batch(list(texts), add_special_tokens=False):
        parts.append(torch.tensor(enc.ids + [eos_id], dtype=torch.int32))
    return torch.cat(parts)


def held_out_prompts(tokenizer, texts: Sequence[str], *, count: int, length: int, seed: int) -> list[str]:
    """``count`` prompts of exactly ``length`` tokens from held-out sources, each starting at a line
    start and each re-encoding to the same ids (so LMDeploy's tokenizer sees what the prediction saw)."""
    rng = random.Random(seed)
    prompts: list[str] = []
    order = list(range(len(texts)))
    rng.shuffle(order)
    for rounds in range(8):
        for i in order:
            lines = texts[i].splitlines(keepends=True)
            if len(lines) < 10:
                continue
            start = rng.randrange(0, max(1, len(lines) - 10))
            text = "".join(lines[start:])
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) < length:
                continue
            prompt = tokenizer.decode(ids[:length])
            if tokenizer.encode(prompt, add_special_tokens=False).ids != ids[:length] or prompt in prompts:
                continue
            prompts.append(prompt)
            if len(prompts) == count:
                return prompts
    if not prompts:
        raise CheckpointError("no held-out prompts found; pass more --text-root folders")
    return prompts


# ----- training --------------------------------------------------------------------------------------------
def train(model, data, cfg: TrainConfig, *, device: str, log=print) -> dict[str, Any]:
    """Optimise for ``cfg.steps`` steps, or without them for ``cfg.minutes`` of wall time (warm-up, then
    cosine decay over the steps or the time budget)."""
    torch = _torch()
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=device.startswith("cuda"))
    budget = cfg.minutes * 60
    start = time.monotonic()
    step = tokens = 0
    history = []
    last_log = start
    data = data.to(device)
    n = data.numel() - cfg.seq_len - 1
    while True:
        elapsed = time.monotonic() - start
        if (step >= cfg.steps) if cfg.steps is not None else (elapsed >= budget):
            break
        frac = step / cfg.steps if cfg.steps is not None else elapsed / budget
        lr = cfg.peak_lr * min(1.0, (step + 1) / cfg.warmup_steps)
        lr *= cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        for group in opt.param_groups:
            group["lr"] = lr
        offsets = torch.randint(0, n, (cfg.batch_size,), generator=gen)
        idx = offsets[:, None].to(device) + torch.arange(cfg.seq_len + 1, device=device)[None]
        batch = data[idx].long()
        with torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16):
            losses = model.losses(batch, depth2=cfg.mtp_depth2_weight > 0)
        loss = losses["main"] + cfg.mtp_weight * (losses["mtp1"] + cfg.mtp_depth2_weight * losses.get("mtp2", 0.0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += batch.numel()
        now = time.monotonic()
        if now - last_log >= 10 or step == 1:
            row = {"step": step, "elapsed_s": round(now - start, 1), "lr": lr, "tokens": tokens,
                   "tokens_per_s": round(tokens / (now - start)),
                   **{k: round(v.item(), 4) for k, v in losses.items()}}
            history.append(row)
            log(json.dumps(row))
            last_log = now
    return {"steps": step, "tokens": tokens, "seconds": round(time.monotonic() - start, 1), "history": history}


def _versions() -> dict[str, str]:
    torch = _torch()
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": str(torch.version.cuda), "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    try:
        import fla

        out["fla"] = getattr(fla, "__version__", "?")
    except Exception:  # noqa: BLE001 (absent or disabled)
        out["fla"] = "not used"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m tuning.checkpoint.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    length = ap.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=3.0, help="optimiser wall time (default 3)")
    length.add_argument("--steps", type=int, default=None, help="a fixed number of optimiser steps instead of "
                        "--minutes: the same recipe for as long in every run (an H200 makes ~165 steps a minute)")
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    ap.add_argument("--seq-len", type=int, default=TrainConfig.seq_len)
    ap.add_argument("--lr", type=float, default=TrainConfig.peak_lr)
    ap.add_argument("--train-bytes", type=int, default=TrainConfig.train_bytes, help="source bytes to train on")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--linear-kernel", choices=["auto", "fla", "torch"], default="auto",
                    help="gated delta rule: FLA Triton kernels, transformers' PyTorch version, or FLA with "
                         "fallback to PyTorch if its first step fails")
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--eval-prompt-tokens", type=int, default=256)
    ap.add_argument("--eval-max-tokens", type=int, default=256)
    ap.add_argument("--bench-prompts", type=int, default=64, help="extra held-out prompts stored for benchmarks")
    ap.add_argument("--bench-prompt-tokens", type=int, default=512)
    ap.add_argument("--max-draft", type=int, default=4)
    ap.add_argument("--skip-train", action="store_true", help="only predict acceptance for the weights in OUT_DIR")
    _shape_args(ap)
    a = ap.parse_args(argv)
    if a.linear_kernel == "torch":
        _disable_fla()
    torch = _torch()
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(a.seed)
    log = lambda msg: print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    t0 = time.monotonic()
    try:
        cfg = TrainConfig(minutes=a.minutes, seq_len=a.seq_len, batch_size=a.batch_size, peak_lr=a.lr,
                          train_bytes=a.train_bytes, seed=a.seed, steps=a.steps)
        if not (a.out_dir / "config.json").exists():
            build_checkpoint(a.out_dir, shape_from_args(a), seed=a.seed, text_roots=a.text_root,
                             tokenizer_bytes=a.tokenizer_bytes)
            log(f"built {a.out_dir} ({time.monotonic() - t0:.0f} s)")
        model, config, other = load_model(a.out_dir, device=device)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tokenizer = load_tokenizer(a.out_dir)
    eos = tokenizer.token_to_id("<|endoftext|>")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model {n_params / 1e6:.1f}M parameters on {device}; versions {_versions()}")
    report: dict[str, Any] = {"checkpoint": str(a.out_dir), "parameters": n_params, "versions": _versions(),
                              "train_config": dataclasses.asdict(cfg)}
    if not a.skip_train:
        texts = read_texts(collect_source_files(a.text_root, max_bytes=cfg.train_bytes, split="train"))
        data = token_stream(tokenizer, texts, eos)
        log(f"training data: {len(texts)} files, {data.numel() / 1e6:.1f}M tokens ({time.monotonic() - t0:.0f} s)")
        model.train()
        if a.linear_kernel == "auto" and device.startswith("cuda"):
            try:  # one step with the FLA kernels; on failure re-run with the PyTorch gated delta rule
                probe = data[: 2 * (cfg.seq_len + 1)].view(2, -1).to(device).long()
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    sum(model.losses(probe).values()).backward()
                model.zero_grad(set_to_none=True)
            except Exception as e:  # noqa: BLE001 (any kernel failure -> fallback)
                log(f"FLA kernels failed ({type(e).__name__}: {e}); re-running with --linear-kernel torch")
                os.execv(sys.executable, [sys.executable, "-m", "tuning.checkpoint.train", *argv,
                                          "--linear-kernel", "torch"])
        report["training"] = train(model, data, cfg, device=device, log=log)
        del data
    model.eval()
    cast_parameters(model, torch.bfloat16)  # predict with the weights LMDeploy will load
    if not a.skip_train:
        save_model(model, a.out_dir, other)
        report["weights_sha256"] = weights_sha256(a.out_dir)
        log(f"saved {a.out_dir / WEIGHTS_FILE} (sha256 {report['weights_sha256'][:16]})")
    eval_texts = read_texts(collect_source_files(a.text_root, max_bytes=8 << 20, split="eval"))
    prompts = held_out_prompts(tokenizer, eval_texts, count=a.eval_prompts, length=a.eval_prompt_tokens, seed=a.seed)
    bench = held_out_prompts(tokenizer, eval_texts, count=a.bench_prompts, length=a.bench_prompt_tokens,
                             seed=a.seed + 1)
    ids = torch.tensor([tokenizer.encode(p, add_special_tokens=False).ids for p in prompts], device=device)
    pred = predict_acceptance(model, ids, max_tokens=a.eval_max_tokens, max_draft=a.max_draft)
    expected = {
        "what": "accept length LMDeploy qwen3_5_mtp should report (greedy, ignore_eos, completions API, "
                "raw prompts without chat template) for these prompts and max_tokens",
        "max_tokens": a.eval_max_tokens, "prompt_tokens": a.eval_prompt_tokens, "prompts": prompts,
        **pred, "bench_prompts": bench, "bench_prompt_tokens": a.bench_prompt_tokens,
        "versions": report["versions"],
    }
    (a.out_dir / EXPECTED_FILE).write_text(json.dumps(expected))
    summary = {n: round(v["accept_length"], 3) for n, v in pred["per_draft_tokens"].items()}
    report["expected_accept_length"] = summary
    report["depth1_agreement_on_generated"] = pred["depth1_agreement_on_generated"]
    report["layer_self_check_max_abs_diff"] = pred["layer_self_check_max_abs_diff"]
    report["total_seconds"] = round(time.monotonic() - t0, 1)
    (a.out_dir / "train_report.json").write_text(json.dumps(report, indent=2))
    log(f"expected accept length by draft tokens: {summary}; depth-1 agreement "
        f"{pred['depth1_agreement_on_generated']:.3f}; layer self-check {pred['layer_self_check_max_abs_diff']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
