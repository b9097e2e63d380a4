"""Typed records of a mixed-workload drive: one per request, and the whole drive with what was
learned about the server. Pure data; JSON through :meth:`DriveResult.to_dict` / ``from_dict``.

Times are seconds since the drive started, on the profile's clock: simulated seconds when the server
is simulated (wall seconds times its time scale), wall seconds otherwise.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DriveRecord", "DriveResult", "EngineLateness"]


@dataclass(frozen=True)
class DriveRecord:
    """What happened to one request.

    Attributes:
        index: position in the drive's request sequence (:class:`tuning.drive.workload.RequestDraw`).
        phase: index of the load phase in which it started.
        class_index: its class in the traffic mix; ``max_tokens`` and ``temperature`` as sent.
        started_at / first_token_at / finished_at: profile seconds (``first_token_at`` ``None`` when no
            text came).
        output_tokens: tokens received (the server's usage count; partial for failures).
        ok: the stream completed with ``[DONE]``.
        error_kind / error: ``None`` / ``""`` on success, else e.g. ``HTTP 503``, ``timeout``,
            ``connection``, ``cancelled`` (still running when the drain's limit came).
        route: the router's ``x-route-deployment`` / ``x-route-cell`` headers, when it sent them.
        timed_by: ``engine stamps`` (a simulated engine's token stamps: first token and end are the send
            time plus the engine's simulated durations from its arrival) or ``arrival`` (client clock).
    """

    index: int
    phase: int
    class_index: int
    max_tokens: int
    temperature: float
    prompt_len: int
    started_at: float
    first_token_at: float | None
    finished_at: float
    output_tokens: int
    ok: bool
    error_kind: str | None = None
    error: str = ""
    route: str | None = None
    timed_by: str = "arrival"

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started_at

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (``None`` with fewer than two tokens)."""
        if self.first_token_at is None or self.output_tokens < 2:
            return None
        return (self.finished_at - self.first_token_at) / (self.output_tokens - 1)


@dataclass(frozen=True)
class EngineLateness:
    """How far one simulated engine's loop fell behind its schedule during the drive (the simulator's
    ``/sim/info`` counters, after minus before): ``late_steps`` of ``steps`` iterations ended after
    their deadline, by ``lateness_s`` simulated seconds in sum."""

    engine: str
    steps: int
    late_steps: int
    lateness_s: float

    @property
    def mean_lag_s(self) -> float:
        """Simulated seconds behind, averaged over all its steps."""
        return self.lateness_s / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class DriveResult:
    """A whole drive: the requests, the workload that made them and the server it ran against."""

    base_url: str
    model: str
    simulated: bool
    time_scale: float
    mix: dict
    profile: dict
    seed: int
    input_len: int
    started_at: str
    finished_at: str
    drain_s: float
    records: tuple[DriveRecord, ...]
    lateness: tuple[EngineLateness, ...] = ()
    versions: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DriveResult:
        kw = dict(data)
        kw["records"] = tuple(DriveRecord(**r) for r in data["records"])
        kw["lateness"] = tuple(EngineLateness(**e) for e in data.get("lateness", ()))
        return cls(**kw)
