"""The sweep's shared state on the Ray cluster: the result cache (one measurement per engine command)
and the per-GPU lease (engines sharing a GPU start side by side, are measured one at a time).

Both are plain classes made Ray actors by the sweep driver (``ray.remote(ResultCache)``), so trials on
any node share them, and tests can drive them in-process too.
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from orchestrator.errors import ConfigError
from tuning.sweep.records import ResultRow

__all__ = ["LEASE_MODES", "MEASURE", "STARTUP", "GpuLease", "ResultCache", "cached_copy", "measure_lease",
           "startup_lease"]

logger = logging.getLogger(__name__)


class ResultCache:
    """Rows by engine key for one sweep (a Ray actor: trials on any node share it).

    ``claim(key, trial_id)`` answers ``("run", None)`` (caller measures, then ``put``s),
    ``("cached", rows)`` or ``("wait", None)`` while another trial measures the same key.
    """

    def __init__(self, seed: Mapping[str, Sequence[ResultRow]] | None = None) -> None:
        self._rows: dict[str, list[ResultRow]] = {k: list(v) for k, v in (seed or {}).items()}
        self._running: dict[str, str] = {}

    def claim(self, key: str, trial_id: str) -> tuple[str, list[ResultRow] | None]:
        if key in self._rows:
            return "cached", self._rows[key]
        owner = self._running.get(key)
        if owner is not None and owner != trial_id:
            return "wait", None
        self._running[key] = trial_id
        return "run", None

    def put(self, key: str, rows: Sequence[ResultRow]) -> None:
        self._rows[key] = list(rows)
        self._running.pop(key, None)

    def release(self, key: str) -> None:
        self._running.pop(key, None)

    def keys(self) -> list[str]:
        return sorted(self._rows)


STARTUP = "startup"
"""Lease mode of an engine start-up: shared, many may hold a GPU at once."""
MEASURE = "measure"
"""Lease mode of a measurement: exclusive, alone on its GPUs."""
LEASE_MODES = (STARTUP, MEASURE)


class GpuLease:
    """Who may start an engine or measure on each GPU now: a readers-writer lease per GPU with
    writer preference (a Ray actor, one per sweep run with ``--share-gpu``).

    Engines that share a GPU start side by side (start-up is what a trial pays for), but a figure
    taken while a neighbour on the same GPU serves load *or starts up* (CUDA graph capture, kernel
    warm-up and KV allocation are GPU-heavy; in an H200 sweep start-ups overlapped half the
    measurements) would measure the neighbour too. So:

    - ``startup`` holds are shared, granted while no measurement holds the GPU *and none waits for
      it*: a measurement waits for the start-ups already running, never for new ones;
    - a ``measure`` hold is exclusive, granted while no other holder of either mode holds the GPU and
      no measurement has waited longer (first come, first served); a refused one is recorded as
      waiting (refreshed by the caller's polling, keeping its place), which stops new start-ups.
      The queue is what makes measurement rounds interleave: an engine that gives the GPU back
      between rounds queues behind the neighbours already waiting, so co-resident configs take turns
      round by round rather than one measuring all its rounds while the others wait.

    Several GPUs are taken all or none in one call (an actor runs one call at a time), so two trials
    never each hold half of what the other needs. Every hold and waiting mark expires ``ttl_s`` after
    it was last renewed (:func:`measure_lease` and :func:`startup_lease` renew in a thread; a renewal
    only extends a live hold, never takes one back), so a
    trial that dies blocks a GPU for ``ttl_s`` at most, never for good.
    """

    def __init__(self, ttl_s: float = 30.0) -> None:
        self._ttl_s = ttl_s
        # gpu -> holder -> (mode, until)
        self._held: dict[str, dict[str, tuple[str, float]]] = {}
        # gpu -> holder -> (mode, until, since); only measurements wait, and ``since`` (when it first
        # asked, kept across refreshes) is its place in the queue, gone with the wait
        self._waiting: dict[str, dict[str, tuple[str, float, float]]] = {}

    def try_acquire(self, gpus: Sequence[str], holder: str, mode: str = MEASURE) -> bool:
        """Take (or renew) ``holder``'s ``mode`` hold on every GPU in ``gpus``, or on none of them.

        ``False`` while another holder's hold (or, for a start-up, a waiting measurement) is in the
        way; a refused measurement then waits. A live hold of the same holder and mode is always
        renewed (a start-up already running is not stopped by a measurement that waits for it).
        """
        if isinstance(gpus, str):
            raise TypeError("gpus is a sequence of GPU keys, not one key")
        if mode not in LEASE_MODES:
            raise ConfigError(f"lease mode must be one of {LEASE_MODES}, got {mode!r}")
        now = time.monotonic()
        self._expire(now)
        until = now + self._ttl_s
        if all(self._may_hold(g, holder, mode) for g in gpus):
            for g in gpus:
                self._held.setdefault(g, {})[holder] = (mode, until)
                self._drop(self._waiting, g, holder)
            return True
        if mode == MEASURE:
            for g in gpus:
                waiting = self._waiting.setdefault(g, {})
                since = waiting[holder][2] if holder in waiting else now
                waiting[holder] = (MEASURE, until, since)
        return False

    def renew(self, gpus: Sequence[str], holder: str, mode: str = MEASURE) -> bool:
        """Extend ``holder``'s live ``mode`` holds on ``gpus``; never grants one or marks a wait. A
        renewal must not take back a hold that lapsed or was released (a late renewal after the
        release, or one after a stall past ``ttl_s``, would otherwise hold a GPU nobody uses).
        ``False`` when any of the holds is gone."""
        now = time.monotonic()
        self._expire(now)
        alive = True
        for g in gpus:
            current = self._held.get(g, {}).get(holder)
            if current is not None and current[0] == mode:
                self._held[g][holder] = (mode, now + self._ttl_s)
            else:
                alive = False
        return alive

    def release(self, gpus: Sequence[str], holder: str, mode: str = MEASURE) -> None:
        """Give back ``holder``'s ``mode`` holds on ``gpus`` (and, for a measurement, its waiting)."""
        for g in gpus:
            if self._held.get(g, {}).get(holder, ("", 0.0))[0] == mode:
                self._drop(self._held, g, holder)
            if mode == MEASURE:
                self._drop(self._waiting, g, holder)

    def holders(self) -> dict[str, dict[str, str]]:
        """Live holds: ``{gpu: {holder: mode}}`` (diagnostics and tests)."""
        self._expire(time.monotonic())
        return {g: {h: mode for h, (mode, _) in held.items()} for g, held in self._held.items()}

    def waiting(self) -> dict[str, list[str]]:
        """Measurements waiting for each GPU: ``{gpu: [holder, ...]}`` (diagnostics and tests)."""
        self._expire(time.monotonic())
        return {g: sorted(w) for g, w in self._waiting.items()}

    def _may_hold(self, gpu: str, holder: str, mode: str) -> bool:
        held = self._held.get(gpu, {})
        if held.get(holder, ("", 0.0))[0] == mode:
            return True  # renewal
        others = [m for h, (m, _) in held.items() if h != holder]
        if mode == MEASURE:
            waiting = self._waiting.get(gpu, {})
            mine = waiting[holder][2] if holder in waiting else math.inf
            return not others and not any(w[2] < mine for h, w in waiting.items() if h != holder)
        waiters = [h for h in self._waiting.get(gpu, {}) if h != holder]
        return MEASURE not in others and not waiters

    def _expire(self, now: float) -> None:
        for table in (self._held, self._waiting):
            for g in list(table):
                for h in [h for h, entry in table[g].items() if entry[1] <= now]:
                    self._drop(table, g, h)

    @staticmethod
    def _drop(table: dict[str, dict[str, tuple[Any, ...]]], gpu: str, holder: str) -> None:
        entries = table.get(gpu)
        if entries is not None:
            entries.pop(holder, None)
            if not entries:
                del table[gpu]


def measure_lease(lease: Any, gpus: Sequence[str], holder: str, *, poll_s: float = 0.5,
                  renew_s: float = 5.0) -> contextlib.AbstractContextManager[None]:
    """Hold the exclusive ``measure`` lease of every GPU in ``gpus`` (a :class:`GpuLease` actor handle)
    for the ``with`` body: no other engine on those GPUs is measured or starts up meanwhile."""
    return _lease(lease, gpus, holder, MEASURE, poll_s=poll_s, renew_s=renew_s)


def startup_lease(lease: Any, gpus: Sequence[str], holder: str, *, poll_s: float = 0.5,
                  renew_s: float = 5.0) -> contextlib.AbstractContextManager[None]:
    """Hold the shared ``startup`` lease of every GPU in ``gpus`` for the ``with`` body: start-ups run
    side by side, but never while a measurement on those GPUs runs or waits."""
    return _lease(lease, gpus, holder, STARTUP, poll_s=poll_s, renew_s=renew_s)


@contextlib.contextmanager
def _lease(lease: Any, gpus: Sequence[str], holder: str, mode: str, *, poll_s: float,
           renew_s: float) -> Iterator[None]:
    """Wait for ``mode``'s hold on all of ``gpus``, renew it in a thread while the body runs, give
    it back after (also when the wait itself is interrupted: a waiting measurement holds off
    start-ups)."""
    import ray

    gpus = sorted(set(gpus))
    try:
        while not ray.get(lease.try_acquire.remote(gpus, holder, mode)):
            time.sleep(poll_s)
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(renew_s):
                try:
                    if not ray.get(lease.renew.remote(gpus, holder, mode)):
                        logger.warning("%s lease of %s on %s lapsed before its renewal", mode, holder, gpus)
                except Exception:  # noqa: BLE001 - the sweep is ending; the lease expires by itself
                    return

        renewer = threading.Thread(target=renew, name=f"{mode}-lease-renew", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join(timeout=renew_s)
    finally:
        try:
            ray.get(lease.release.remote(gpus, holder, mode))
        except Exception:  # noqa: BLE001 - actor gone with the sweep
            pass


def cached_copy(rows: Sequence[ResultRow], *, trial_id: str, role: str) -> list[ResultRow]:
    """``rows`` measured by another trial, as trial ``trial_id``'s (marked cached, naming the measuring trial)."""
    return [r.replace(trial_id=trial_id, role=role, cached=True, cached_from_trial=r.cached_from_trial or r.trial_id)
            for r in rows]
