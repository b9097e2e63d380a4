"""OpenAI-compatible HTTP front of the simulated engine (aiohttp), driving the shared scheduler.

The engine loop runs :class:`~orchestrator.sim.scheduler.Scheduler` against a *scaled wall clock*:
simulated time is ``(monotonic() - start) * time_scale``; each iteration's end is slept to at its
absolute deadline, so event-loop overhead is absorbed until it exceeds the iteration's wall budget
(see the README for the measured limit). Tokens of one iteration go out as one SSE event per sequence,
so under MTP an event carries ``1 + accepted`` tokens, as with real speculative engines. The text of
a completion is drawn when the request arrives (:mod:`.textmodel`: from its prompt, temperature and
seed only), so speculation and event boundaries change when tokens come, never which.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from orchestrator.backends import get_backend
from orchestrator.errors import OrchestratorError
from orchestrator.ports import host_boot_id
from orchestrator.sim import textmodel, tokenizer
from orchestrator.sim.gpu_share import SharedGpu
from orchestrator.sim.model import EngineParams, PerformanceModel, Profile
from orchestrator.sim.noise import EngineNoise
from orchestrator.sim.scheduler import Scheduler, SimRequest, make_request

__all__ = ["SimEngine", "build_app", "delivery_quantum_s", "OpenAIError"]

log = logging.getLogger("orchestrator.sim")
SIM_HEADER = "x-simulated-engine"


class OpenAIError(OrchestratorError):
    """A request error rendered as OpenAI's ``{"error": {...}}`` JSON with an HTTP status."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.type, self.code = status, param, type_, code

    def response(self) -> web.Response:
        body = {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


HOLD_MAX_S = 1.0
"""Longest wall time the clock waits for a closed-loop client's next request (see ``SimEngine._hold``)."""

CLIENT_LATE_FORGET_S = 10.0
"""Wall seconds after which a closed-loop client's overdue request is taken as never coming (the client
stopped early or went away) instead of late (see ``SimEngine.client_lateness_s``)."""

RUN_AHEAD_S = 0.005
"""Wall seconds the engine loop computes ahead of the clock before it sleeps (see ``SimEngine._run``).
A request that arrives meanwhile joins after those iterations, as it would join a real engine at its
next iteration; more would delay it by up to this times the time scale in simulated time."""

DELIVERY_QUANTUM_S = 0.005
"""Wall seconds between token deliveries at time scale 1 (see ``SimEngine._run``); faster clocks
deliver proportionally less often, up to :data:`DELIVERY_QUANTUM_MAX_S`."""

DELIVERY_QUANTUM_MAX_S = 0.05
"""Longest wall time between deliveries. Each delivery costs one write per running sequence on the
server and one parse on the client, which is most of a sweep's CPU on a small host; clients that
read the stamps lose nothing by the wait, and :meth:`SimEngine.info` reports the quantum so they know
how late a token may arrive."""


def delivery_quantum_s(time_scale: float) -> float:
    """Wall seconds between token deliveries at ``time_scale``: :data:`DELIVERY_QUANTUM_S` of
    simulated-time resolution at scale 1 for clients that time tokens by arrival, up to
    :data:`DELIVERY_QUANTUM_MAX_S` at high scales, where only the stamps are exact anyway."""
    return min(DELIVERY_QUANTUM_MAX_S, DELIVERY_QUANTUM_S * max(1.0, float(time_scale)))


class SimEngine:
    """Owns the scheduler, the scaled clock, the engine loop and the counters /metrics reports."""

    def __init__(self, profile: Profile, params: EngineParams, *, time_scale: float = 1.0, seed: int = 0,
                 model_name: str | None = None, noise: EngineNoise | None = None,
                 shared_gpu: SharedGpu | None = None) -> None:
        self.profile = profile
        self.params = params
        self.model = PerformanceModel(profile, params)  # raises SimOutOfMemory
        self.noise = noise if noise is not None and noise.active else None
        self.shared_gpu = shared_gpu  # engines on the same GPU slow each other (time-slicing)
        self.scheduler = Scheduler(self.model, slowdown=self._slowdown())
        self.time_scale = float(time_scale)
        self.delivery_quantum_s = delivery_quantum_s(self.time_scale)
        self.seed = seed
        self.model_name = model_name or profile.name
        self._wall0 = time.monotonic()
        self._held_total = 0.0  # wall seconds the clock stood still (closed-loop holds)
        self._hold_started: float | None = None
        self._hold_owed = 0
        self._hold_timer: asyncio.TimerHandle | None = None
        self._resume = asyncio.Event()
        self._client_queued: int | None = None  # requests queued at the closed-loop client (sim_queued)
        self._overdue: deque[float] = deque()  # wall time each request owed by an expired hold became overdue
        self.epoch0 = time.time()  # simulated timestamps are epoch0 + simulated seconds
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._cursor: float | None = None  # simulated end of the last iteration while the loop is busy
        self._request_counter = 0
        self.hung = False
        self.first_request = asyncio.Event()  # timed faults count from here (not from start-up)
        self.counters = dict(drafts=0, draft_tokens=0, accepted=0, generation_tokens=0, prompt_tokens=0,
                             requests=0, steps=0, late_steps=0)
        self.lateness_s = 0.0  # simulated seconds the loop fell behind its deadlines (overhead distortion)
        # Simulated seconds closed-loop clients left a slot empty past HOLD_MAX_S, summed over their late
        # requests: a client starved of CPU is a distortion the engine's own lateness does not show.
        self.client_lateness_s = 0.0

    def _slowdown(self) -> Callable[[float], float] | None:
        """The factor on each iteration's time: the run-to-run noise's, times the number of engines busy on
        a shared GPU (:class:`~orchestrator.sim.gpu_share.SharedGpu`); ``None`` when neither applies."""
        noise = self.noise.slowdown() if self.noise else None
        share = self.shared_gpu
        if share is None:
            return noise
        return lambda now: share.factor() * (noise(now) if noise is not None else 1.0)

    # ----- clock -------------------------------------------------------------------------------
    def now(self) -> float:
        """Simulated seconds since the engine started (frozen while a closed-loop hold is on)."""
        wall = (self._hold_started if self._hold_started is not None else time.monotonic())
        return (wall - self._wall0 - self._held_total) * self.time_scale

    # ----- closed-loop holds ---------------------------------------------------------------------
    # A benchmark client in a closed loop sends the next request when one finishes. Its turnaround
    # (a few wall ms, far more on a loaded machine) would become ``time_scale`` times as much idle
    # simulated time, which no real engine sees (a real client's ms are negligible at scale 1). So a
    # request may say ``"sim_hold": true`` ("a new request follows when this one finishes"); when
    # such requests finish, the clock stops until as many new requests arrived or HOLD_MAX_S (wall)
    # passed, and the new requests arrive at the finish time in simulated time. A client that also
    # says how many requests it still has queued (``"sim_queued": N``) is held for at most that many:
    # once its queue is empty, finishes are not followed by new requests and must not stop the clock.
    # Holds stop the clock only, never the delivery of tokens. Requests without the field (any
    # ordinary client) never hold. The same goes for the start of a run: its first request may say how
    # many more the client is sending at once (``"sim_burst": N``), and the clock waits for them, so a
    # client that takes wall milliseconds to send its burst does not start the run below its load.
    # A hold that runs out leaves its requests overdue: the simulated time until each arrives is
    # ``client_lateness_s`` (a benchmark measures again when it is a sizeable share).
    def _hold(self, finished: int) -> None:
        if self._client_queued is not None:
            finished = min(finished, self._client_queued)
        self._hold_for(finished)

    def _hold_for(self, arrivals: int) -> None:
        """Stop the clock until ``arrivals`` more requests came (or HOLD_MAX_S of wall time passed)."""
        if self.time_scale <= 1.0 or arrivals <= 0:
            return
        self._hold_owed += arrivals
        if self._hold_started is None:
            self._hold_started = time.monotonic()
            self._resume.clear()
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_MAX_S, self._hold_ran_out)

    def _hold_ran_out(self) -> None:
        self._overdue.extend([time.monotonic()] * self._hold_owed)
        self._release_hold()

    def _arrived(self) -> None:
        now = time.monotonic()
        while self._overdue and now - self._overdue[0] > CLIENT_LATE_FORGET_S:
            self._overdue.popleft()
        if self._overdue:  # a request an expired hold waited for, late
            self.client_lateness_s += (now - self._overdue.popleft()) * self.time_scale
            return
        if self._hold_started is not None:
            self._hold_owed -= 1
            if self._hold_owed <= 0:
                self._release_hold()

    def _release_hold(self) -> None:
        if self._hold_started is not None:
            self._held_total += time.monotonic() - self._hold_started
            self._hold_started = None
        self._hold_owed = 0
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        self._resume.set()

    def sim_timestamp(self) -> float:
        return self.epoch0 + self.now()

    def arrival_time(self) -> float:
        """Simulated time a request arriving now joins the engine's timeline. When the loop has
        fallen behind the wall clock (an overloaded host), that is the loop's own time, so no
        request is ever stamped after tokens it could only have produced later."""
        now = self.now()
        return now if self._cursor is None else min(now, self._cursor)

    async def sleep_sim(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.time_scale)

    # ----- engine loop -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self.shared_gpu is not None:
            self.shared_gpu.close()

    async def _run(self) -> None:
        """Run scheduler iterations on the scaled wall clock.

        Iterations are computed back to back and *delivered* in batches, each token stamped with the
        simulated end time of its iteration: every sequence gets the tokens of all iterations since
        the last delivery in one SSE event, once every :attr:`delivery_quantum_s` of wall time
        (also when the loop is behind the clock, rather than after every iteration: a slow host
        must not spend its time on ever smaller writes). The loop itself sleeps whenever it is
        :data:`RUN_AHEAD_S` ahead of the clock, so arriving requests join at the next iterations. A sequence that finishes is delivered at once, at its
        iteration's end: a closed-loop client's next request (``sim_hold``) then joins at that exact
        iteration. Tokens are never delivered before their simulated time; they may arrive up to one
        quantum late, which is why clients read the stamps (``sim.token_times``) rather than their
        own wall clock. The event count is thus bounded by sequences / quantum at any time scale.
        """
        sched = self.scheduler
        c = self.counters
        quantum = self.delivery_quantum_s
        cursor: float | None = None  # simulated end of the previous iteration while busy
        self._cursor = None
        pending: dict[SimRequest, list[tuple[float, int]]] = {}
        finished: list[SimRequest] = []
        last_delivery = time.monotonic()

        def deliver(everything: bool) -> None:
            nonlocal last_delivery
            for req in list(pending) if everything else finished:
                stamps = pending.pop(req)
                req.payload.put_nowait((sum(n for _, n in stamps), req.finish_time is not None, stamps))
            self._hold(sum(1 for r in finished if getattr(r, "hold_on_finish", False)))
            finished.clear()
            if everything:
                last_delivery = time.monotonic()

        while True:
            if self._hold_started is not None:
                await self._resume.wait()  # the clock stands still until the client's next requests
            if not sched.has_work() or self.hung:
                deliver(everything=True)
                if self.shared_gpu is not None:
                    self.shared_gpu.busy_until(0.0)  # idle: the GPU's time goes to the others
                self._wake.clear()
                self._cursor = None
                await self._wake.wait()
                cursor = None
                continue
            # Back-to-back iterations start at the previous one's *modelled* end, not at "now": the
            # time spent delivering tokens to handlers must not stretch simulated time.
            start = self.now() if cursor is None else cursor
            res = sched.step(start)
            end = start + res.duration
            cursor = self._cursor = end
            if self.shared_gpu is not None:
                self.shared_gpu.busy_until(time.time() + max(0.0, (end - self.now()) / self.time_scale))
            c["steps"] += 1
            c["drafts"] += res.drafts
            c["draft_tokens"] += res.draft_tokens
            c["accepted"] += res.accepted_tokens
            for req, n, done in res.emissions:
                c["generation_tokens"] += n
                pending.setdefault(req, []).append((round(end, 6), n))
                if done:
                    finished.append(req)
            ahead = (end - self.now()) / self.time_scale
            everything = not sched.has_work() or time.monotonic() - last_delivery >= quantum
            if ahead >= RUN_AHEAD_S or everything or finished:
                if ahead > 0:
                    await asyncio.sleep(ahead)  # never deliver a token before its simulated time
                if everything or finished:
                    deliver(everything)
            if ahead <= 0:
                c["late_steps"] += 1
                self.lateness_s += -ahead * self.time_scale
                await asyncio.sleep(0)  # let handlers run even when behind

    # ----- requests ----------------------------------------------------------------------------
    def submit(self, prompt_tokens: int, max_tokens: int, *, temperature: float, ignore_eos: bool,
               seed: int | None, hold_on_finish: bool = False, client_queued: int | None = None,
               client_burst: int | None = None, prompt_key: str = "") -> SimRequest:
        """Admit a request; its output length, acceptance schedule and text (``req.completion``, from
        ``prompt_key``, ``temperature`` and the seed) are drawn now."""
        self._arrived()
        if client_burst:
            self._hold_for(client_burst)  # from the first request's arrival: the rest join at its time
        if hold_on_finish:
            self._client_queued = client_queued
        self._request_counter += 1
        rid = uuid.uuid4().hex[:16]
        req_seed = seed if seed is not None else (self.seed * 1_000_003 + self._request_counter)
        req = make_request(self.model, rid, prompt_tokens, max_tokens, temperature=temperature,
                           ignore_eos=ignore_eos, seed=req_seed, arrival_time=self.arrival_time())
        req.payload = asyncio.Queue()
        req.hold_on_finish = hold_on_finish
        req.completion = textmodel.draw_completion(prompt_key, temperature, req.num_tokens, req_seed)
        self.scheduler.add(req)
        self.first_request.set()
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += req.prompt_tokens
        self._wake.set()
        return req

    def cancel(self, req: SimRequest) -> None:
        self.scheduler.cancel(req)

    def info(self) -> dict[str, Any]:
        return {
            "simulated": True,
            "profile": self.profile.name,
            "profile_calibrated": self.profile.calibrated,
            "profile_notes": self.profile.notes,
            # the LMDeploy engine simulated, and for TurboMind what its constants were fitted on
            "backend": self.params.backend,
            "backend_fitted_on": (self.profile.extra.get(self.params.backend) or {}).get("fitted_on"),
            "model_name": self.model_name,
            "time_scale": self.time_scale,
            "delivery_quantum_s": self.delivery_quantum_s,  # wall seconds a stamped token may arrive late
            # The simulated clock is (CLOCK_MONOTONIC - monotonic_start) * time_scale. A client on the
            # same host (same boot_id) maps the chunks' ``sim.token_times`` onto its own monotonic clock.
            "monotonic_start": self._wall0,
            "boot_id": host_boot_id(),
            "config": asdict(self.params),
            "engine": self.model.describe(),
            "noise": asdict(self.noise) if self.noise else None,  # run-to-run variation, when asked for
            "simulated_time_s": round(self.now(), 6),
            "simulated_timestamp": self.sim_timestamp(),
            "counters": dict(self.counters),
            "lateness_s": round(self.lateness_s, 6),
            "client_lateness_s": round(self.client_lateness_s, 6),
            "held_wall_s": round(self._held_total, 6),
            "num_requests_running": self.scheduler.num_running,
            "num_requests_waiting": self.scheduler.num_waiting,
        }


