"""The checkpoint builder's error (under the project's one root)."""
from __future__ import annotations

from orchestrator.errors import OrchestratorError

__all__ = ["CheckpointError"]


class CheckpointError(OrchestratorError, ValueError):
    """A checkpoint shape or input is invalid; the message names the field and what is allowed."""
