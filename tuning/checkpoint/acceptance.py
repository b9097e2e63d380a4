"""Constructed weights whose MTP acceptance is set, not trained: an agreement level and a sharpness.

A tuner needs a GPU testbed where acceptance is a knob: how often the MTP head's greedy draft is the
target's next token (the *agreement*), and how fast acceptance falls as the sampling temperature rises
(the *sharpness* of the target's distribution). This module writes the few tensors that decide both,
for any Qwen3.5 shape (dense or MoE) whose token-mixing output projections are zero, so that every
position's hidden state is its own token's embedding:

- **The target** predicts, for every ordinary token ``y``, its successor along one random cycle through
  all ordinary tokens (``lm_head[succ(y)] = c * embed(y)``). Concurrent sequences therefore carry distinct
  tokens and spread over experts as real traffic does, instead of collapsing onto a few fixed points.
  Every ordinary embedding has squared norm ``H`` (RMSNorm leaves it as it is); ``lm_head`` rows scaled
  by ``c = sharpness / H`` make the successor's logit ``sharpness`` while the other ordinary tokens' logits
  scatter around ``c`` with standard deviation ``~sharpness / sqrt(H)``. The scale sits in ``lm_head``, where
  bf16 keeps it to ~0.4 %, not in the final norm: its stored weight ``c - 1`` lies near -1, where bf16's step
  of 2**-8 would round the sharpness to a multiple of ``H / 256`` (3 at hidden 768, 8 at 2048). Special and
  padding rows carry ``-H`` on a constant bias coordinate, so they are never generated.
- **The MTP head** is ``fc = [A | 0]`` with ``A = diag(1, I, -I)`` over (bias coordinate, ``u`` block,
  ``w`` block). Tokens outside the *disagreement set* ``S`` have their embedding in ``u`` only, so ``A``
  leaves them alone and the head drafts the successor. Tokens in ``S`` carry three quarters of their
  norm in ``w``: ``A`` flips it, the successor's MTP logit turns negative and the draft is some other
  token. ``|S| = (1 - agreement) * n`` tokens, drawn at random, so along the cycle each draft is right
  with probability ``agreement``.

:func:`predict_accept_length` computes what LMDeploy should measure from the tensors themselves (float32
arithmetic on the stored bf16 values, averaged over every ordinary start token): with no token mixing, draft ``k`` is the MTP's greedy choice
after draft ``k - 1`` and the target accepts it with its own probability of that token at the request's
temperature (LMDeploy 0.18 passes no draft probabilities, so a greedy draft is accepted with the target's
probability of it; at temperature 0, when it is the target's argmax). The accept length is
``1 + sum_k prod_{j<k} q(y_j)``, averaged over start tokens. The target's probability is the
temperature-scaled softmax over the whole vocabulary: LMDeploy 0.18 accepts a draft against it before
the request's ``top_k`` / ``top_p`` filtering (its OpenAI endpoints' default ``top_k = 40`` does not raise
acceptance; ``benchmarks/results/gpu_acceptance_h200_2026-12-01.md``). ``top_k`` / ``top_p`` stay
parameters for engines that filter first.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuning.checkpoint.errors import CheckpointError

__all__ = [
    "LMDEPLOY_API_TOP_K",
    "AcceptanceSpec",
    "ControlledHead",
    "controlled_head",
    "predict_accept_length",
    "predict_accept_lengths",
    "predict_from_weights",
    "predict_from_weights_all",
]

#: What LMDeploy 0.18's ``/v1/completions`` and ``/v1/chat/completions`` use when a request gives no ``top_k``
#: (it filters the sampled token, not the distribution a draft is accepted against).
LMDEPLOY_API_TOP_K = 40

#: Share of a disagreeing token's squared norm that sits in the ``w`` block (flipped by the MTP head).
_W_SHARE = 0.75


@dataclass(frozen=True)
class AcceptanceSpec:
    """How often the MTP head agrees with the target, and how sharp the target is.

    Args:
        agreement: share of draft positions whose greedy draft is the target's greedy token, 0..1.
        sharpness: the successor's logit at temperature 1 over the mean of the other ordinary tokens'.
            Higher keeps acceptance up as temperature rises; it does not change greedy acceptance.
    """

    agreement: float = 1.0
    sharpness: float = 8.0

    def __post_init__(self) -> None:
        if not (isinstance(self.agreement, (int, float)) and 0.0 <= self.agreement <= 1.0):
            raise CheckpointError(f"agreement={self.agreement!r} is out of range; allowed: 0..1")
        if not (isinstance(self.sharpness, (int, float)) and 0.0 < self.sharpness <= 1000.0
                and math.isfinite(self.sharpness)):
            raise CheckpointError(f"sharpness={self.sharpness!r} is out of range; allowed: (0, 1000]")


@dataclass(frozen=True)
class ControlledHead:
    """The tensors that set acceptance (float32; the caller casts), and the cycle they encode."""

    embed: Any                 # [V, H]
    lm_head: Any               # [V, H]
    mtp_fc: Any                # [H, 2H]
    final_norm: Any            # [H], stored as w with scale 1 + w
    successor: Any             # [V] long: the target's greedy next token of each ordinary token (-1 elsewhere)
    disagrees: Any             # [V] bool: tokens whose MTP draft is wrong
    ordinary: Any              # [n] long: the ordinary token ids


def controlled_head(vocab_size: int, hidden_size: int, ordinary_ids: Sequence[int] | Any, spec: AcceptanceSpec,
                    *, seed: int = 0, device: str = "cpu") -> ControlledHead:
    """Build the embedding, ``lm_head``, final-norm and ``mtp.fc`` tensors for ``spec``.

    ``ordinary_ids`` are the tokens the tokenizer produces that are not special; every other row of
    the vocabulary (special tokens, padding) is suppressed in the output.
    """
    import torch

    V, H = vocab_size, hidden_size
    ordinary = torch.as_tensor(list(ordinary_ids) if not torch.is_tensor(ordinary_ids) else ordinary_ids,
                               dtype=torch.long, device=device)
    n = int(ordinary.numel())
    if H < 8:
        raise CheckpointError(f"hidden_size={H} is too small for a controlled head; allowed: >= 8")
    if n < 2 or int(ordinary.max()) >= V or int(ordinary.min()) < 0 or ordinary.unique().numel() != n:
        raise CheckpointError(f"ordinary_ids must be >= 2 distinct ids below vocab_size={V}")
    gen = torch.Generator(device=device).manual_seed(seed)
    d_w = (H - 1) // 2
    d_u = H - 1 - d_w
    u_slice, w_slice = slice(1, 1 + d_u), slice(1 + d_u, H)

    disagrees = torch.zeros(V, dtype=torch.bool, device=device)
    n_dis = round((1.0 - spec.agreement) * n)
    if n_dis:
        disagrees[ordinary[torch.randperm(n, generator=gen, device=device)[:n_dis]]] = True

    # Every ordinary embedding: bias coordinate 1, the rest of the squared norm H - 1 in u (or split u/w).
    embed = torch.zeros(V, H, device=device)
    embed[:, 0] = 1.0
    u = torch.randn(V, d_u, generator=gen, device=device)
    w = torch.randn(V, d_w, generator=gen, device=device)
    u = u / u.norm(dim=1, keepdim=True)
    w = w / w.norm(dim=1, keepdim=True)
    rest = math.sqrt(H - 1)
    u_share = torch.where(disagrees, math.sqrt(1.0 - _W_SHARE), 1.0).unsqueeze(1)
    w_share = torch.where(disagrees, math.sqrt(_W_SHARE), 0.0).unsqueeze(1)
    embed[:, u_slice] = u * u_share * rest
    embed[:, w_slice] = w * w_share * rest

    # One random cycle through all ordinary tokens: lm_head[succ(y)] = c * embed(y).
    order = ordinary[torch.randperm(n, generator=gen, device=device)]
    successor = torch.full((V,), -1, dtype=torch.long, device=device)
    successor[order] = torch.roll(order, -1)
    lm_head = torch.zeros(V, H, device=device)
    lm_head[:, 0] = -float(H)  # special and padding rows: far below every ordinary logit
    lm_head[successor[order]] = embed[order] * (spec.sharpness / H)

    final_norm = torch.zeros(H, device=device)  # scale 1 + w = 1: the norm leaves every embedding as it is
    a = torch.ones(H, device=device)
    a[w_slice] = -1.0
    mtp_fc = torch.cat([torch.diag(a), torch.zeros(H, H, device=device)], dim=1)
    return ControlledHead(embed=embed, lm_head=lm_head, mtp_fc=mtp_fc, final_norm=final_norm, successor=successor,
                          disagrees=disagrees, ordinary=ordinary)


def _rms_norm(x: Any, scale: Any, eps: float) -> Any:
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * scale


def predict_accept_length(
    *,
    embed: Any,
    lm_head: Any,
    final_norm: Any,
    mtp_fc: Any,
    mtp_pre_fc_norm_embedding: Any,
    mtp_norm: Any,
    ordinary: Any,
    num_draft_tokens: int,
    temperature: float,
    rms_norm_eps: float = 1e-6,
    top_k: int = 0,
    top_p: float = 1.0,
    samples: int | None = None,
    seed: int = 0,
) -> float:
    """Expected accept length (tokens per verification step, ``1 + accepted drafts``) for
    ``num_draft_tokens`` drafts at ``temperature`` (after ``top_k``, 0 = off, and ``top_p`` filtering),
    from the stored tensors of a checkpoint whose token-mixing output projections are zero. Norm
    weights are as stored (scale ``1 + w``). :func:`predict_accept_lengths` gives every draft count and
    several temperatures from one pass."""
    return predict_accept_lengths(
        embed=embed, lm_head=lm_head, final_norm=final_norm, mtp_fc=mtp_fc,
        mtp_pre_fc_norm_embedding=mtp_pre_fc_norm_embedding, mtp_norm=mtp_norm, ordinary=ordinary,
        max_draft_tokens=num_draft_tokens, temperatures=(temperature,), rms_norm_eps=rms_norm_eps, top_k=top_k,
        top_p=top_p, samples=samples, seed=seed)[float(temperature)][-1]


#: Tokens per chunk of the per-token pass (bounds its ``chunk x vocabulary`` logits).
_CHUNK_LOGITS = 1 << 26
#: Added to the seed of a prediction's random start tokens (see :func:`predict_accept_lengths`).
_SAMPLE_SEED_OFFSET = 0x9E3779B9


def predict_accept_lengths(
    *,
    embed: Any,
    lm_head: Any,
    final_norm: Any,
    mtp_fc: Any,
    mtp_pre_fc_norm_embedding: Any,
    mtp_norm: Any,
    ordinary: Any,
    max_draft_tokens: int,
    temperatures: Sequence[float],
    rms_norm_eps: float = 1e-6,
    top_k: int = 0,
    top_p: float = 1.0,
    samples: int | None = None,
    seed: int = 0,
) -> dict[float, tuple[float, ...]]:
    """Expected accept lengths for 1..``max_draft_tokens`` drafts at each temperature: ``{T: (N=1, N=2, ...)}``.

    With no token mixing a token's draft and the target's probability of it depend on that token alone, so
    one pass over the tokens a chain can reach gives both; a chain is then lookups (draft ``k`` of a chain is
    step ``k`` of the longest one). The expectation is over start tokens: every ordinary token by default
    (``samples=None``), the average along the cycle that long outputs traverse; an integer draws that many
    distinct start tokens at random instead (an estimate: the share of starts outside the disagreement set
    carries a sampling error of about ``sqrt(a (1 - a) / samples)`` at agreement ``a``, which every draft
    count inherits and longer chains amplify).
    """
    import torch

    if max_draft_tokens < 1:
        raise ValueError(f"max_draft_tokens={max_draft_tokens}; allowed: >= 1")
    temps = [float(t) for t in temperatures]
    if not temps or min(temps) < 0:
        raise ValueError(f"temperatures={list(temperatures)}; allowed: one or more, each >= 0")
    if samples is not None and samples < 1:
        raise ValueError(f"samples={samples}; allowed: >= 1, or None for every ordinary token")
    f32 = torch.float32
    device = embed.device
    emb, head = embed.to(f32), lm_head.to(f32)
    V, H = emb.shape
    fc_emb = mtp_fc.to(f32)[:, :H]  # the hidden half multiplies a state the construction ignores: zero
    target_scale, pre_fc_scale, mtp_scale = (1.0 + w.to(f32) for w in (final_norm, mtp_pre_fc_norm_embedding, mtp_norm))
    starts = torch.as_tensor(ordinary, dtype=torch.long, device=device).flatten()
    if starts.numel() == 0:
        raise ValueError("ordinary is empty; allowed: the token ids a chain may start from (one or more)")
    if samples is not None and samples < len(starts):
        # Not ``seed`` itself: :func:`controlled_head` draws the disagreement set as the first draws of a
        # permutation with the builder's seed, so the same seed would start every chain inside it.
        gen = torch.Generator(device=device).manual_seed(seed + _SAMPLE_SEED_OFFSET)
        starts = starts[torch.randperm(len(starts), generator=gen, device=device)[:samples]]

    draft_of = torch.full((V,), -1, dtype=torch.long, device=device)
    q = {t: torch.zeros(V, device=device) for t in temps}  # the target's acceptance of each token's draft
    chunk = max(1, _CHUNK_LOGITS // V)

    def score(ids: Any) -> None:
        for y in ids.split(chunk):
            x = emb[y]
            target_logits = _rms_norm(x, target_scale, rms_norm_eps) @ head.T
            e = _rms_norm(x, pre_fc_scale, rms_norm_eps)
            draft = (_rms_norm(e @ fc_emb.T, mtp_scale, rms_norm_eps) @ head.T).argmax(-1)
            draft_of[y] = draft
            for t in temps:
                if t == 0:
                    q[t][y] = (target_logits.argmax(-1) == draft).to(f32)
                else:
                    probs = _filtered_probs(target_logits / t, top_k, top_p)
                    q[t][y] = probs.gather(1, draft.unsqueeze(1)).squeeze(1)

    frontier = starts.unique()
    for _ in range(max_draft_tokens):  # every token a chain of max_draft_tokens steps can reach, scored once
        todo = frontier[draft_of[frontier] < 0]
        if todo.numel():
            score(todo)
        frontier = draft_of[frontier].unique()
    out: dict[float, tuple[float, ...]] = {}
    for t in temps:
        alive = torch.ones(len(starts), dtype=torch.float64, device=device)
        y, accepted = starts, []
        for _ in range(max_draft_tokens):
            alive = alive * q[t][y].to(torch.float64)
            accepted.append(float(alive.mean()))
            y = draft_of[y]
        out[t] = tuple(1.0 + sum(accepted[:k + 1]) for k in range(max_draft_tokens))
    return out


def _filtered_probs(logits: Any, top_k: int, top_p: float) -> Any:
    """Softmax over the tokens top-k and top-p sampling keep (the rest get probability 0)."""
    import torch

    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest prefix reaching top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def predict_from_weights(weights: Mapping[str, Any], text_config: Mapping[str, Any], ordinary: Any,
                         num_draft_tokens: int, temperature: float, *, top_k: int = 0,
                         top_p: float = 1.0, samples: int | None = None, seed: int = 0) -> float:
    """:func:`predict_accept_length` on a checkpoint's tensors, keyed as :mod:`tuning.checkpoint.build` writes them."""
    return predict_from_weights_all(weights, text_config, ordinary, num_draft_tokens, (temperature,), top_k=top_k,
                                    top_p=top_p, samples=samples, seed=seed)[float(temperature)][-1]


def predict_from_weights_all(weights: Mapping[str, Any], text_config: Mapping[str, Any], ordinary: Any,
                             max_draft_tokens: int, temperatures: Sequence[float], *, top_k: int = 0,
                             top_p: float = 1.0, samples: int | None = None,
                             seed: int = 0) -> dict[float, tuple[float, ...]]:
    """:func:`predict_accept_lengths` on a checkpoint's tensors, keyed as :mod:`tuning.checkpoint.build` writes them."""
    lm = "model.language_model"
    return predict_accept_lengths(
        embed=weights[f"{lm}.embed_tokens.weight"], lm_head=weights["lm_head.weight"],
        final_norm=weights[f"{lm}.norm.weight"], mtp_fc=weights["mtp.fc.weight"],
        mtp_pre_fc_norm_embedding=weights["mtp.pre_fc_norm_embedding.weight"], mtp_norm=weights["mtp.norm.weight"],
        ordinary=ordinary, max_draft_tokens=max_draft_tokens, temperatures=temperatures,
        rms_norm_eps=float(text_config.get("rms_norm_eps", 1e-6)), top_k=top_k, top_p=top_p, samples=samples,
        seed=seed,
    )
