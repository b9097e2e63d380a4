"""A results row as the figures a routing table records, and the gains over the baselines.

Why apart from the rows' schema (:mod:`tuning.results`): the table's figures are what the choice
reports, and clipping (a negative latency dropped, an accept length below 1 left out) is a decision
about what to show, not about what was measured.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orchestrator.table import BucketFigures
from tuning.choose.noise import throughput_interval
from tuning.results import repeat_throughputs

__all__ = ["gains_over", "row_figures"]


def row_figures(row: Mapping[str, Any]) -> BucketFigures:
    def num(k: str) -> float | None:
        v = row.get(k)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        # A negative latency is a measurement artefact (clock skew between client and a time-scaled
        # simulator); drop the figure rather than refuse the whole table.
        return float(v) if float(v) >= 0 else None

    acc = num("accept_length")
    completed, failed = row.get("completed"), row.get("failed_requests")
    interval = throughput_interval(row)
    return BucketFigures(
        output_throughput_ci=interval, rounds=len(repeat_throughputs(row)) if interval is not None else None,
        output_throughput=float(row["output_throughput"]),
        request_throughput=num("request_throughput"),
        ttft_ms_median=num("ttft_ms_median"), ttft_ms_p99=num("ttft_ms_p99"),
        tpot_ms_median=num("tpot_ms_median"), tpot_ms_p99=num("tpot_ms_p99"),
        accept_length=acc if acc is not None and acc >= 1 else None,
        concurrency=int(row["concurrency"]) if row.get("concurrency") is not None else None,
        completed=None if completed is None or (isinstance(completed, float) and math.isnan(completed)) else int(completed),
        failed=None if failed is None or (isinstance(failed, float) and math.isnan(failed)) else int(failed),
    )


def gains_over(figures: BucketFigures, baselines: Mapping[str, BucketFigures]) -> dict[str, float]:
    """Relative output-throughput gain of ``figures`` over each baseline (0.15 = +15 %)."""
    return {k: figures.output_throughput / v.output_throughput - 1.0
            for k, v in baselines.items() if v.output_throughput > 0}
