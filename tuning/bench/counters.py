"""The engine's speculative-decoding counters from its Prometheus page, the accept length they give,
and what that figure means under load. Pure.

Why the last part: LMDeploy 0.18 adds a decode step's draft statistics to these counters only for the
outputs that reach the api_server, and its output path keeps only the newest step per request (the
engine loop sends the newest step per session, the response slot is overwritten, the multiprocess
mailbox coalesces). The finishing output always arrives. So under load the counters see a few steps per
request, one of them the last: the step that crosses ``max_tokens``, picked in proportion to its length
(an inspection paradox) and counted with every accepted draft, even those cut off by ``max_tokens``.
The accept length they give then exceeds the engine's tokens per step, the more so the fewer outputs
per request arrive (higher load, shorter outputs). How much of a rise with load this accounts for, and
how much is the engine's own acceptance, a measurement can tell only with the counters' deltas beside
the figure (:func:`outputs_per_request`)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

__all__ = ["SPEC_COUNTER_NAMES", "accept_length_from_counters", "accept_length_label", "chain_accept_distribution",
           "chain_counted_accept_length", "chain_per_draft", "chain_tokens_per_step", "counted_accept_length",
           "outputs_per_request", "parse_gauge", "parse_spec_counters"]


SPEC_COUNTER_NAMES: dict[str, str] = {
    "num_drafts": "lmdeploy:spec_decode_num_drafts_total",
    "num_draft_tokens": "lmdeploy:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "lmdeploy:spec_decode_num_accepted_tokens_total",
}
"""Our name -> LMDeploy's Prometheus sample name of each speculative-decoding counter."""


def parse_spec_counters(metrics_text: str) -> dict[str, float]:
    """The ``lmdeploy:spec_decode_*`` counters in a Prometheus text page (summed over labels).

    Matches *samples* by name: the parser strips ``_total`` from counter *family* names, but the
    samples keep it.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {v: k for k, v in SPEC_COUNTER_NAMES.items()}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def parse_gauge(metrics_text: str, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def accept_length_from_counters(delta: Mapping[str, float], num_draft_tokens: int | None) -> float | None:
    """``1 + Δaccepted / (Δdraft_tokens / N)``; ``None`` when no draft tokens were counted.

    ``N`` (draft tokens per draft step) comes from the engine config when known; otherwise from
    ``Δdraft_tokens / Δdrafts`` (the engine counts one draft per step), i.e. accept length =
    ``1 + Δaccepted / Δdrafts``.
    """
    draft_tokens = float(delta.get("num_draft_tokens", 0.0))
    accepted = float(delta.get("num_accepted_tokens", 0.0))
    if draft_tokens <= 0:
        return None
    if num_draft_tokens:
        steps = draft_tokens / num_draft_tokens
    else:
        steps = float(delta.get("num_drafts", 0.0))
        if steps <= 0:
            return None
    return 1.0 + accepted / steps


def outputs_per_request(delta: Mapping[str, float], completed: int) -> float | None:
    """Decode outputs the counters saw per request (``Δnum_drafts / completed``; pass requests cancelled
    mid-stream in ``completed`` too, their outputs count): near 1 when only the finishing output arrives.
    Even one request at a time leaves some steps uncounted (about a quarter on the H200)."""
    drafts = float(delta.get("num_drafts", 0.0))
    if completed <= 0 or drafts <= 0:
        return None
    return drafts / completed


def chain_accept_distribution(per_draft: float, num_draft_tokens: int) -> tuple[float, ...]:
    """``P(A = k)``, k = 0..N, of the drafts one step accepts when each draft is accepted with probability
    ``per_draft`` given the ones before it (a chain: the first rejection ends the step)."""
    if not 0.0 <= per_draft <= 1.0 or num_draft_tokens < 1:
        raise ValueError(f"per_draft={per_draft}, num_draft_tokens={num_draft_tokens}; allowed: 0..1 and >= 1")
    return tuple(per_draft**k * (1 - per_draft) for k in range(num_draft_tokens)) + (per_draft**num_draft_tokens,)


def _bisect(f: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """``x`` in [lo, hi] with ``f(x) = target`` for an increasing ``f`` (60 halvings)."""
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


def chain_counted_accept_length(tokens_per_step: float, num_draft_tokens: int, outputs: float) -> float:
    """:func:`counted_accept_length` for a chain of constant per-draft acceptance (the last step's
    distribution from the mean alone)."""
    per_draft = chain_per_draft(tokens_per_step, num_draft_tokens)
    return counted_accept_length(tokens_per_step, chain_accept_distribution(per_draft, num_draft_tokens), outputs)


def chain_tokens_per_step(counted: float, num_draft_tokens: int, outputs: float) -> float:
    """The inverse: the tokens per step whose counted figure at ``outputs`` per request is ``counted``."""
    return _bisect(lambda t: chain_counted_accept_length(t, num_draft_tokens, outputs), 1.0,
                   float(num_draft_tokens + 1), counted)


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


def accept_length_label(accept_length: float | None, delta: Mapping[str, float], completed: int) -> str:
    """The accept length as a bench summary shows it: with the decode outputs per request it was counted
    over and, below 10, how large a share of them are requests' last steps (which read high)."""
    if accept_length is None:
        return "n/a"
    outputs = outputs_per_request(delta, completed)
    if outputs is None:
        return f"{accept_length:.3f}"
    text = f"{accept_length:.3f} (counted over {outputs:.1f} decode outputs per request"
    if outputs >= 10:
        return text + ")"
    return text + f"; 1 in {outputs:.1f} counted steps is a request's last, so it reads above the engine's tokens per step)"
