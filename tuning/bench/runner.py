"""One benchmark run: warm-up, the occupancy probe, every measured request at most ``concurrency``
in flight, the steady-state early stop, and the result (:func:`run_benchmark`, :func:`benchmark`)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from orchestrator.fsutil import utc_now_iso
from tuning.bench.client import (
    PROBE_TIMEOUT_S,
    _Hooks,
    probe_server,
    _RequestState,
    _scrape_spec_counters,
    _send,
)
from tuning.bench.counters import SPEC_COUNTER_NAMES
from tuning.bench.drain import _StreamStats, fit_occupancy_curve, fit_step_model, full_run_throughput_bounds, occupancy_probe_lengths
from tuning.bench.progress import BenchProgress, SafeProgress
from tuning.bench.records import BenchResult, RequestOutput, SimClock
from tuning.bench.steady import SteadyStateEstimate, SteadyStateRule, _SteadyStateTracker
from tuning.bench.summary import _summarize
from tuning.workload import RequestSpec, TokenCounter, Workload, build_requests, resolve_token_counter

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__ = ["DELIVERY_MARGIN_S", "WARMUP_MAX_OUTPUT_TOKENS", "benchmark", "run_benchmark"]

logger = logging.getLogger(__name__)

WARMUP_MAX_OUTPUT_TOKENS = 32
"""Warm-up requests ask for at most this many tokens: they warm the server, they measure nothing."""

DELIVERY_MARGIN_S = 0.045
"""Wall seconds, beyond the simulator's delivery quantum (:attr:`SimClock.delivery_quantum_s`), by
which a stamped token may arrive after its time on a loaded machine."""


class _RunHooks(_Hooks):
    """Saturation bookkeeping for the steady-state rule.

    Steady state starts after one full turnover: once the first ``concurrency`` requests have
    *finished* while requests are still waiting for a slot. Before that every running sequence is at
    the same early stage (short contexts, cheap decode steps), so throughput is transiently high;
    for 16k-token outputs the first wave alone would overstate it by ~10%. It ends when a request
    finishes and nothing is left to take its slot (the drain at the end of a run).
    """

    def __init__(self, total: int, concurrency: int | None, tracker: _SteadyStateTracker | None) -> None:
        self.total = total
        self.concurrency = concurrency
        self.tracker = tracker
        self.started = 0
        self.finished = 0
        self.latest = -math.inf  # newest token time seen
        self.stats: _StreamStats | None = None
        self.seen_token = False

    def on_slot(self, state: _RequestState) -> None:
        self.started += 1

    def on_tokens(self, t: float, n: float) -> None:
        self.latest = max(self.latest, t)
        if self.tracker is not None:
            self.tracker.add_tokens(t, n)

    def on_first_token(self, state: _RequestState, t: float) -> None:
        if self.tracker is not None and not self.seen_token and state.started_at is not None:
            self.tracker.t0 = state.started_at  # the token clock's run start (SimClock may lag the wall)
        self.seen_token = True
        if self.stats is not None:
            self.stats.on_first_token(state.spec.prompt_len, t)

    def on_chunk(self, state: _RequestState, t: float, n: float, gap: float | None) -> None:
        if self.stats is not None:
            self.stats.on_chunk(state.tokens, t, n, gap)

    def on_finish(self, state: _RequestState, t: float) -> None:
        self.finished += 1
        if self.stats is not None and state.ttft is not None:
            self.stats.on_finish(state.spec.prompt_len + state.tokens)
        if self.tracker is None or self.concurrency is None:
            return
        if self.finished == self.concurrency and self.started < self.total:
            self.tracker.start(t)
        if self.started >= self.total:
            self.tracker.end(t)


class _ProbeHooks(_Hooks):
    """Records every chunk of the occupancy probe's requests."""

    def __init__(self) -> None:
        self.events: dict[int, list[tuple[float, float]]] = {}

    def on_chunk(self, state: _RequestState, t: float, n: float, gap: float | None) -> None:
        self.events.setdefault(state.index, []).append((t, n))


