"""The HTTP side of the bench: probe the server, send one streaming request and parse its SSE
chunks into token events, scrape the engine's counters.

A failed request is data (:class:`RequestOutput` with ``error_kind``), never an exception.

Against the simulated engine (``GET /sim/info`` answers, or responses carry
``x-simulated-engine: true``) token events are timed by the simulator's stamps (:class:`SimClock`)
when it runs on this host, and every figure is later scaled to simulated time.

A request reports its progress to the run through :class:`_Hooks` (no-ops for warm-up); the run's
hooks (:mod:`tuning.bench.runner`) feed the steady-state bookkeeping.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from orchestrator.ports import host_boot_id
from tuning.bench.counters import parse_gauge, parse_spec_counters
from tuning.bench.errors import ServerUnreachableError
from tuning.bench.records import RequestOutput, ServerInfo, SimClock
from tuning.workload import RequestSpec, TokenCounter, Workload

__all__ = ["PROBE_TIMEOUT_S", "SIM_HEADER", "probe_server"]

logger = logging.getLogger(__name__)

SIM_HEADER = "x-simulated-engine"
PROBE_TIMEOUT_S = 10.0


async def probe_server(session: aiohttp.ClientSession, base_url: str) -> ServerInfo:
    """What the server at ``base_url`` is (model, simulated or not, time scale): one copy of how a
    client tells a simulated engine or a router in front of simulated engines from a real one."""
    url = f"{base_url}/v1/models"
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    try:
        async with session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                body = (await resp.text())[:300]
                raise ServerUnreachableError(
                    f"GET {url} answered HTTP {resp.status}: {body!r}; is this an OpenAI-compatible server "
                    "(and is --api-key right)?"
                )
            header_sim = resp.headers.get(SIM_HEADER, "").lower() == "true"
            models = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise ServerUnreachableError(
            f"cannot reach the server at {base_url} (GET /v1/models: {type(e).__name__}: {e}); "
            "start it or fix --base-url"
        ) from None
    except json.JSONDecodeError:
        raise ServerUnreachableError(f"GET {url} did not return JSON; is this an OpenAI-compatible server?") from None
    data = models.get("data") if isinstance(models, Mapping) else None
    if not data or not isinstance(data, list) or not isinstance(data[0], Mapping) or "id" not in data[0]:
        raise ServerUnreachableError(f"GET {url} lists no model ({models!r:.200}); is the engine fully started?")
    model = str(data[0]["id"])
    owned_by = str(data[0].get("owned_by") or "")

    sim_info: dict | None = None
    try:
        async with session.get(f"{base_url}/sim/info", timeout=timeout) as resp:
            if resp.status == 200:
                got = await resp.json(content_type=None)
                if isinstance(got, Mapping) and got.get("simulated"):
                    sim_info = dict(got)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, OSError):
        pass
    simulated = sim_info is not None or header_sim or owned_by == "simulator"
    time_scale = 1.0
    if sim_info is not None and sim_info.get("time_scale"):
        time_scale = float(sim_info["time_scale"])
    elif simulated:
        text = await _get_metrics_text(session, base_url)
        gauge = parse_gauge(text, "sim_time_scale") if text else None
        time_scale = gauge or 1.0
    engine = "sim" if simulated else (owned_by or "unknown")
    sim_clock = None
    if (
        sim_info is not None
        and sim_info.get("monotonic_start") is not None
        and sim_info.get("boot_id") is not None
        and sim_info.get("boot_id") == host_boot_id()
    ):
        sim_clock = SimClock(float(sim_info["monotonic_start"]), time_scale,
                             float(sim_info.get("delivery_quantum_s") or SimClock.delivery_quantum_s))
    return ServerInfo(model=model, simulated=simulated, time_scale=time_scale, engine=engine, sim_info=sim_info,
                      sim_clock=sim_clock)


async def _get_metrics_text(session: aiohttp.ClientSession, base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    try:
        async with session.get(f"{base_url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None


async def _scrape_spec_counters(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = PROBE_TIMEOUT_S
) -> dict[str, float] | None:
    text = await _get_metrics_text(session, base_url, timeout_s)
    if text is None:
        return None
    try:
        return parse_spec_counters(text)
    except Exception as e:  # noqa: BLE001 - a malformed page loses the accept length, not the run
        logger.warning("could not parse %s/metrics: %s; accept length will be missing", base_url, e)
        return None


class _RequestState:
    """Mutable progress of one in-flight request; frozen into a :class:`RequestOutput` at the end."""

    __slots__ = ("index", "spec", "started_at", "ttft", "itl", "last_at", "tokens", "usage_tokens", "text_parts", "done")

    def __init__(self, index: int, spec: RequestSpec) -> None:
        self.index = index
        self.spec = spec
        self.started_at: float | None = None
        self.ttft: float | None = None
        self.itl: list[float] = []
        self.last_at: float | None = None
        self.tokens = 0.0
        self.usage_tokens: int | None = None
        self.text_parts: list[str] = []
        self.done = False

    def freeze(self, *, success: bool, kind: str | None, error: str, counter: TokenCounter, now: float) -> RequestOutput:
        started = self.started_at if self.started_at is not None else now
        if self.usage_tokens is not None:
            out_len = self.usage_tokens
        else:
            out_len = counter.count_tokens("".join(self.text_parts)) if self.text_parts else 0
        end = self.last_at if (success and self.last_at is not None) else now
        return RequestOutput(
            index=self.index,
            success=success,
            error_kind=kind,
            error=error,
            ttft=self.ttft,
            itl=tuple(self.itl),
            latency=end - started,
            prompt_len=self.spec.prompt_len,
            output_len=int(out_len),
            started_at=started,
            finished_at=now,
            last_token_at=self.last_at,
        )


class _Hooks:
    """Callbacks from a request to the run (saturation bookkeeping); no-ops for warm-up."""

    def on_first_token(self, state: _RequestState, t: float) -> None:
        pass

    def on_tokens(self, t: float, n: float) -> None:
        pass

    def on_chunk(self, state: _RequestState, t: float, n: float, gap: float | None) -> None:
        """A chunk with ``n`` tokens at ``t``; ``gap`` since the request's previous chunk (``None``
        for the first token). Called before ``state.tokens`` counts it."""


def _payload(w: Workload, model: str, spec: RequestSpec, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": w.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": w.ignore_eos,
    }
    if w.api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


def _chunk_text(obj: Mapping[str, Any], api: str) -> str:
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        return ""
    c = choices[0]
    if api == "chat":
        delta = c.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return c.get("text") or ""


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    model: str,
    state: _RequestState,
    counter: TokenCounter,
    hooks: _Hooks,
    timeout: aiohttp.ClientTimeout,
    max_tokens: int,
    clock: SimClock | None = None,
    sim_queued: int | None = None,
    sim_burst: int | None = None,
) -> RequestOutput:
    """Send one streaming request; every failure becomes a :class:`RequestOutput` (cancellation
    propagates: the caller records the partial state). ``sim_queued``: this request is part of a
    closed loop on the simulator with that many requests still queued behind it (the simulator's
    clock waits for the next one when it finishes; see ``orchestrator/sim/server.py``). ``sim_burst``:
    the run's first request, with that many more sent at once (the clock waits for them too)."""
    payload = _payload(w, model, state.spec, max_tokens)
    if sim_queued is not None:
        payload["sim_hold"] = True
        payload["sim_queued"] = sim_queued
    if sim_burst:
        payload["sim_burst"] = sim_burst
    state.started_at = time.monotonic()
    got_done = False
    try:
        async with session.post(url, json=payload, timeout=timeout) as resp:
            if resp.status != 200:
                body = (await resp.text())[:500]
                return state.freeze(success=False, kind=f"HTTP {resp.status}", error=body, counter=counter, now=time.monotonic())
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, SSE comments / keep-alives, event: lines
                data = line[5:].strip()
                if data == b"[DONE]":
                    got_done = True
                    break
                obj = json.loads(data)
                if not isinstance(obj, Mapping):
                    continue
                if obj.get("error"):
                    return state.freeze(
                        success=False, kind="stream error", error=str(obj["error"])[:500], counter=counter, now=time.monotonic()
                    )
                usage = obj.get("usage")
                prev_usage = state.usage_tokens
                if isinstance(usage, Mapping) and usage.get("completion_tokens") is not None:
                    state.usage_tokens = int(usage["completion_tokens"])
                text = _chunk_text(obj, w.api)
                if not text:
                    continue
                sim = obj.get("sim") if clock is not None else None
                if isinstance(sim, Mapping) and sim.get("token_times"):
                    # Simulator: one token event per engine step, at its simulated time (SimClock).
                    if state.ttft is None and sim.get("arrival") is not None:
                        state.started_at = clock.local(sim["arrival"])  # type: ignore[union-attr]
                    events = [(clock.local(t), float(n)) for t, n in sim["token_times"]]  # type: ignore[union-attr]
                else:
                    now = time.monotonic()
                    if state.usage_tokens is not None and prev_usage is not None and state.usage_tokens > prev_usage:
                        n = float(state.usage_tokens - prev_usage)  # servers that report cumulative usage per chunk
                    else:
                        n = float(max(1, counter.count_tokens(text)))
                    events = [(now, n)]
                for now, n in events:
                    if state.ttft is None:
                        state.ttft = now - state.started_at
                        hooks.on_first_token(state, now)
                        hooks.on_chunk(state, now, n, None)
                    else:
                        state.itl.append(now - state.last_at)  # type: ignore[operator]
                        hooks.on_chunk(state, now, n, now - state.last_at)  # type: ignore[operator]
                    state.last_at = now
                    state.tokens += n
                    hooks.on_tokens(now, n)
                state.text_parts.append(text)
    except asyncio.TimeoutError:
        return state.freeze(
            success=False, kind="timeout", error=f"no complete response within {timeout.total} s", counter=counter, now=time.monotonic()
        )
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
        return state.freeze(success=False, kind="connection", error=f"{type(e).__name__}: {e}", counter=counter, now=time.monotonic())
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        return state.freeze(success=False, kind="bad response", error=f"{type(e).__name__}: {e}", counter=counter, now=time.monotonic())
    except aiohttp.ClientError as e:
        return state.freeze(success=False, kind="client error", error=f"{type(e).__name__}: {e}", counter=counter, now=time.monotonic())
    if not got_done:
        return state.freeze(
            success=False, kind="incomplete stream", error="the stream ended without [DONE]", counter=counter, now=time.monotonic()
        )
    if state.ttft is None and not state.usage_tokens:
        return state.freeze(success=False, kind="empty response", error="no text was streamed", counter=counter, now=time.monotonic())
    # Tokens the engine generated but whose text is empty (e.g. special tokens the detokenizer skips)
    # count by the usage the engine reported; their arrival times are unknown, so such a request has no
    # TTFT or ITL, and the run's steady-state windows (hooks) do not see its tokens.
    return state.freeze(success=True, kind=None, error="", counter=counter, now=time.monotonic())
