"""The engine's speculative-decoding counters from its Prometheus page, and the accept length they
give. Pure."""
from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SPEC_COUNTER_NAMES", "accept_length_from_counters", "parse_gauge", "parse_spec_counters"]


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