class _MetricsCollector:
    """The metric names of the engine simulated (its backend's, with ':'), which prometheus_client's
    Counter API can't spell."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.names = get_backend(engine.params.backend).metrics

    def collect(self):  # noqa: ANN201 (prometheus_client protocol)
        e, c, n = self.engine, self.engine.counters, self.names
        yield CounterMetricFamily(n.family(n.drafts), "Number of sequence-steps that drafted tokens.",
                                  value=c["drafts"])
        yield CounterMetricFamily(n.family(n.draft_tokens), "Number of draft tokens proposed.",
                                  value=c["draft_tokens"])
        yield CounterMetricFamily(n.family(n.accepted_tokens), "Number of draft tokens accepted.",
                                  value=c["accepted"])
        yield GaugeMetricFamily(n.running, "Requests being prefilled or decoded.", value=e.scheduler.num_running)
        yield GaugeMetricFamily(n.waiting, "Requests waiting for admission.", value=e.scheduler.num_waiting)
        yield GaugeMetricFamily("sim_time_scale", "Simulated seconds per wall second.", value=e.time_scale)
        yield GaugeMetricFamily("sim_simulated_time_seconds", "Simulated seconds since start.", value=e.now())
        yield CounterMetricFamily("sim_generation_tokens", "Generated tokens.", value=c["generation_tokens"])
        yield CounterMetricFamily("sim_prompt_tokens", "Prompt tokens received.", value=c["prompt_tokens"])
        yield CounterMetricFamily("sim_requests", "Requests received.", value=c["requests"])


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header lists gzip (quality values are not weighed, as
    prometheus_client does not weigh them either)."""
    return any(part.split(";")[0].strip().lower() == "gzip" for part in accept_encoding.split(","))