async def _probe_occupancy(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    specs: list[RequestSpec],
    counter: TokenCounter,
    timeout: aiohttp.ClientTimeout,
    clock: SimClock | None,
    concurrency: int,
) -> tuple[list[float], list[float], list[float]] | None:
    """Measure step time against running sequences before the measured run (not counted): send
    ``concurrency`` requests of :func:`occupancy_probe_lengths` at once and fit
    :func:`fit_occupancy_curve` on their chunks."""
    lengths = occupancy_probe_lengths(concurrency, max(s.output_len for s in specs))
    hooks = _ProbeHooks()
    states = [_RequestState(-1000 - j, specs[j % len(specs)]) for j in range(len(lengths))]
    outs = await asyncio.gather(*(
        _send(session, url, w, model, st, counter, hooks, timeout, n, clock) for st, n in zip(states, lengths)
    ))
    if any(not o.success for o in outs):
        logger.warning("occupancy probe: %d of %d requests failed; early stop will use model-free bounds",
                       sum(not o.success for o in outs), len(outs))
        return None
    streams = [(float(st.spec.prompt_len), hooks.events.get(st.index, [])) for st in states]
    return fit_occupancy_curve(streams, concurrency)


async def run_benchmark(
    base_url: str,
    workload: Workload,
    *,
    model: str | None = None,
    tokenizer: Any = None,
    engine_config: EngineConfig | None = None,
    steady_state: SteadyStateRule | None = None,
    progress: BenchProgress | None = None,
    request_timeout_s: float = 3600,
    api_key: str | None = None,
    num_draft_tokens: int | None = None,
) -> BenchResult:
    """Run ``workload`` against the server at ``base_url`` and measure it.

    Args:
        base_url: ``http://host:port`` of an OpenAI-compatible server.
        workload: what to send.
        model: model name in requests; ``None`` = the first model ``/v1/models`` lists.
        tokenizer: token counter for prompts and outputs without usage (see :func:`build_requests`).
        engine_config: the config the server runs (recorded; gives ``N`` for the accept length).
        steady_state: stop early once steady-state output throughput is known (module docstring).
        progress: event sink (e.g. :class:`~tuning.bench.display.RichProgress`); its errors are logged.
        request_timeout_s: per-request wall-clock limit; a request over it fails as ``timeout``.
        api_key: sent as ``Authorization: Bearer``.
        num_draft_tokens: ``N`` for the accept length when no ``engine_config`` is given.

    Raises:
        ServerUnreachableError: ``GET /v1/models`` failed. Single request failures never raise.
    """
    base_url = base_url.rstrip("/")
    sink = SafeProgress(progress)
    counter = resolve_token_counter(tokenizer)
    concurrency = workload.max_concurrency
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=(concurrency or workload.num_prompts) + 8, limit_per_host=0)
    session = aiohttp.ClientSession(
        connector=connector,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=None),
        read_bufsize=10 * 1024**2,  # long SSE lines under load (sglang does the same)
    )
    try:
        info = await probe_server(session, base_url)
        model_name = model or info.model
        specs = build_requests(workload, counter)
        url = f"{base_url}/v1/chat/completions" if workload.api == "chat" else f"{base_url}/v1/completions"
        req_timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=min(30.0, request_timeout_s))
        if engine_config is not None and engine_config.speculative:
            n_draft: int | None = engine_config.num_draft_tokens
        else:
            n_draft = num_draft_tokens

        if workload.warmup_requests:
            await _warm_up(session, url, workload, model_name, specs, counter, req_timeout)
        occupancy = None
        # The probe only matters where the rule can stop: with at most two turnovers of prompts the
        # queue is empty by the time the first turnover is done, so there is no steady state.
        if steady_state is not None and concurrency and len(specs) > 2 * concurrency:
            occupancy = await _probe_occupancy(session, url, workload, model_name, specs, counter, req_timeout,
                                               info.sim_clock, concurrency)

        before = await _scrape_spec_counters(session, base_url)
        started_iso = utc_now_iso()
        sink.on_start(len(specs))
        t0 = time.monotonic()
        tracker = _SteadyStateTracker(steady_state, info.time_scale, t0) if steady_state is not None else None
        outputs, t_end, early = await _dispatch_all(
            session, url, workload, model_name, specs, counter, req_timeout, sink, tracker, concurrency,
            info.sim_clock, occupancy,
        )
        if info.sim_clock is not None:
            # On the simulator's timeline: the run began when its first request arrived there and
            # ended when it produced its last token (not when that was delivered).
            t0 = min([o.started_at for o in outputs if o.ttft is not None], default=t0)
            stamps = [o.last_token_at for o in outputs if o.last_token_at is not None]
            t_end = max(stamps, default=t_end)
        after = await _scrape_spec_counters(session, base_url, min(PROBE_TIMEOUT_S, request_timeout_s))
        finished_iso = utc_now_iso()
    finally:
        await session.close()

    delta: dict[str, float] = {}
    if before is not None and after is not None:
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTER_NAMES if k in after}
    estimate: SteadyStateEstimate | None = None
    if tracker is not None:
        estimate = tracker.stopped_with if early and tracker.stopped_with is not None else tracker.estimate(t_end)
    result = _summarize(
        outputs=outputs,
        workload=workload,
        duration_wall_s=t_end - t0,
        info=info,
        engine_config=engine_config,
        spec_delta=delta,
        n_draft=n_draft,
        early=early,
        estimate=estimate,
        started_iso=started_iso,
        finished_iso=finished_iso,
    )
    sink.on_complete(result)
    return result


