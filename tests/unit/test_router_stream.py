"""The router's stream relay and engine transport, without a Ray cluster.

An engine replica yields whatever bytes its engine had sent when it was resumed, so one handle item
may carry several SSE events (coalesced) or part of one (split anywhere, even between the two
newlines that end an event). The relay must hand the official OpenAI client a stream it parses into
exactly the engine's events, and count tokens from the usage chunk, not from items or events.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

pytest.importorskip("ray")

from orchestrator.config import EngineConfig  # noqa: E402
from orchestrator.serve.app import AppArgs, router_spec  # noqa: E402
from orchestrator.serve.policy import choose_route  # noqa: E402
from orchestrator.serve.router import Router, RouterSpec  # noqa: E402
from orchestrator import table as routing  # noqa: E402
from orchestrator.fsutil import utc_now_iso

MODEL = "intern-s2-preview-8xh200"
CFG = EngineConfig(backend="sim", model=MODEL, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
TABLE = {
    "provenance": {"model": MODEL, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "test-stream",
                   "created_at": "2026-11-29T00:00:00Z", "simulated": True},
    "buckets": [{"name": "all", "max_output_len": 131072, "config": CFG.to_dict(), "figures": {"output_throughput": 1.0}}],
}
PIECES = [" Once", " upon a", " time", " there", " was a router"]  # 5 content events
USAGE_TOKENS = 9  # MTP: more tokens than events; the metric must say 9, not 5


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _engine_stream() -> bytes:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL}
    out = b""
    for i, text in enumerate(PIECES):
        reason = "length" if i == len(PIECES) - 1 else None
        out += _event({**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]})
    out += _event({**head, "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": USAGE_TOKENS,
                                                     "total_tokens": 4 + USAGE_TOKENS}})
    return out + b"data: [DONE]\n\n"


def _cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:]) if b > a]


def _splits() -> dict[str, list[bytes]]:
    data = _engine_stream()
    ends = [i + 2 for i in range(len(data)) if data.startswith(b"\n\n", i)]
    return {
        "one item per event": _cut(data, ends[:-1]),
        "all events coalesced in one item": [data],
        "three events per item": _cut(data, ends[2:-1:3]),
        "split between the two newlines": _cut(data, [e - 1 for e in ends[:-1]]),
        "split inside events and the usage chunk": _cut(data, [7, 40, ends[1] + 3, ends[4] + 20, len(data) - 5]),
        "byte by byte": _cut(data, list(range(1, len(data)))),
    }


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, dict]] = []

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        self.calls.append(("inc", value, dict(tags or {})))

    def observe(self, value: float, tags: dict | None = None) -> None:
        self.calls.append(("observe", value, dict(tags or {})))

    def set(self, value: float, tags: dict | None = None) -> None:
        self.calls.append(("set", value, dict(tags or {})))

    def total(self) -> float:
        return sum(v for kind, v, _ in self.calls if kind == "inc")


class _Metrics:
    def __init__(self) -> None:
        for name in ("requests", "output_tokens", "ttft", "tpot", "errors", "fallbacks", "in_flight"):
            setattr(self, name, _Recorder())


class _Handle:
    def __init__(self) -> None:
        self.options_kwargs: dict[str, Any] | None = None

    def options(self, **kwargs: Any) -> _Handle:
        self.options_kwargs = kwargs
        return self


class _Gen:
    """Stands in for Serve's DeploymentResponseGenerator: yields the items after the head."""

    def __init__(self, items: list[bytes]) -> None:
        self._items = iter(items)
        self.cancelled = False

    def __aiter__(self) -> _Gen:
        return self

    async def __anext__(self) -> bytes:
        await asyncio.sleep(0)
        try:
            return next(self._items)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.cancelled = True


def _router(transport: str = "grpc") -> tuple[Router, _Handle]:
    handle = _Handle()
    spec = RouterSpec(table_json=json.dumps(TABLE), served_model_names=(MODEL,), engine_transport=transport)
    router = Router(spec.to_dict(), {CFG.key(): handle})
    router._metrics = _Metrics()
    router._refresher = asyncio.Future(loop=asyncio.new_event_loop())  # no background status refresh outside Serve
    return router, handle


