"""Which requests to start when, so that the requests in flight follow a :class:`LoadProfile`
(steady phases, ramps, bursts). Pure: the runner feeds it the clock and the finishes, and carries
out its decisions (GuideLLM's split of scheduler and backend).

Why closed-loop by concurrency: a load profile says how many requests users keep in flight; when one
finishes, its user sends the next. A level that falls (the end of a burst) is reached by not
replacing finished requests: nothing is cancelled, as no user cancels a request because others left.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuning.drive.workload import DrawnRequest
from tuning.traffic import LoadProfile

__all__ = ["Dispatcher", "Launch"]


@dataclass(frozen=True)
class Launch:
    """Start ``request`` now; it belongs to phase ``phase`` (the phase in which it started)."""

    request: DrawnRequest
    phase: int
    at: float


class Dispatcher:
    """Keeps ``profile.concurrency_at(t)`` requests in flight until the profile ends.

    ``tick(t)`` returns the requests to start at ``t`` (profile seconds since the start); ``finished``
    is told each one that ended. After ``profile.seconds`` nothing more starts (the drain)."""

    def __init__(self, profile: LoadProfile, draw: Callable[[], DrawnRequest]) -> None:
        self.profile = profile
        self._draw = draw
        self._in_flight: set[int] = set()
        self.started = 0

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def target(self, t: float) -> int:
        """Requests that should be in flight at ``t`` (0 once the profile is over)."""
        return 0 if t >= self.profile.seconds else self.profile.concurrency_at(t)

    def done(self, t: float) -> bool:
        """The profile is over and every request has finished."""
        return t >= self.profile.seconds and not self._in_flight

    def tick(self, t: float) -> list[Launch]:
        if t < 0:
            raise ValueError(f"t={t}: the drive's clock starts at 0")
        out = []
        phase = self.profile.phase_at(t)
        for _ in range(max(0, self.target(t) - len(self._in_flight))):
            req = self._draw()
            self._in_flight.add(req.index)
            self.started += 1
            out.append(Launch(request=req, phase=phase, at=t))
        return out

    def finished(self, index: int) -> None:
        try:
            self._in_flight.remove(index)
        except KeyError:
            raise ValueError(f"request {index} is not in flight") from None