async def _warm_up(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    specs: list[RequestSpec],
    counter: TokenCounter,
    timeout: aiohttp.ClientTimeout,
) -> None:
    sem = asyncio.Semaphore(w.max_concurrency or w.warmup_requests)

    async def one(i: int) -> RequestOutput:
        spec = specs[i % len(specs)]
        async with sem:
            return await _send(
                session, url, w, model, _RequestState(-1 - i, spec), counter, _Hooks(), timeout,
                min(spec.output_len, WARMUP_MAX_OUTPUT_TOKENS),
            )

    results = await asyncio.gather(*(one(i) for i in range(w.warmup_requests)))
    bad = [r for r in results if not r.success]
    if bad:
        logger.warning("%d of %d warm-up requests failed (first: %s %s)", len(bad), len(results), bad[0].error_kind, bad[0].error[:200])


async def _dispatch_all(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    specs: list[RequestSpec],
    counter: TokenCounter,
    timeout: aiohttp.ClientTimeout,
    sink: SafeProgress,
    tracker: _SteadyStateTracker | None,
    concurrency: int | None,
    clock: SimClock | None = None,
    occupancy: tuple[list[float], list[float], list[float]] | None = None,
) -> tuple[list[RequestOutput], float, bool]:
    """Send every request (Poisson arrivals or all at once, at most ``concurrency`` in flight);
    return the outputs in request order, the end time, and whether the steady-state rule stopped it."""
    total = len(specs)
    hooks = _RunHooks(total, concurrency, tracker)
    if tracker is not None:
        hooks.stats = _StreamStats(None, tracker.window_wall_s / 2,
                                   max(s.output_len for s in specs) / 32 if specs else 1.0)
    sem = asyncio.Semaphore(concurrency) if concurrency is not None else None
    states = [_RequestState(i, s) for i, s in enumerate(specs)]
    outputs: list[RequestOutput | None] = [None] * total
    all_done = asyncio.Event()
    stop = asyncio.Event()
    finished = 0

    async def one(state: _RequestState) -> None:
        async def go() -> None:
            nonlocal finished
            hooks.on_slot(state)
            # Closed loop on the simulator: a finish is followed by a new request while any is queued.
            closed_loop = clock is not None and sem is not None and math.isinf(w.request_rate)
            queued = total - hooks.started if closed_loop else None
            # The first request of the closed loop announces the rest of the opening burst.
            burst = min(concurrency or total, total) - 1 if closed_loop and hooks.started == 1 else None
            out = await _send(session, url, w, model, state, counter, hooks, timeout, state.spec.output_len, clock, queued,
                              burst)
            state.done = True
            outputs[state.index] = out
            # On the token clock (the simulator's stamps, SimClock), like the tokens the windows count:
            # wall time runs ahead of the stamps whenever the simulator falls behind or holds its clock.
            hooks.on_finish(state, state.last_at if state.last_at is not None else time.monotonic())
            finished += 1
            sink.on_request_done(out)
            if finished == total:
                all_done.set()

        if sem is None:
            await go()
        else:
            async with sem:
                await go()

    tasks: list[asyncio.Task[None]] = []
    arrival_rng = np.random.RandomState(w.seed)

    async def dispatch() -> None:
        for st in states:
            tasks.append(asyncio.create_task(one(st)))
            if not math.isinf(w.request_rate):
                await asyncio.sleep(float(arrival_rng.exponential(1.0 / w.request_rate)))

    async def monitor() -> None:
        assert tracker is not None
        while True:
            await asyncio.sleep(tracker.window_wall_s)
            # Stamped tokens are delivered up to a few ms after their time, on the simulator's clock
            # (which stands still during closed-loop holds): judge only windows that closed at
            # least one delivery quantum and DELIVERY_MARGIN_S before the newest stamp seen.
            now = (hooks.latest - clock.delivery_quantum_s - DELIVERY_MARGIN_S) if clock is not None else time.monotonic()
            est = tracker.converged(now)
            if est is not None:
                est = _with_full_run_bounds(est, states, now, tracker, concurrency, hooks.stats, occupancy)
                if est is not None:
                    tracker.stopped_with = est  # the estimate the decision was made on is the one reported
                    stop.set()
                    return
            if tracker.end_at is not None:
                return  # saturation is over without convergence: the run completes in full

    dispatcher = asyncio.create_task(dispatch())
    watchers = [asyncio.create_task(all_done.wait()), asyncio.create_task(stop.wait())]
    mon = asyncio.create_task(monitor()) if tracker is not None else None
    try:
        await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
    finally:
        early = stop.is_set() and not all_done.is_set()
        t_end = time.monotonic()
        for t in [dispatcher, *watchers, *([mon] if mon else []), *tasks]:
            if not t.done():
                t.cancel()
        await asyncio.gather(dispatcher, *watchers, *([mon] if mon else []), *tasks, return_exceptions=True)

    final: list[RequestOutput] = []
    for st, out in zip(states, outputs):
        if out is None:  # cancelled by the early stop (or never dispatched)
            out = st.freeze(success=False, kind="cancelled", error="stopped early: steady state reached", counter=counter, now=t_end)
        final.append(out)
    return final, t_end, early


