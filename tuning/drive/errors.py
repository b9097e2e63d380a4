"""The driver's errors: the drive could not run at all (one request failing is data, never raised)."""
from __future__ import annotations

from orchestrator.errors import OrchestratorError

__all__ = ["DriveError"]


class DriveError(OrchestratorError):
    """A mixed-workload drive could not run (bad arguments, no server); the message says what to do."""
