"""One drive: the :class:`~tuning.drive.scheduler.Dispatcher` decides, this loop carries its decisions
out against a backend, on the profile's clock (wall seconds times the simulator's time scale), and
turns outcomes into :class:`~tuning.drive.records.DriveRecord`.

Progress goes to a callback (``on_phase(index, label, in_flight, started, finished)`` at each phase
start and at the end of the profile); an error in it is logged, never raised.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from orchestrator.fsutil import utc_now_iso
from orchestrator.hostinfo import package_versions
from tuning.drive.backend import OpenAIBackend, Outcome, lateness_between
from tuning.drive.records import DriveRecord, DriveResult
from tuning.drive.scheduler import Dispatcher, Launch
from tuning.drive.workload import RequestDraw
from tuning.traffic import LoadProfile, TrafficMix
from tuning.workload import TokenCounter, resolve_token_counter

__all__ = ["TICK_WALL_S", "drive", "run_drive"]

logger = logging.getLogger(__name__)

TICK_WALL_S = 0.02
"""Wall seconds between checks of the profile's target while no request finishes (ramps move it)."""

PhaseCallback = Callable[[int, str, int, int, int], None]


def _safe(cb: PhaseCallback | None) -> PhaseCallback:
    def call(*args: Any) -> None:
        if cb is None:
            return
        try:
            cb(*args)
        except Exception:  # noqa: BLE001 - a display must never fail a measurement
            logger.exception("drive progress callback failed; continuing")
    return call


async def drive(backend: OpenAIBackend, mix: TrafficMix, profile: LoadProfile, *, seed: int = 0,
                input_len: int = 1024, range_ratio: float = 0.5, tokenizer: Any = None,
                drain_s: float = 600.0, on_phase: PhaseCallback | None = None) -> DriveResult:
    """Drive ``backend`` (entered) with ``mix`` under ``profile``. ``drain_s``: profile seconds after
    the profile's end that requests still running may take to finish; then they are cancelled and
    recorded as ``cancelled``."""
    assert backend.info is not None, "enter the backend first ('async with')"
    scale = backend.info.time_scale if backend.info.simulated else 1.0
    counter: TokenCounter = resolve_token_counter(tokenizer)
    draw = RequestDraw(mix, seed=seed, input_len=input_len, range_ratio=range_ratio)
    dispatcher = Dispatcher(profile, draw.next)
    progress = _safe(on_phase)
    records: list[DriveRecord] = []
    before = await backend.sim_counters() if backend.info.simulated else {}
    started_iso = utc_now_iso()
    t0 = time.monotonic()

    def clock(wall: float | None = None) -> float:
        return ((time.monotonic() if wall is None else wall) - t0) * scale

    async def one(launch: Launch) -> tuple[Launch, Outcome]:
        req = launch.request
        prompt = counter.sample_text(req.prompt_len, random.Random(req.seed))
        try:
            return launch, await backend.send(req, prompt)
        except asyncio.CancelledError:
            now = time.monotonic()
            return launch, Outcome(now, None, now, 0, False, "cancelled", "still running when the drain ended")

    def record(launch: Launch, out: Outcome) -> DriveRecord:
        req = launch.request
        start = clock(out.started) if out.error_kind != "cancelled" else launch.at
        if out.sim_ttft is not None and out.sim_e2e is not None:  # the engine's stamps, from its arrival
            first, end = start + out.sim_ttft, start + out.sim_e2e
        else:
            first = None if out.first_token is None else clock(out.first_token)
            end = clock(out.finished)
        return DriveRecord(
            index=req.index, phase=launch.phase, class_index=req.class_index, max_tokens=req.max_tokens,
            temperature=req.temperature, prompt_len=req.prompt_len, started_at=round(start, 6),
            first_token_at=None if first is None else round(first, 6), finished_at=round(end, 6),
            output_tokens=out.output_tokens, ok=out.ok, error_kind=out.error_kind, error=out.error, route=out.route,
            timed_by="engine stamps" if out.sim_ttft is not None else "arrival")

    tasks: set[asyncio.Task[tuple[Launch, Outcome]]] = set()
    phase = -1
    end = profile.seconds
    try:
        while True:
            now = clock()
            if now < end and profile.phase_at(now) != phase:
                phase = profile.phase_at(now)
                progress(phase, profile.label(phase), dispatcher.in_flight, dispatcher.started, len(records))
            for launch in dispatcher.tick(now):
                tasks.add(asyncio.create_task(one(launch)))
            if dispatcher.done(now):
                break
            if phase != len(profile.phases) and now >= end:
                phase = len(profile.phases)
                progress(phase, "drain", dispatcher.in_flight, dispatcher.started, len(records))
            if now >= end + drain_s:
                for t in tasks:
                    t.cancel()
            done, tasks = await asyncio.wait(tasks, timeout=TICK_WALL_S, return_when=asyncio.FIRST_COMPLETED) \
                if tasks else (set(), tasks)
            if not done and not tasks:
                await asyncio.sleep(TICK_WALL_S)
            for t in done:
                launch, out = t.result()
                dispatcher.finished(launch.request.index)
                records.append(record(launch, out))
    finally:
        for t in tasks:
            t.cancel()
    after = await backend.sim_counters() if backend.info.simulated else {}
    return DriveResult(
        base_url=backend.base_url, model=backend.model, simulated=backend.info.simulated, time_scale=scale,
        mix=mix.model_dump(mode="json"), profile=profile.model_dump(mode="json"), seed=seed, input_len=input_len,
        started_at=started_iso, finished_at=utc_now_iso(), drain_s=drain_s,
        records=tuple(sorted(records, key=lambda r: r.index)), lateness=lateness_between(before, after),
        versions=package_versions(("mtp-autotune", "ray", "aiohttp", "lmdeploy")))


def run_drive(base_url: str, mix: TrafficMix, profile: LoadProfile, *, api_key: str | None = None,
              model: str | None = None, **kwargs: Any) -> DriveResult:
    """:func:`drive` from synchronous code: enters an :class:`OpenAIBackend` for ``base_url``."""

    async def main() -> DriveResult:
        async with OpenAIBackend(base_url, api_key=api_key, model=model) as backend:
            return await drive(backend, mix, profile, **kwargs)

    return asyncio.run(main())