def _with_full_run_bounds(
    est: SteadyStateEstimate,
    states: Sequence[_RequestState],
    now: float,
    tracker: _SteadyStateTracker,
    concurrency: int | None,
    stats: _StreamStats | None = None,
    occupancy: tuple[list[float], list[float], list[float]] | None = None,
) -> SteadyStateEstimate | None:
    """``est`` with the full-run bounds, or ``None`` while the drain's share is still too uncertain."""
    started = [st for st in states if st.ttft is not None and st.started_at is not None]
    if not concurrency or not started:
        return None
    scale = tracker.time_scale
    model = None
    if stats is not None and occupancy is not None:
        model = fit_step_model(stats.windows(now, concurrency), occupancy, stats.positions(), concurrency)
    flight = [st for st in states if st.started_at is not None and not st.done]
    queued = [st for st in states if st.started_at is None]
    low, high = full_run_throughput_bounds(
        now=now,
        t0=min(st.started_at for st in started),  # type: ignore[type-var]
        in_flight_remaining=[max(0.0, st.spec.output_len - st.tokens) for st in flight],
        queued_lengths=[float(st.spec.output_len) for st in queued],
        total_tokens=float(sum(st.spec.output_len for st in states)),
        concurrency=concurrency,
        steady_throughput=est.throughput * scale,  # tokens per local second
        startup_s=float(statistics.median(st.ttft for st in started)),  # type: ignore[type-var]
        step_model=model,
        in_flight_positions=[st.tokens for st in flight],
        in_flight_prompts=[float(st.spec.prompt_len) for st in flight],
        queued_prompts=[float(st.spec.prompt_len) for st in queued],
        z=statistics.NormalDist().inv_cdf(0.5 + tracker.rule.confidence / 2),
    )
    low, high = low / scale, high / scale  # tokens per server second
    if high <= 0 or (high - low) / (high + low) > tracker.rule.drain_tolerance:
        return None
    return dataclasses.replace(est, full_run_low=low, full_run_high=high,
                               drain_model=model.to_dict() if model is not None else None)


def benchmark(base_url: str, workload: Workload, **kwargs: Any) -> BenchResult:
    """Synchronous :func:`run_benchmark` (``asyncio.run``); same arguments."""
    return asyncio.run(run_benchmark(base_url, workload, **kwargs))
