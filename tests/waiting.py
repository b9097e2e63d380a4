"""Polling for a condition in tests that drive real clusters and services: the value once ``check``
returns something truthy, or an AssertionError naming what was awaited after ``timeout_s``."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], *, timeout_s: float, period_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(period_s)
