"""Engines and serving: engine configs and processes, the simulated engine, the Ray Serve app."""
from __future__ import annotations

from orchestrator.config import Backend, EngineConfig, SpeculativeAlgorithm
from orchestrator.errors import (
    ConfigError,
    EngineDiedError,
    EngineError,
    EngineNotReadyError,
    OrchestratorError,
    PreflightError,
)

__all__ = [
    "Backend",
    "ConfigError",
    "EngineConfig",
    "EngineDiedError",
    "EngineError",
    "EngineNotReadyError",
    "OrchestratorError",
    "PreflightError",
    "SpeculativeAlgorithm",
]
