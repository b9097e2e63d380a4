"""The status the router counts for a stream (``ray_mtp_router_requests_total{status}``): real HTTP
clients against the router's response path served by uvicorn, and the ASGI calls of a client that
stops reading (no Ray cluster; a stand-in engine stream).

499 means the client left before it had the stream: a client that closes right after the last byte
(``data: [DONE]``), while the engine's stream has not ended yet, was served (200); one that resets the
connection mid-stream left (499), also when its leaving finds the router waiting in ``send``.
"""
from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("ray")
uvicorn = pytest.importorskip("uvicorn")

from starlette.applications import Starlette
from starlette.routing import Route

from orchestrator.config import EngineConfig
from orchestrator.ports import find_free_port
from orchestrator.serve.policy import choose_route
from orchestrator.serve.protocol import ParsedRequest
from orchestrator.serve.router import Router, RouterSpec

MODEL = "intern-s2-preview-8xh200"
CFG = EngineConfig(backend="sim", model=MODEL, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
TABLE = {
    "provenance": {"model": MODEL, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "test-status",
                   "created_at": "2026-12-06T00:00:00Z", "simulated": True},
    "buckets": [{"name": "all", "max_output_len": 131072, "config": CFG.to_dict(), "figures": {"output_throughput": 1.0}}],
}


def _event(text: str) -> bytes:
    obj = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class _Sink:
    def inc(self, *a: Any, **k: Any) -> None: ...
    def observe(self, *a: Any, **k: Any) -> None: ...
    def set(self, *a: Any, **k: Any) -> None: ...


class _Metrics:
    """Stands in for the router's metrics; ``statuses`` holds the ``status`` tag of every counted request."""

    def __init__(self) -> None:
        self.statuses: list[str] = []
        self.output_tokens = self.ttft = self.tpot = self.errors = self.fallbacks = self.in_flight = _Sink()
        self.requests = self

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        self.statuses.append((tags or {})["status"])


class _Handle:
    def options(self, **kwargs: Any) -> _Handle:
        return self


class _EngineStream:
    """An engine deployment's response stream: ``items`` with a pause before each, then ``tail_s`` more
    before it ends (an engine's stream outlives its [DONE] event by its own closing)."""

    def __init__(self, items: list[bytes], *, pause_s: float = 0.0, tail_s: float = 0.0) -> None:
        self._items: Iterator[bytes] = iter(items)
        self.pause_s, self.tail_s = pause_s, tail_s
        self.cancelled = False

    def __aiter__(self) -> _EngineStream:
        return self

    async def __anext__(self) -> bytes:
        await asyncio.sleep(self.pause_s)
        try:
            return next(self._items)
        except StopIteration:
            await asyncio.sleep(self.tail_s)
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.cancelled = True


def _router() -> Router:
    router = Router(RouterSpec(table_json=json.dumps(TABLE), served_model_names=(MODEL,)).to_dict(),
                    {CFG.key(): _Handle()})
    router._metrics = _Metrics()
    return router


async def _stream_response(router: Router, engine: _EngineStream) -> Any:
    """The router's response to a streamed completion whose engine deployment answered with ``engine``
    (what ``Router._forward`` does once the engine's first chunk came)."""
    parsed = ParsedRequest(kind="completions", body={}, max_tokens=512, stream=True, client_wants_usage=False)
    decision = choose_route(512, router.table, {}, None)
    router._track(decision.deployment, +1)
    return await router._respond(parsed, decision, engine, {"status": 200, "first": b""}, time.perf_counter(), False)


@pytest.fixture
def serve_relay() -> Iterator[Callable[[Callable[[], _EngineStream]], tuple[str, Router, list[_EngineStream]]]]:
    """Serves ``POST /v1/completions`` (stream) through the router's own response path on a free port."""
    servers: list[tuple[Any, threading.Thread]] = []

    def start(engine: Callable[[], _EngineStream]) -> tuple[str, Router, list[_EngineStream]]:
        router = _router()
        streams: list[_EngineStream] = []

        async def completions(request: Any) -> Any:
            streams.append(engine())
            return await _stream_response(router, streams[-1])

        port = find_free_port()
        app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}", router, streams

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def _counted(router: Router, timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while not router._metrics.statuses and time.monotonic() < deadline:
        time.sleep(0.02)
    return router._metrics.statuses


def test_a_stream_closed_right_after_its_last_byte_counts_200(serve_relay):
    events = [_event(f" word{i}") for i in range(5)] + [b"data: [DONE]\n\n"]
    base, router, streams = serve_relay(lambda: _EngineStream(events, pause_s=0.01, tail_s=2.0))
    received = b""
    with httpx.Client(timeout=10) as client, client.stream("POST", base + "/v1/completions", content=b"{}") as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            received += chunk
            if received.endswith(b"data: [DONE]\n\n"):
                break  # the client has everything, and hangs up before the engine's stream ends
    assert received == b"".join(events)
    assert _counted(router) == ["200"]
    assert streams[0].cancelled  # the engine is not left streaming to nobody


def test_a_stream_the_client_resets_before_the_end_counts_499(serve_relay):
    events = [_event(f" word{i}") for i in range(50)] + [b"data: [DONE]\n\n"]
    base, router, streams = serve_relay(lambda: _EngineStream(events, pause_s=0.05))
    with _raw_request(base) as sock:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    assert _counted(router) == ["499"]
    assert streams[0].cancelled


def test_a_client_that_leaves_while_the_router_waits_in_send_counts_499():
    """Under Serve a response's ``send`` can wait (the proxy has not taken the last chunks yet); the
    client's leaving then cancels that ``send``, not the relay, which must still be closed and counted as
    the client's leaving, at once, with the engine's stream cancelled. The ASGI calls as a server makes
    them: ``send`` never returns once the client stopped reading, ``receive`` then says it disconnected."""
    router = _router()
    engine = _EngineStream([_event(f" word{i}") for i in range(50)] + [b"data: [DONE]\n\n"])
    stopped_reading = asyncio.Event()

    async def send(message: dict) -> None:
        if message.get("body"):
            stopped_reading.set()
            await asyncio.Event().wait()  # the client reads nothing more

    async def receive() -> dict:
        await stopped_reading.wait()
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        response = await _stream_response(router, engine)
        await asyncio.wait_for(response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send), 5)

    asyncio.run(scenario())
    assert router._metrics.statuses == ["499"]
    assert engine.cancelled


class _raw_request:
    """A raw HTTP/1.1 client that resets the connection (RST, not FIN) when the ``with`` block ends."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 2\r\n\r\n{}")

    def __enter__(self) -> socket.socket:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
