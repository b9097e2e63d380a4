"""How LMDeploy's speculative-decoding counters count, and the engine's tokens per step behind the
accept length they give. Pure; the bench (:mod:`tuning.bench.counters`) and the Serve replica's live
gauge (:mod:`orchestrator.serve.metrics`) share it.

LMDeploy 0.18 adds a decode step's draft statistics to its ``lmdeploy:spec_decode_*`` counters only
for the outputs that reach the api_server, and its output path keeps only the newest step per request
(the engine loop sends the newest step per session, the response slot is overwritten, the
multiprocess mailbox coalesces). The finishing output always arrives. So under load the counters see a
few steps per request, one of them the last: the step that crosses ``max_tokens``, picked in proportion
to its length (an inspection paradox) and counted with every accepted draft, even those cut off by
``max_tokens``. The accept length they give then exceeds the engine's tokens per step, the more so the
fewer outputs per request arrive (higher load, shorter outputs). The other outputs are picked by time,
and a step takes as long whatever it accepts, so they are an even sample of the steps.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.backends.lmdeploy import LMDEPLOY_METRICS

__all__ = [
    "ACCEPTED_TOKENS",
    "DRAFTS",
    "DRAFT_TOKENS",
    "accept_length_of",
    "chain_accept_distribution",
    "chain_counted_accept_length",
    "chain_per_draft",
    "chain_tokens_per_step",
    "counted_accept_length",
    "estimate_tokens_per_step",
]

ACCEPTED_TOKENS = LMDEPLOY_METRICS.accepted_tokens
DRAFT_TOKENS = LMDEPLOY_METRICS.draft_tokens
DRAFTS = LMDEPLOY_METRICS.drafts
"""LMDeploy's Prometheus sample names of its speculative-decoding counters (one draft = one
sequence's decode step that drafted ``N`` tokens); their one home is :mod:`orchestrator.backends.lmdeploy`."""


def chain_accept_distribution(per_draft: float, num_draft_tokens: int) -> tuple[float, ...]:
    """``P(A = k)``, k = 0..N, of the drafts one step accepts when each draft is accepted with probability
    ``per_draft`` given the ones before it (a chain: the first rejection ends the step)."""
    if not 0.0 <= per_draft <= 1.0 or num_draft_tokens < 1:
        raise ValueError(f"per_draft={per_draft}, num_draft_tokens={num_draft_tokens}; allowed: 0..1 and >= 1")
    return tuple(per_draft**k * (1 - per_draft) for k in range(num_draft_tokens)) + (per_draft**num_draft_tokens,)


def _bisect(f: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """``x`` in [lo, hi] with ``f(x) = target`` for an increasing ``f`` (60 halvings); an end of the
    interval when ``target`` lies beyond it."""
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


def chain_per_draft(tokens_per_step: float, num_draft_tokens: int) -> float:
    """The per-draft acceptance of a chain of ``num_draft_tokens`` drafts whose mean step emits
    ``tokens_per_step`` (1 to N + 1)."""
    if not 1.0 <= tokens_per_step <= num_draft_tokens + 1:
        raise ValueError(f"tokens_per_step={tokens_per_step}; allowed: 1..{num_draft_tokens + 1}")
    return _bisect(lambda p: sum((1 + k) * q for k, q in enumerate(chain_accept_distribution(p, num_draft_tokens))),
                   0.0, 1.0, tokens_per_step)


def accept_length_of(accepted: float, draft_tokens: float, num_draft_tokens: int) -> float | None:
    """The accept length the counters give: ``1 + accepted / (draft_tokens / N)`` (each counted draft step
    drafted ``N`` tokens); ``None`` when no draft token was counted."""
    steps = draft_tokens / num_draft_tokens
    return 1.0 + accepted / steps if steps > 0 else None


def counted_accept_length(tokens_per_step: float, last_step: Sequence[float], outputs: float) -> float:
    """The accept length the counters report when each request delivers ``outputs`` decode outputs: its
    last step plus ``outputs - 1`` others taken evenly over its steps.

    ``tokens_per_step`` is the engine's true accept length (tokens over steps, what an even sample of
    steps reports); ``last_step`` is ``P(A = k)`` for a step at the end of the output. The step that
    crosses ``max_tokens`` is chosen in proportion to its length ``1 + A``, so it counts on average
    ``E[(1 + A)^2] / E[1 + A]``, untruncated."""
    if outputs < 1:
        raise ValueError(f"outputs={outputs}; allowed: >= 1 (the finishing output always arrives)")
    first = sum((1 + k) * p for k, p in enumerate(last_step))
    second = sum((1 + k) ** 2 * p for k, p in enumerate(last_step))
    return ((outputs - 1) * tokens_per_step + second / first) / outputs


def chain_counted_accept_length(tokens_per_step: float, num_draft_tokens: int, outputs: float) -> float:
    """:func:`counted_accept_length` for a chain of constant per-draft acceptance (the last step's
    distribution from the mean alone)."""
    per_draft = chain_per_draft(tokens_per_step, num_draft_tokens)
    return counted_accept_length(tokens_per_step, chain_accept_distribution(per_draft, num_draft_tokens), outputs)


def chain_tokens_per_step(counted: float, num_draft_tokens: int, outputs: float) -> float:
    """The inverse: the tokens per step whose counted figure at ``outputs`` per request is ``counted``."""
    return _bisect(lambda t: chain_counted_accept_length(t, num_draft_tokens, outputs), 1.0,
                   float(num_draft_tokens + 1), counted)


def estimate_tokens_per_step(counted: float, num_draft_tokens: int, drafts: float, sequences: float) -> float:
    """The engine's tokens per step behind the accept length ``counted`` that the counters gave over a
    span in which they counted ``drafts`` decode outputs and ``sequences`` decoded sequences ended
    there: :func:`chain_tokens_per_step` at ``drafts / sequences`` outputs per sequence. The one rule
    the bench (:func:`tuning.bench.counters.tokens_per_step_from_counters`) and the Serve replica's
    live gauge (:class:`orchestrator.serve.metrics.AcceptLengthTracker`) share; both figures must come
    from the same span, since the correction is exact only for whole sequences' outputs.

    ``sequences`` 0: no sequence's last step was counted, so ``counted`` is an even sample of the steps
    and the estimate itself (the correction vanishes as outputs per sequence grow; no special case).

    Figures read off live counters may stray past the model's domain by the scrape, not by the engine:
    the counters are read one after another while the engine adds to them (an accepted count ahead of
    its drafts), and a sequence that ends just after a scrape is counted in one span while its last
    step is in the other (fewer counted outputs than sequences). ``counted`` is then taken into
    1..N + 1 and the outputs per sequence up to 1: the model's edge is the best reading."""
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens={num_draft_tokens}; allowed: >= 1")
    counted = min(max(counted, 1.0), float(num_draft_tokens + 1))
    if sequences <= 0:
        return counted
    return chain_tokens_per_step(counted, num_draft_tokens, max(drafts / sequences, 1.0))
