"""Simulated engines that share one GPU: each slows the others by time-slicing (off unless asked for).

Why: a routing table's plan can put several tp=1 engines on one GPU (``gpu_budget.shared``); on the GPU
they split its time, so an engine's iteration takes about as many times longer as engines are busy on it
at once. Simulated engines are separate processes with a clock each, so they share a GPU through a
directory (``--shared-gpu DIR``): each keeps one file holding the wall time (``time.time()``) its current
iteration ends, or 0 while idle, and multiplies every iteration's time by one plus the number of other
engines busy at its start (:func:`time_slice_factor`). What it leaves out: kernels of two engines can
overlap a little on a real GPU, and two engines' batches compete for memory bandwidth unevenly; the factor
is the even split the shared-GPU plan predicts with, which served measurement must confirm.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SHARED_GPU_ENV", "SharedGpu", "time_slice_factor"]

SHARED_GPU_ENV = "MTP_SIM_SHARED_GPU"
"""The environment variable that gives a simulated engine its ``--shared-gpu`` directory when the flag is not
given: how a Serve replica declares its engine's shared GPU without changing the engine's config (its key)."""


def time_slice_factor(busy_until: Mapping[str, float], me: str, now: float) -> int:
    """How many times longer ``me``'s iteration starting at ``now`` takes: 1 + the other engines whose
    current iteration ends after ``now`` (``busy_until``: engine -> that end, 0 while idle)."""
    return 1 + sum(1 for engine, until in busy_until.items() if engine != me and until > now)


class SharedGpu:
    """One simulated engine's view of the GPU it shares: it says when its iteration ends, and reads how many
    others are busy. ``refresh_s``: the others' state is read again at most this often (wall seconds), so
    a fast engine loop does not read the directory at every iteration."""

    def __init__(self, directory: str | Path, engine_id: str | None = None, *, refresh_s: float = 0.005) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.engine_id = engine_id or f"{os.getpid()}"
        if not self.engine_id.isalnum():
            raise ValueError(f"engine_id={self.engine_id!r}: letters and digits only (it names a file)")
        self.refresh_s = refresh_s
        self._seen: dict[str, float] = {}
        self._read_at = -1.0
        self.busy_until(0.0)

    @property
    def _own(self) -> Path:
        return self.directory / f"{self.engine_id}.busy"

    def busy_until(self, wall: float) -> None:
        """This engine's current iteration ends at ``wall`` (``time.time()`` seconds; 0: idle)."""
        tmp = self.directory / f".{self.engine_id}.tmp"
        tmp.write_text(repr(float(wall)))
        tmp.replace(self._own)

    def others_busy_until(self) -> dict[str, float]:
        """Every engine's end of its current iteration as last read (this one's included)."""
        now = time.monotonic()
        if now - self._read_at >= self.refresh_s:
            seen = {}
            for f in self.directory.glob("*.busy"):
                try:
                    seen[f.stem] = float(f.read_text() or 0.0)
                except (OSError, ValueError):  # an engine that stopped meanwhile, or a file being replaced
                    continue
            self._seen, self._read_at = seen, now
        return self._seen

    def factor(self, wall: float | None = None) -> int:
        """:func:`time_slice_factor` for an iteration starting at ``wall`` (default: now)."""
        return time_slice_factor(self.others_busy_until(), self.engine_id, time.time() if wall is None else wall)

    def close(self) -> None:
        """Leave the GPU: the others no longer count this engine."""
        self._own.unlink(missing_ok=True)
