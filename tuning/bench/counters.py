"""The engine's speculative-decoding counters from its Prometheus page, the accept length they give,
and the engine's tokens per step behind it. Pure.

Under load LMDeploy counts a few steps per request, always its length-biased last, so the counted
accept length reads above the engine's tokens per step; why, the counting model and its inverse:
:mod:`orchestrator.spec_counting` (re-exported here). How much of a rise with load this accounts for,
and how much is the engine's own acceptance, a measurement can tell only with the counters' deltas
beside the figure (:func:`outputs_per_request`)."""
from __future__ import annotations

from collections.abc import Mapping

from orchestrator.backends import spec_counter_names
from orchestrator.spec_counting import (
    accept_length_of,
    chain_accept_distribution,
    chain_counted_accept_length,
    chain_per_draft,
    chain_tokens_per_step,
    counted_accept_length,
    estimate_tokens_per_step,
)

__all__ = ["SPEC_COUNTER_NAMES", "accept_length_from_counters", "accept_length_label", "chain_accept_distribution",
           "chain_counted_accept_length", "chain_per_draft", "chain_tokens_per_step", "counted_accept_length",
           "outputs_per_request", "parse_gauge", "parse_spec_counters", "tokens_per_step_from_counters"]


SPEC_COUNTER_NAMES: dict[str, tuple[str, ...]] = {
    ours: tuple(sorted(sample for sample, name in spec_counter_names().items() if name == ours))
    for ours in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
}
"""Our name -> every engine's Prometheus sample name of that speculative-decoding counter (each engine's
own: :class:`orchestrator.backends.MetricNames`)."""


def parse_spec_counters(metrics_text: str) -> dict[str, float]:
    """The speculative-decoding counters in a Prometheus text page (summed over labels), whichever
    engine wrote it (``lmdeploy:spec_decode_*``, ``vllm:spec_decode_*``; an engine exposes its own only).

    Matches *samples* by name: the parser strips ``_total`` from counter *family* names, but the
    samples keep it.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = spec_counter_names()
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
        return accept_length_of(accepted, draft_tokens, num_draft_tokens)
    steps = float(delta.get("num_drafts", 0.0))
    return 1.0 + accepted / steps if steps > 0 else None


def outputs_per_request(delta: Mapping[str, float], completed: int) -> float | None:
    """Decode outputs the counters saw per request (``Δnum_drafts / completed``; pass requests cancelled
    mid-stream in ``completed`` too, their outputs count): near 1 when only the finishing output arrives.
    Even one request at a time leaves some steps uncounted: an output the api_server has not taken
    before the engine's next step is replaced by it, so a fast engine outruns its own counting."""
    drafts = float(delta.get("num_drafts", 0.0))
    if completed <= 0 or drafts <= 0:
        return None
    return drafts / completed


def tokens_per_step_from_counters(accept_length: float | None, delta: Mapping[str, float], completed: int,
                                  num_draft_tokens: int | None) -> float | None:
    """The engine's tokens per step behind a counted ``accept_length`` (estimated by
    :func:`~orchestrator.spec_counting.estimate_tokens_per_step`, the rule the Serve replica's live
    gauge follows too) from the run's counter deltas and its ``completed`` requests (pass requests
    cancelled mid-stream too: their outputs were counted). ``None`` when there is no counted figure or
    ``N`` is unknown; ``N`` from the engine config when known, else ``Δdraft_tokens / Δdrafts``."""
    if accept_length is None:
        return None
    drafts = float(delta.get("num_drafts", 0.0))
    n = num_draft_tokens or (round(float(delta.get("num_draft_tokens", 0.0)) / drafts) if drafts > 0 else 0)
    if n < 1:
        return None
    if drafts <= 0:
        drafts = float(delta.get("num_draft_tokens", 0.0)) / n
    return estimate_tokens_per_step(accept_length, n, drafts, max(completed, 0))


def accept_length_label(accept_length: float | None, delta: Mapping[str, float], completed: int,
                        tokens_per_step: float | None = None) -> str:
    """The accept length as a bench summary shows it: with the decode outputs per request it was counted
    over and, below 10 (where a request's last step, which reads high, is a large share of them), the
    engine's tokens per step estimated from it (:func:`tokens_per_step_from_counters`) when given."""
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
