"""The HTTP side of a drive: an OpenAI-compatible server (the Serve router or one engine), probed once,
sent streaming completions, and asked for the simulator's lateness counters. A failed request is an
:class:`Outcome` with ``error_kind``, never an exception.

The server is probed with the bench's probe (:mod:`tuning.bench.client`), so a simulated engine or a
router of simulated engines is recognised the same way (``/sim/info``, ``x-simulated-engine``) and
its time scale is known. A simulated engine stamps every chunk with the simulated times of its tokens
and the first with the request's arrival (``sim.token_times``, ``sim.arrival``, on the engine's own
clock); the router passes them through. Then the request's TTFT and duration are taken from those
stamps (:attr:`Outcome.sim_ttft`, :attr:`Outcome.sim_e2e`), exact whatever the delivery lag of the
simulator's batched delivery or of a busy router and proxy; otherwise from arrival times.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from tuning.bench.client import probe_server
from tuning.bench.errors import ServerUnreachableError
from tuning.bench.records import ServerInfo
from tuning.drive.errors import DriveError
from tuning.drive.records import EngineLateness
from tuning.drive.workload import DrawnRequest

__all__ = ["OpenAIBackend", "Outcome", "lateness_between", "sim_counters_of"]


@dataclass(frozen=True)
class Outcome:
    """One request's result on the host's monotonic clock (seconds)."""

    started: float
    first_token: float | None
    finished: float
    output_tokens: int
    ok: bool
    error_kind: str | None = None
    error: str = ""
    route: str | None = None
    sim_ttft: float | None = None
    """Simulated seconds from the engine's arrival of the request to its first token (its stamps)."""
    sim_e2e: float | None = None
    """Simulated seconds from the engine's arrival of the request to its last token (its stamps)."""


class OpenAIBackend:
    """Streaming ``/v1/completions`` against ``base_url`` (without ``/v1``); use as ``async with``."""

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 request_timeout_s: float = 3600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._model = model
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.info: ServerInfo | None = None

    async def __aenter__(self) -> OpenAIBackend:
        self._session = aiohttp.ClientSession(headers=self._headers,
                                              connector=aiohttp.TCPConnector(limit=0, force_close=False))
        try:
            self.info = await probe_server(self._session, self.base_url)
        except ServerUnreachableError as e:
            await self._session.close()
            raise DriveError(str(e)) from None
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def model(self) -> str:
        assert self.info is not None, "use the backend as 'async with'"
        return self._model or self.info.model

    async def sim_counters(self) -> dict[str, dict[str, float]]:
        """Engine name -> ``steps``, ``late_steps``, ``lateness_s`` from ``/sim/info`` (empty for a real
        server or when it does not answer)."""
        assert self._session is not None
        try:
            async with self._session.get(f"{self.base_url}/sim/info", timeout=aiohttp.ClientTimeout(total=30)) as r:
                if r.status != 200:
                    return {}
                info = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return {}
        return sim_counters_of(info)

    async def send(self, req: DrawnRequest, prompt: str) -> Outcome:
        assert self._session is not None, "use the backend as 'async with'"
        body = {"model": self.model, "prompt": prompt, "max_tokens": req.max_tokens, "temperature": req.temperature,
                "seed": req.seed, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        started = time.monotonic()
        first: float | None = None
        usage: int | None = None
        chunks = 0
        route = None
        arrival: float | None = None
        stamps: list[float] = []  # simulated time of the first and of the latest token

        def fail(kind: str, msg: str) -> Outcome:
            return Outcome(started, first, time.monotonic(), usage if usage is not None else chunks, False, kind,
                           msg[:500], route)

        try:
            async with self._session.post(f"{self.base_url}/v1/completions", json=body, timeout=self._timeout) as resp:
                dep, cell = resp.headers.get("x-route-deployment"), resp.headers.get("x-route-cell")
                route = "/".join(x for x in (dep, cell) if x) or None
                if resp.status != 200:
                    return fail(f"HTTP {resp.status}", await resp.text())
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        if first is None:
                            return fail("empty response", "no text was streamed")
                        sim = (stamps[0] - arrival, stamps[-1] - arrival) if arrival is not None and stamps else None
                        return Outcome(started, first, time.monotonic(), usage if usage is not None else chunks, True,
                                       route=route, sim_ttft=sim[0] if sim else None, sim_e2e=sim[1] if sim else None)
                    obj = json.loads(data)
                    if not isinstance(obj, Mapping):
                        continue
                    if obj.get("error"):
                        return fail("stream error", str(obj["error"]))
                    u = obj.get("usage")
                    if isinstance(u, Mapping) and u.get("completion_tokens") is not None:
                        usage = int(u["completion_tokens"])
                    choices = obj.get("choices") or []
                    if choices and isinstance(choices[0], Mapping) and choices[0].get("text"):
                        chunks += 1
                        if first is None:
                            first = time.monotonic()
                        sim = obj.get("sim")
                        if isinstance(sim, Mapping) and sim.get("token_times"):
                            if sim.get("arrival") is not None:
                                arrival = float(sim["arrival"])
                            times = [float(t) for t, _ in sim["token_times"]]
                            stamps[:] = [stamps[0] if stamps else times[0], times[-1]]
            return fail("incomplete stream", "the stream ended without [DONE]")
        except asyncio.TimeoutError:
            return fail("timeout", f"no complete response within {self._timeout.total} s")
        except (aiohttp.ClientError, OSError) as e:
            return fail("connection", f"{type(e).__name__}: {e}")
        except (ValueError, UnicodeDecodeError) as e:
            return fail("bad response", f"{type(e).__name__}: {e}")


def sim_counters_of(info: Any) -> dict[str, dict[str, float]]:
    """Engine name -> ``steps``, ``late_steps``, ``lateness_s``, ``client_lateness_s`` from a ``/sim/info``
    answer: an engine's own (named ``engine``) or a router's, which lists its engines (``via_router``)."""
    engines = info.get("engines") if isinstance(info, Mapping) and info.get("via_router") else {"engine": info}
    out = {}
    for name, e in (engines or {}).items():
        if isinstance(e, Mapping):
            c = e.get("counters") or {}
            out[str(name)] = {"steps": float(c.get("steps", 0)), "late_steps": float(c.get("late_steps", 0)),
                              "lateness_s": float(e.get("lateness_s", 0.0)),
                              "client_lateness_s": float(e.get("client_lateness_s", 0.0))}
    return out


def lateness_between(before: Mapping[str, Mapping[str, float]],
                     after: Mapping[str, Mapping[str, float]]) -> tuple[EngineLateness, ...]:
    """Each engine's counters over the drive (after minus before; an engine new since counts from 0)."""
    out = []
    for name in sorted(after):
        a, b = after[name], before.get(name, {})
        out.append(EngineLateness(engine=name, steps=int(a["steps"] - b.get("steps", 0)),
                                  late_steps=int(a["late_steps"] - b.get("late_steps", 0)),
                                  lateness_s=round(a["lateness_s"] - b.get("lateness_s", 0.0), 6)))
    return tuple(out)
