"""A benchmark result as a trial reports it, for tests that build sweep results by hand: measured in
``rounds`` (each round's output throughput), the lower-median round standing for them as the sweep keeps it."""
from __future__ import annotations

from typing import Any

from tuning.sweep.measure import representative_run

__all__ = ["bench_result"]


def bench_result(rounds: list[float]) -> dict[str, Any]:
    lat = {"mean": 10.0, "median": 10.0, "p99": 20.0}
    return representative_run([{"output_throughput": x, "request_throughput": 1.0, "completed": 64, "failed": 0,
                                "failure_reasons": {}, "ttft_ms": lat, "tpot_ms": lat, "itl_ms": lat, "e2e_ms": lat,
                                "accept_length": 2.0, "simulated": True} for x in rounds])
