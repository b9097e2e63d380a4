"""The bench's errors: the run could not happen at all (single request failures are data)."""
from __future__ import annotations

from orchestrator.errors import OrchestratorError

__all__ = ["BenchError", "ServerUnreachableError"]


class BenchError(OrchestratorError):
    """The benchmark could not run at all (as opposed to single requests failing, which is data)."""


class ServerUnreachableError(BenchError):
    """``GET /v1/models`` did not answer: no server at that URL, or not OpenAI-compatible."""
