"""Engine families behind one small interface (:class:`EngineBackend`), registered by name.

Every module of this package is imported here, so a backend registers itself by being a file in it:
adding an engine is one module plus its test. :func:`get_backend` finds one by name; an unknown name is
an error listing the known ones.
"""
from __future__ import annotations

import importlib
import pkgutil

from orchestrator.backends.base import (
    EngineBackend,
    MetricNames,
    get_backend,
    known_backends,
)

__all__ = ["EngineBackend", "MetricNames", "get_backend", "known_backends", "spec_counter_names"]


def _register_modules() -> None:
    """Import every module of this package: each registers the backends it defines."""
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base" and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_register_modules()


def spec_counter_names() -> dict[str, str]:
    """Every registered engine's spec-decode counter sample name -> our counter name: a reader of a
    metrics page that need not know which engine wrote it (an engine exposes its own names only)."""
    out: dict[str, str] = {}
    for name in known_backends(simulatable=True):
        for ours, sample in get_backend(name).metrics.spec_counters().items():
            out[sample] = ours
    return out
