"""One root error per package; messages say what to do about the failure."""
from __future__ import annotations


class OrchestratorError(Exception):
    """Root of every error raised by :mod:`orchestrator`."""


class ConfigError(OrchestratorError, ValueError):
    """An engine config, routing table or request field is invalid.

    The message names the field and the allowed values.
    """


class PreflightError(OrchestratorError):
    """A node cannot run the requested engine (missing MTP weights, FA3, wrong LMDeploy version)."""


class EngineError(OrchestratorError):
    """An engine process failed. Carries the exit code and the last lines of its log."""

    def __init__(self, message: str, *, exit_code: int | None = None, log_tail: str = "") -> None:
        self.exit_code = exit_code
        self.log_tail = log_tail
        full = message
        if exit_code is not None:
            full += f" (exit code {exit_code})"
        if log_tail:
            full += "\n--- last lines of the engine log ---\n" + log_tail
        super().__init__(full)


class EngineDiedError(EngineError):
    """The engine process exited (crashed, was killed, or ran out of memory)."""


class EngineNotReadyError(EngineError):
    """The engine process is alive but did not answer ``/v1/models`` within the timeout (a hang)."""
