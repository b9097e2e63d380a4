"""The latency limits a chosen config must meet (:class:`Constraints`).

Why a module of its own: the sweep's spec carries them from the command line, and every step of the
choice (a bucket's primary, its cells, the prediction on a traffic mix) filters the measurements by them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

__all__ = ["NO_CONSTRAINTS", "Constraints"]


@dataclass(frozen=True)
class Constraints:
    """Latency limits a bucket's chosen config must meet (medians of the measured distribution)."""

    max_tpot_ms: float | None = None
    max_ttft_ms: float | None = None

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("max_tpot_ms", self.max_tpot_ms), ("max_ttft_ms", self.max_ttft_ms)) if v is not None}

    def mask(self, df: pd.DataFrame) -> pd.Series:
        ok = pd.Series(True, index=df.index)
        if self.max_tpot_ms is not None:
            ok &= df["tpot_ms_median"].le(self.max_tpot_ms)
        if self.max_ttft_ms is not None:
            ok &= df["ttft_ms_median"].le(self.max_ttft_ms)
        return ok


NO_CONSTRAINTS = Constraints()
"""No latency limit: every measured config is eligible (the default of every choosing function)."""
