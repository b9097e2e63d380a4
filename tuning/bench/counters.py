"""The engine's speculative-decoding counters from its Prometheus page, the accept length they give,
and the engine's tokens per step behind it. Pure.

Under load LMDeploy counts a few decode outputs per request, always the request's length-biased,
untruncated last step, so the accept length from its counters exceeds the engine's tokens per step, the
more so the fewer outputs per request arrive (higher load, shorter outputs): the model and its inverse
are in :mod:`orchestrator.spec_counting` (the Serve replica's live gauge uses them too) and re-exported
here. How much of a rise with load this accounts for, and how much is the engine's own acceptance, a
measurement can tell only with the counters' deltas beside the figure (:func:`outputs_per_request`)."""
from __future__ import annotations

from collections.abc import Mapping

from orchestrator.spec_counting import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    DRAFTS,
    chain_accept_distribution,
    chain_counted_accept_length,
    chain_per_draft,
    chain_tokens_per_step,
    counted_accept_length,
    estimate_tokens_per_step,
)

__all__ = ["SPEC_COUNTER_NAMES", "accept_length_from_counters", "accept_length_label", "chain_accept_distribution",
           "chain_counted_accept_length", "chain_per_draft", "chain_tokens_per_step", "counted_accept_length",
           "outputs_per_request", "parse_gauge", "parse_spec_counters", "tokens_per_step_estimate"]


SPEC_COUNTER_NAMES: dict[str, str] = {
    "num_drafts": DRAFTS,
    "num_draft_tokens": DRAFT_TOKENS,
    "num_accepted_tokens": ACCEPTED_TOKENS,
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


def tokens_per_step_estimate(accept_length: float | None, delta: Mapping[str, float], completed: int,
                              num_draft_tokens: int | None) -> float | None:
    """The engine's tokens per step behind a counted ``accept_length`` (estimated: a chain of constant
    per-draft acceptance counted over :func:`outputs_per_request` outputs, always a request's last;
    :func:`~orchestrator.spec_counting.estimate_tokens_per_step`). ``None`` when the deltas do not say
    how many outputs per request were counted. ``N`` from the engine config when known, else
    ``Δdraft_tokens / Δdrafts``."""
    outputs = outputs_per_request(delta, completed)
    if accept_length is None or outputs is None:
        return None
    n = num_draft_tokens or round(float(delta.get("num_draft_tokens", 0.0)) / float(delta["num_drafts"]))
    if n < 1:
        return None
    return estimate_tokens_per_step(accept_length, n, outputs)


def accept_length_label(accept_length: float | None, delta: Mapping[str, float], completed: int,
                        tokens_per_step: float | None = None) -> str:
    """The accept length as a bench summary shows it: with the decode outputs per request it was counted
    over and, below 10 (where a request's last step, which reads high, is a large share of them), the
    engine's tokens per step estimated from it (:func:`tokens_per_step_estimate`) when given."""
    if accept_length is None:
        return "n/a"
    outputs = outputs_per_request(delta, completed)
    if outputs is None:
        return f"{accept_length:.3f}"
    text = f"{accept_length:.3f} (counted over {outputs:.1f} decode outputs per request"
    if outputs >= 10:
        return text + ")"
    text += f"; 1 in {outputs:.1f} counted steps is a request's last, so it reads above the engine's tokens per step"
    if tokens_per_step is None:
        return text + ")"
    return text + f"; engine ≈ {tokens_per_step:.3f} tokens per step, estimated)"