def _relay(router: Router, items: list[bytes], inject_usage: bool) -> tuple[list[bytes], _Gen]:
    decision = choose_route(512, router.table, {}, None)
    gen = _Gen(items[1:])
    tags = {"bucket": decision.bucket, "engine": decision.deployment}
    router._track(decision.deployment, +1)

    async def collect() -> list[bytes]:
        return [c async for c in router._relay(gen, items[0], decision, tags, 0.0, inject_usage)]

    return asyncio.run(collect()), gen


def _openai_parse(chunks: list[bytes], *, include_usage: bool) -> list[Any]:
    """What the official client makes of the router's output (served as a chunked HTTP response)."""
    def handler(request: httpx.Request) -> httpx.Response:
        def body() -> Iterator[bytes]:
            yield from chunks
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    client = openai.OpenAI(base_url="http://router.test/v1", api_key="sk-x", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    kwargs: dict[str, Any] = {"stream_options": {"include_usage": True}} if include_usage else {}
    return list(client.completions.create(model=MODEL, prompt="x", max_tokens=512, stream=True, **kwargs))


@pytest.mark.parametrize("split", list(_splits()))
def test_split_or_coalesced_engine_items_reach_the_openai_client_intact(split: str):
    items = _splits()[split]
    router, _ = _router()
    out, gen = _relay(router, items, inject_usage=True)

    # Only whole events leave the router, whatever the engine items were.
    joined = b"".join(out)
    assert all(c.endswith(b"\n\n") for c in out), "the router forwarded part of an SSE event"
    assert joined.count(b"data: ") == len(PIECES) + 1  # content events + [DONE]; usage chunk dropped

    parsed = _openai_parse(out, include_usage=False)
    assert "".join(c.choices[0].text for c in parsed) == "".join(PIECES)
    assert all(c.usage is None for c in parsed), "the usage chunk the router asked for leaked to the client"
    assert parsed[-1].choices[0].finish_reason == "length"

    m = router._metrics
    assert m.output_tokens.total() == USAGE_TOKENS, "tokens must come from the usage chunk, not items or events"
    assert len(m.ttft.calls) == 1
    assert [c[2]["status"] for c in m.requests.calls] == ["200"]
    assert router._in_flight[CFG.key()] == 0 and not gen.cancelled


def test_client_requested_usage_is_kept_when_items_are_coalesced():
    data = _engine_stream()
    router, _ = _router()
    out, _ = _relay(router, [data[:10], data[10:]], inject_usage=False)
    parsed = _openai_parse(out, include_usage=True)
    assert parsed[-1].usage is not None and parsed[-1].usage.completion_tokens == USAGE_TOKENS
    assert "".join(c.choices[0].text for c in parsed if c.choices) == "".join(PIECES)
    assert router._metrics.output_tokens.total() == USAGE_TOKENS


def test_engine_transport_selects_the_handle_options():
    _, grpc = _router("grpc")
    assert grpc.options_kwargs == {"stream": True, "_by_reference": False,
                                   "request_serialization": "pickle", "response_serialization": "pickle"}
    _, refs = _router("object_ref")
    assert refs.options_kwargs == {"stream": True, "_by_reference": True}
    with pytest.raises(ValueError, match="engine_transport"):
        RouterSpec(table_json=json.dumps(TABLE), served_model_names=(MODEL,), engine_transport="http")


def test_app_args_carry_the_engine_transport_to_the_router_spec(tmp_path):
    path = tmp_path / "routing.json"
    routing.commit({**TABLE, "provenance": {**TABLE["provenance"], "created_at": utc_now_iso()}}, path)
    table = routing.load(path)
    assert router_spec(AppArgs.parse({"routing_table": str(path)}), table).engine_transport == "grpc"
    args = AppArgs.parse({"routing_table": str(path), "router": {"engine_transport": "object_ref"}})
    assert router_spec(args, table).engine_transport == "object_ref"
    with pytest.raises(Exception, match="engine_transport"):
        AppArgs.parse({"routing_table": str(path), "router": {"engine_transport": "carrier-pigeon"}})


# ----- the engine replica's side: one handle item = whatever the engine had sent --------------------
class _FakeEngine:
    """What :meth:`EngineReplica.generate` needs of an ``EngineProcess``."""

    def __init__(self, base_url: str) -> None:
        self.base_url, self.returncode = base_url, None

    def is_alive(self) -> bool:
        return True

    def stop(self) -> None:
        pass


def test_replica_yields_what_arrived_together_as_one_item_and_never_waits_for_more():
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp import web

    from orchestrator.serve.replica import EngineReplica

    data = _engine_stream()
    ends = [i + 2 for i in range(len(data)) if data.startswith(b"\n\n", i)]
    burst, single, rest = data[:ends[2]], data[ends[2]:ends[3]], data[ends[3]:]

    async def scenario() -> None:
        release_single, release_rest = asyncio.Event(), asyncio.Event()

        async def completions(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(burst)  # three events in one write: they arrive together
            await release_single.wait()
            await resp.write(single)
            await release_rest.wait()
            await resp.write(rest)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        replica = EngineReplica.__new__(EngineReplica)  # no engine process: only the request path is tested
        replica.engine, replica.key = _FakeEngine(f"http://127.0.0.1:{port}"), "fake"
        replica._session = aiohttp.ClientSession()
        replica._poller = asyncio.get_running_loop().create_future()  # no metrics poller
        replica._sequences_answered = 0  # what __init__ sets: the accept-length estimate's denominator
        try:
            gen = replica.generate("/v1/completions", b"{}")
            head = await asyncio.wait_for(gen.__anext__(), 5)
            # The head came while the engine was still holding the rest back: nothing waited to fill a buffer.
            assert head["status"] == 200 and head["first"] == burst, "the burst must be one item, and complete"
            release_single.set()
            assert await asyncio.wait_for(gen.__anext__(), 5) == single
            release_rest.set()
            tail = [item async for item in gen]
            assert b"".join(tail) == rest
            assert replica._sequences_answered == 1  # one answered sequence that could draft
        finally:
            await replica._session.close()
            await runner.cleanup()

    asyncio.run(scenario())


def test_serve_cancelling_the_receive_channel_ends_a_stream_without_an_error(caplog):
    """Under Serve, ``receive()`` is a call to the proxy that Serve cancels when the request finishes;
    it raises ``TaskCancelledError`` in Starlette's disconnect listener. That is a disconnect, logged at
    debug level: a normal streaming load must log no ERROR (``tests/integration/test_serve_app.py`` checks the
    router's Serve log under a real load)."""
    import logging

    from ray.exceptions import TaskCancelledError

    from orchestrator.serve.router import _RelayResponse

    async def scenario() -> list[dict]:
        sent: list[dict] = []
        first_chunk_sent = asyncio.Event()

        async def body():
            yield b"data: 1\n\n"
            await asyncio.sleep(30)  # a stream still running when Serve cancels the request
            yield b"data: 2\n\n"

        async def send(message: dict) -> None:
            sent.append(message)
            if message.get("body"):
                first_chunk_sent.set()

        async def receive() -> dict:
            await first_chunk_sent.wait()
            raise TaskCancelledError()

        scope = {"type": "http", "asgi": {"spec_version": "2.1"}}  # Serve's replicas run the listener path
        await asyncio.wait_for(_RelayResponse(body(), media_type="text/event-stream")(scope, receive, send), 10)
        return sent

    serve_logger = logging.getLogger("ray.serve")  # Ray's logger does not propagate to the root
    serve_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.DEBUG, logger="ray.serve"):
            sent = asyncio.run(scenario())
    finally:
        serve_logger.removeHandler(caplog.handler)
    assert [m.get("body") for m in sent if m["type"] == "http.response.body"] == [b"data: 1\n\n"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("cancelled" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)


def test_a_router_of_real_engines_says_they_are_not_simulated():
    """/sim/info answers 404 and no response carries the simulated marker unless every engine of the
    table is simulated (the simulated case runs on real Serve in tests/integration/test_serve_app.py)."""
    from starlette.requests import Request

    real = EngineConfig(backend="pytorch", model="/models/m", tp=1)
    table = {**TABLE, "buckets": [{**TABLE["buckets"][0], "config": real.to_dict()}],
             "provenance": {**TABLE["provenance"], "simulated": False}}
    router = Router(RouterSpec(table_json=json.dumps(table), served_model_names=(MODEL,)).to_dict(), {real.key(): _Handle()})
    request = Request({"type": "http", "method": "GET", "path": "/sim/info", "headers": [], "query_string": b""})

    async def ask() -> tuple[Any, Any]:
        return await router.sim_info(request), await router.models(request)

    info, models = asyncio.run(ask())
    assert info.status_code == 404 and json.loads(info.body)["error"]["type"] == "not_found"
    assert "x-simulated-engine" not in models.headers and "x-simulated-engine" not in info.headers
    sim_router, _ = _router()
    models = asyncio.run(sim_router.models(request))
    assert models.headers["x-simulated-engine"] == "true"
