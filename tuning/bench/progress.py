"""Benchmark progress as callbacks; the rich display (:mod:`tuning.bench.display`) is one implementation.

The bench calls a :class:`BenchProgress` at three points and never depends on what it does: a
display that raises is logged and ignored (:class:`SafeProgress`), so a broken terminal can never
fail a measurement.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tuning.bench.records import BenchResult, RequestOutput

__all__ = ["BenchProgress", "NullProgress", "SafeProgress"]

logger = logging.getLogger(__name__)


@runtime_checkable
class BenchProgress(Protocol):
    """Receives benchmark events. All methods are called from the bench's event loop thread."""

    def on_start(self, total: int) -> None:
        """The measured requests are about to be sent (warm-up is over). ``total`` = num_prompts."""

    def on_request_done(self, output: RequestOutput) -> None:
        """One measured request finished (succeeded or failed; cancelled ones are not reported)."""

    def on_complete(self, result: BenchResult) -> None:
        """The run is over and ``result`` is final."""


class NullProgress:
    """Reports nothing."""

    def on_start(self, total: int) -> None:
        pass

    def on_request_done(self, output: RequestOutput) -> None:
        pass

    def on_complete(self, result: BenchResult) -> None:
        pass


class SafeProgress:
    """Wraps a progress sink so an exception in it is logged once per method, never raised."""

    def __init__(self, inner: BenchProgress | None) -> None:
        self._inner = inner or NullProgress()
        self._warned: set[str] = set()

    def _call(self, method: str, *args: Any) -> None:
        try:
            getattr(self._inner, method)(*args)
        except Exception:  # noqa: BLE001 - a display must never fail a measurement
            if method not in self._warned:
                self._warned.add(method)
                logger.exception("progress display %s.%s failed; continuing without it", type(self._inner).__name__, method)

    def on_start(self, total: int) -> None:
        self._call("on_start", total)

    def on_request_done(self, output: RequestOutput) -> None:
        self._call("on_request_done", output)

    def on_complete(self, result: BenchResult) -> None:
        self._call("on_complete", result)