# ----- request parsing ------------------------------------------------------------------------
def _field(body: dict, name: str, types: tuple, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types:
        raise OpenAIError(f"'{name}' must be of type {types[0].__name__}, got bool", param=name)
    if not isinstance(value, types):
        raise OpenAIError(f"'{name}' must be of type {types[0].__name__}, got {type(value).__name__}", param=name)
    return value


def _prompt_tokens(body: dict, chat: bool) -> int:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIError("'messages' must be a non-empty list of {role, content} objects", param="messages")
        total = 0
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise OpenAIError(f"messages[{i}] must be an object with 'role' and 'content'", param="messages")
            content = m.get("content") or ""
            if isinstance(content, list):  # content parts
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise OpenAIError(f"messages[{i}].content must be a string or a list of parts", param="messages")
            total += tokenizer.count_tokens(content)
        return max(total, 1)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return max(tokenizer.count_tokens(prompt), 1)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return max(tokenizer.count_tokens(prompt[0]), 1)
    raise OpenAIError("'prompt' must be a string, a one-string list or a list of token ids", param="prompt")


def _prompt_key(body: dict, chat: bool) -> str:
    """The prompt as the text model sees it (already validated by :func:`_prompt_tokens`)."""
    if chat:
        return json.dumps([[m.get("role"), m.get("content")] for m in body["messages"]], sort_keys=True)
    prompt = body["prompt"]
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _parse(body: Any, engine: SimEngine, chat: bool) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise OpenAIError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != engine.model_name:
        raise OpenAIError(f"model {model!r} does not exist; this server serves {engine.model_name!r}",
                          status=404, param="model", code="model_not_found")
    n = _field(body, "n", (int,), 1)
    if n != 1:
        raise OpenAIError("only n=1 is supported", param="n")
    prompt_tokens = _prompt_tokens(body, chat)
    session_len = engine.model.session_len
    max_tokens = _field(body, "max_completion_tokens", (int,), None) if chat else None
    max_tokens = max_tokens if max_tokens is not None else _field(body, "max_tokens", (int,), None)
    if max_tokens is None:
        if prompt_tokens >= session_len:
            # Name what the client sent: the prompt, not a max_tokens it never gave.
            raise OpenAIError(f"the prompt is {prompt_tokens} tokens; the context (session length) holds "
                              f"{session_len}: shorten it", param="messages" if chat else "prompt",
                              code="context_length_exceeded")
        max_tokens = session_len - prompt_tokens
    if max_tokens < 1:
        raise OpenAIError(f"'max_tokens' must be >= 1, got {max_tokens}", param="max_tokens")
    if prompt_tokens + max_tokens > session_len:
        raise OpenAIError(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the session length "
            f"{session_len}; lower max_tokens", param="max_tokens", code="context_length_exceeded")
    temperature = float(_field(body, "temperature", (int, float), get_backend("sim").default_temperature))
    if not 0.0 <= temperature <= 2.0:
        raise OpenAIError(f"'temperature' must be in [0, 2], got {temperature}", param="temperature")
    stream_options = _field(body, "stream_options", (dict,), {}) or {}
    return dict(prompt_tokens=prompt_tokens, prompt_key=_prompt_key(body, chat), max_tokens=int(max_tokens),
                temperature=temperature,
                ignore_eos=bool(_field(body, "ignore_eos", (bool,), False)),
                seed=_field(body, "seed", (int,), None), stream=bool(_field(body, "stream", (bool,), False)),
                include_usage=bool(stream_options.get("include_usage", False)),
                sim_hold=bool(_field(body, "sim_hold", (bool,), False)),
                sim_queued=_field(body, "sim_queued", (int,), None),
                sim_burst=_field(body, "sim_burst", (int,), None))


# ----- handlers -------------------------------------------------------------------------------
def build_app(engine: SimEngine) -> web.Application:
    """The aiohttp application serving ``engine`` (engine loop started on app startup)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_MetricsCollector(engine))

    @web.middleware
    async def guard(request: web.Request, handler):  # noqa: ANN001, ANN202
        if engine.hung:  # simulated hang: accept the connection, never answer
            await asyncio.Event().wait()
        try:
            return await handler(request)
        except OpenAIError as exc:
            return exc.response()

    async def add_header(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SIM_HEADER] = "true"

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": engine.model_name, "object": "model", "created": int(engine.epoch0), "owned_by": "simulator",
            "root": engine.model_name, "parent": None, "max_model_len": engine.model.session_len}]})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(request: web.Request) -> web.Response:
        # Like LMDeploy's /metrics (prometheus_client's ASGI app): the text format, gzipped when the
        # client accepts it (aiohttp clients ask for it by default).
        body = generate_latest(registry)
        headers = {"Content-Type": CONTENT_TYPE_LATEST}
        if _accepts_gzip(request.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def info(_request: web.Request) -> web.Response:
        return web.json_response(engine.info())

    async def completions(request: web.Request) -> web.StreamResponse:
        return await _generate(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await _generate(request, chat=True)

    async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise OpenAIError("request body is not valid JSON") from None
        args = _parse(body, engine, chat)
        try:
            req = engine.submit(args["prompt_tokens"], args["max_tokens"], temperature=args["temperature"],
                                ignore_eos=args["ignore_eos"], seed=args["seed"], hold_on_finish=args["sim_hold"],
                                client_queued=args["sim_queued"], client_burst=args["sim_burst"],
                                prompt_key=args["prompt_key"])
        except ValueError as exc:
            raise OpenAIError(str(exc), param="max_tokens") from None
        completion = req.completion
        rid = ("chatcmpl-" if chat else "cmpl-") + req.request_id
        # OpenAI's ``created`` is when the response was made, in Unix seconds: the wall clock. The simulated
        # clock runs time_scale times faster (20x: an hour ahead after three minutes); its times are in ``sim``.
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        finished = False
        resp: web.StreamResponse | None = None
        generated = 0
        try:
            if not args["stream"]:
                parts: list[str] = []
                generated = 0
                first_token_time = finish_time = None
                while not finished:
                    n, finished, stamps = await req.payload.get()
                    generated += n
                    first_token_time = stamps[0][0] if first_token_time is None else first_token_time
                    finish_time = stamps[-1][0]
                    parts.append(completion.text(generated - n, generated))
                finish = "length" if generated >= args["max_tokens"] else "stop"
                text = " ".join(parts)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                          if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
                return web.json_response({
                    "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                    "model": engine.model_name, "choices": [choice],
                    "usage": {"prompt_tokens": req.prompt_tokens, "completion_tokens": generated,
                              "total_tokens": req.prompt_tokens + generated},
                    "sim": {"arrival": round(req.arrival_time, 6), "first_token": first_token_time,
                            "finish": finish_time}})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            generated, first = 0, True
            # Hot path (one event per sequence per iteration): pre-render everything but the text.
            head = json.dumps({"id": rid, "object": obj, "created": created, "model": engine.model_name})[:-1]
            if chat:
                pre, post = head + ', "choices": [{"index": 0, "delta": {"content": ', "}"
            else:
                pre, post = head + ', "choices": [{"index": 0, "text": ', ', "logprobs": null'
            while not finished:
                n, finished, stamps = await req.payload.get()
                while not finished and not req.payload.empty():  # coalesce what is already queued
                    n2, finished, more = req.payload.get_nowait()
                    n, stamps = n + n2, stamps + more
                generated += n
                text = json.dumps(" " + completion.text(generated - n, generated))
                if chat and first:
                    text += ', "role": "assistant"'
                reason = "null"
                if finished:
                    reason = '"length"' if generated >= args["max_tokens"] else '"stop"'
                # Simulated times of the tokens in this event: [[time, tokens], ...] (seconds since the
                # engine started), and the request's simulated arrival in the first event.
                sim = {"token_times": stamps}
                if first:
                    sim["arrival"] = round(req.arrival_time, 6)
                first = False
                await resp.write(f"data: {pre}{text}{post}, \"finish_reason\": {reason}}}], "
                                 f"\"sim\": {json.dumps(sim)}}}\n\n".encode())
            if args["include_usage"]:
                chunk = {"id": rid, "object": obj, "created": created, "model": engine.model_name, "choices": [],
                         "usage": {"prompt_tokens": req.prompt_tokens, "completion_tokens": generated,
                                   "total_tokens": req.prompt_tokens + generated}}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except ConnectionResetError:  # the client closed its stream early (aiohttp's reset subclasses it)
            if resp is None:
                raise
            log.debug("request %s: client closed the stream after %d tokens", rid, generated)
            return resp
        finally:
            if not finished:  # client went away (or an error): free its KV blocks
                engine.cancel(req)

    app = web.Application(middlewares=[guard], client_max_size=64 * 1024 * 1024)
    app.on_response_prepare.append(add_header)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/sim/info", info)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)

    async def on_startup(_app: web.Application) -> None:
        engine.start()

    async def on_cleanup(_app: web.Application) -> None:
        await engine.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def fault_task(engine: SimEngine, spec: str) -> Any:
    """Coroutine that carries out a timed fault (``crash-after:S``, ``hang-after:S``: S simulated seconds
    after the first request arrived), or ``None``."""
    kind, _, arg = spec.partition(":")
    if kind not in ("crash-after", "hang-after"):
        return None
    seconds = float(arg)

    async def run() -> None:
        # Count from the first request, so a slow start-up on a loaded machine doesn't move the fault.
        await engine.first_request.wait()
        await engine.sleep_sim(seconds)
        if kind == "crash-after":
            log.error("simulated fault crash-after:%s: engine process dies now (exit 137, like a SIGKILL/OOM kill)", arg)
            logging.shutdown()
            os._exit(137)
        log.error("simulated fault hang-after:%s: engine stops answering every request; process stays alive", arg)
        engine.hung = True

    return run()
