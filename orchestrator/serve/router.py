"""The ingress: an OpenAI-compatible FastAPI app on Serve that routes each request to the engine
deployment of its output-length bucket and streams the answer back unbuffered.

Per request: authorize (optional Bearer keys) -> read the body (size-capped) -> validate
(:mod:`orchestrator.serve.protocol`) -> decide (:func:`orchestrator.serve.policy.choose_route`) ->
call the engine deployment through a Serve handle with ``stream=True`` -> relay the chunks.

**Live load** is the router's own count of in-flight requests per engine deployment, divided by that
deployment's RUNNING replicas (from ``serve.status()``, refreshed every ``status_refresh_s``). It is
exact and free for a single router replica and needs no call on the request path; with N router
replicas each sees about 1/N of the load, so load-variant thresholds should be read per router
replica (they are per engine replica already). Scraping engines' ``lmdeploy:num_requests_running``
instead would add a network hop per decision and lag by the scrape period; the engine replicas
export those figures as metrics for dashboards instead.

**Health**: a deployment with no RUNNING replica is unhealthy and the policy falls back to the nearest
healthy bucket. A call that fails *before the first byte* (engine dead, replica gone, engine 5xx)
marks that deployment as failed for this request and the decision is re-made without it; the client
sees one answer with ``x-route-fallback: <wanted>-><used>``. After the first byte was sent nothing is
retried (the client may have consumed part of a stream); the stream ends with an SSE ``error`` event.

**Updates**: each router replica is built with one routing table and never changes it; a new table
is a new router version that Serve rolls out replica by replica, so every request is routed by
exactly one table version (``x-routing-table-version``).
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.raycompat import stream_handle
from orchestrator.serve.policy import NoHealthyDeploymentError, RouteDecision, choose_route
from orchestrator.serve.protocol import DEFAULT_MAX_BODY_BYTES, ApiError, ParsedRequest, encode_body, parse_request
from orchestrator.sim.server import SIM_HEADER
from orchestrator.table import RoutingTable, parse

__all__ = ["DEFAULT_BODY_TIMEOUT_S", "ENGINE_TRANSPORTS", "Router", "RouterSpec", "api", "hash_api_key"]

logger = logging.getLogger("ray.serve")

api = FastAPI(title="mtp-autotune router", docs_url=None, redoc_url=None, openapi_url=None)

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

DEFAULT_BODY_TIMEOUT_S = 30.0
"""A request body must arrive within this long after its headers. Serve's proxy sets no such limit,
so without it a client that declares a body and never sends it (slow loris) holds a router slot and
a connection forever."""


ENGINE_TRANSPORTS = frozenset({"grpc", "object_ref"})
"""How a router replica receives an engine replica's stream (:class:`RouterSpec` ``engine_transport``):

- ``grpc`` (default): the handle call goes over the engine replica's inter-deployment gRPC server
  (``handle.options(_by_reference=False)`` through :func:`orchestrator.raycompat.stream_handle`); each stream item is one gRPC message
  on one call, pickled. Nothing is put in Ray's object store and the router's core worker keeps no
  per-item object reference.
- ``object_ref``: Ray's streaming generator (Serve's default): every stream item is a Ray object
  owned by the router's core worker, i.e. one ObjectRef, an in-memory-store entry and reference
  counting per streamed chunk.

Either way Serve's handle picks the engine replica (power of two choices on ongoing requests) and
counts the request in the replica's ongoing requests, so autoscaling and draining are unchanged."""


def hash_api_key(key: str) -> str:
    """SHA-256 hex of an API key: what the router stores and compares (never the key itself)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RouterSpec:
    """Everything a router replica is built from (plain data: it is Serve init args and is returned
    by :meth:`Router.deployed_spec` so the deploy CLI can reproduce the running router exactly)."""

    table_json: str
    served_model_names: tuple[str, ...]
    api_key_sha256: tuple[str, ...] = ()
    max_tokens_limit: int = 131072
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    default_max_tokens: int | None = None
    status_refresh_s: float = 1.0
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    engine_transport: str = "grpc"

    def __post_init__(self) -> None:
        parse(self.table_json)  # raises RoutingTableError
        if self.engine_transport not in ENGINE_TRANSPORTS:
            raise ValueError(f"engine_transport must be one of {sorted(ENGINE_TRANSPORTS)}, not {self.engine_transport!r}")
        if not self.served_model_names:
            raise ValueError("served_model_names must name at least one model")
        if self.max_tokens_limit < 1 or self.max_body_bytes < 1 or self.status_refresh_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("max_tokens_limit, max_body_bytes must be >= 1; status_refresh_s, body_timeout_s > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RouterSpec:
        d = dict(d)
        for k in ("served_model_names", "api_key_sha256"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


def _stream_handle(handle: Any, transport: str) -> Any:
    """The streaming handle the router calls an engine deployment with (see :data:`ENGINE_TRANSPORTS`)."""
    if transport == "grpc":
        # Items are bytes and one small dict of primitives: plain pickle is enough and cheaper than
        # cloudpickle per item (errors raised by the replica are picklable classes of ours).
        return stream_handle(handle, by_reference=False,
                             request_serialization="pickle", response_serialization="pickle")
    return stream_handle(handle, by_reference=True)


def _error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return _error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind))


@api.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - last resort
    if _is_cancellation(exc):
        # Serve cancelled the request (client gone, or the response already complete): not an error.
        logger.debug("request cancelled in router for %s %s: %r", request.method, request.url.path, exc)
        return _error_response(ApiError(499, "the request was cancelled", "client_closed_request"))
    logger.exception("unhandled error in router for %s %s", request.method, request.url.path)
    return _error_response(ApiError(500, "internal error in the router; see the router's Serve logs", "server_error"))


def _is_cancellation(exc: BaseException) -> bool:
    """``asyncio.CancelledError`` or Ray's ``TaskCancelledError`` (what Serve's receive channel raises
    once Serve cancelled the request)."""
    from ray.exceptions import TaskCancelledError

    return isinstance(exc, (asyncio.CancelledError, TaskCancelledError))


class _RelayResponse(StreamingResponse):
    """A streaming response whose disconnect listener takes Serve's cancellation of the request's
    receive channel as the disconnect it is.

    Starlette listens for ``http.disconnect`` beside the stream and cancels the listener when the
    stream ends; under Serve that ``receive()`` is a call to the proxy that Serve cancels when the
    request finishes, and it raises ``TaskCancelledError`` instead of returning, which escaped as an
    unhandled router error after every stream it raced with.
    """

    async def listen_for_disconnect(self, receive: Any) -> None:
        try:
            await super().listen_for_disconnect(receive)
        except Exception as e:
            if not _is_cancellation(e):
                raise
            logger.debug("request receive channel cancelled by Serve (stream done or client gone): %r", e)

    async def stream_response(self, send: Any) -> None:
        """Close the relay as soon as the response stops, however it stops. A client that resets while
        ``send`` waits on a full socket cancels ``send``, not the relay, which would otherwise stay
        suspended at its ``yield`` until garbage collection: the engine stream kept running and the
        request counted late, as delivered."""
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


class Router:
    """Serve ingress class (wrapped by ``serve.ingress(api)`` and ``serve.deployment`` in
    :mod:`orchestrator.serve.app`).

    Args:
        spec: :meth:`RouterSpec.to_dict`.
        engines: engine deployment name -> Serve handle (Serve turns the bound deployments into handles).
    """

    def __init__(self, spec: Mapping[str, Any], engines: Mapping[str, Any]) -> None:
        from ray import serve

        self.spec = RouterSpec.from_dict(spec)
        table = parse(self.spec.table_json)
        if self.spec.default_max_tokens is not None:
            table = table.model_copy(update={"default_max_tokens": self.spec.default_max_tokens})
        self.table: RoutingTable = table
        self._handles = dict(engines)
        self._streams = {name: _stream_handle(h, self.spec.engine_transport) for name, h in engines.items()}
        # Simulated engines are labelled as such on every path (responses, /v1/models, /sim/info).
        self._all_simulated = all(c.simulated for c in table.distinct_configs().values())
        self._names = frozenset(self.spec.served_model_names)
        self._key_hashes = tuple(bytes.fromhex(h) for h in self.spec.api_key_sha256)
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._replicas: dict[str, int] = {name: 1 for name in engines}
        self._healthy: frozenset[str] = frozenset(engines)
        self._status_ok_at: float | None = None
        try:
            self._app_name = serve.get_replica_context().app_name
        except Exception:  # pragma: no cover - outside Serve
            self._app_name = None
        self._refresher: asyncio.Task[None] | None = None
        self._metrics: Any = None

    # ----- endpoints (registered on ``api`` below, outside the class) ------------------------------
    async def models(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except ApiError as e:
            return _error_response(e)
        created = int(time.time())
        data = [{"id": n, "object": "model", "created": created, "owned_by": "mtp-autotune"} for n in sorted(self._names)]
        return JSONResponse({"object": "list", "data": data}, headers=self._sim_headers())

    async def sim_info(self, request: Request) -> Response:
        """``GET /sim/info`` as the simulated engine answers it, when every engine is simulated: the
        time scale (one for all engines) and each engine deployment's own info. Clients (``python -m
        tuning.bench``) then report figures in simulated time, labelled SIMULATED. 404 with real
        engines, as a real engine answers.

        The engines' ``monotonic_start`` / ``boot_id`` are left out of the top level: each engine has
        its own clock, and the router re-frames their chunks, so a client times tokens by arrival."""
        try:
            self._authorize(request)
            if not self._all_simulated:
                raise ApiError(404, "GET /sim/info: this router's engines are not simulated", "not_found")
            names = sorted(self._handles)
            infos = await asyncio.wait_for(
                asyncio.gather(*(self._handles[n].sim_info.remote() for n in names)), timeout=30)
        except ApiError as e:
            return _error_response(e)
        except Exception as e:  # an engine did not answer: the router cannot say for it
            return _error_response(ApiError(503, f"GET /sim/info: an engine did not answer: {type(e).__name__}: "
                                                 f"{str(e)[:200]}", "service_unavailable", code="engine_unavailable"))
        engines = {n: info for n, info in zip(names, infos)}
        scales = {float(info["time_scale"]) for info in infos}
        if len(scales) != 1:  # never happens through deploy (one sim_time_scale per app)
            return _error_response(ApiError(409, f"GET /sim/info: the engines run at different time scales "
                                                 f"{sorted(scales)}; no one scale fits their figures", "conflict"))
        body = {
            "simulated": True,
            "via_router": True,
            "time_scale": scales.pop(),
            "delivery_quantum_s": max(float(i.get("delivery_quantum_s") or 0.0) for i in infos),
            "profile": ",".join(sorted({str(i.get("profile")) for i in infos})),
            "model_name": sorted(self._names)[0],
            "routing_table_version": self.table.version,
            "engines": engines,
        }
        return JSONResponse(body, headers=self._sim_headers())

    def _sim_headers(self) -> dict[str, str]:
        return {SIM_HEADER: "true"} if self._all_simulated else {}

    async def health(self) -> Response:
        self._ensure_background()
        healthy = sorted(self._healthy)
        body = {
            "status": "ok" if healthy else "unavailable",
            "routing_table_version": self.table.version,
            "healthy_deployments": healthy,
            "unhealthy_deployments": sorted(set(self._streams) - set(healthy)),
        }
        return JSONResponse(body, status_code=200 if healthy else 503)

    # ----- handle methods (deploy CLI, tests) -------------------------------------------------------
    async def deployed_spec(self) -> dict[str, Any]:
        """The spec this replica was built from (API keys only as SHA-256)."""
        return self.spec.to_dict()

    async def route_state(self) -> dict[str, Any]:
        """Live view of what the policy sees: load per replica, replicas, healthy set."""
        self._ensure_background()
        return {
            "in_flight": dict(self._in_flight),
            "load_per_replica": self._load(),
            "replicas": dict(self._replicas),
            "healthy": sorted(self._healthy),
            "table_version": self.table.version,
            "status_age_s": None if self._status_ok_at is None else round(time.monotonic() - self._status_ok_at, 3),
        }

    # ----- request path ----------------------------------------------------------------------------
    async def _handle(self, request: Request, kind: str) -> Response:
        started = time.perf_counter()
        self._ensure_background()
        try:
            self._authorize(request)
            raw = await self._read_body(request)
            parsed = parse_request(
                raw, kind,  # type: ignore[arg-type]
                served_model_names=self._names,
                max_tokens_limit=self.spec.max_tokens_limit,
                max_body_bytes=self.spec.max_body_bytes,
            )
        except ApiError as e:
            self._metrics.errors.inc(tags={"kind": f"client_{e.status}"})
            return _error_response(e)
        return await self._forward(parsed, started)

    def _authorize(self, request: Request) -> None:
        if not self._key_hashes:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(
                401, "missing API key: send it as 'Authorization: Bearer <key>'",
                code="invalid_api_key", headers={"www-authenticate": "Bearer"},
            )
        # Compare digests of equal length against every key, without early exit: the time taken
        # says nothing about how close a guess was, or which key matched.
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        ok = False
        for known in self._key_hashes:
            ok |= hmac.compare_digest(digest, known)
        if not ok:
            raise ApiError(401, "incorrect API key provided", code="invalid_api_key", headers={"www-authenticate": "Bearer"})

    async def _read_body(self, request: Request) -> bytes:
        limit = self.spec.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is {declared} bytes; the limit is {limit} bytes", code="request_too_large")
        size, parts = 0, []

        async def read() -> None:
            nonlocal size
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
                parts.append(part)

        try:
            await asyncio.wait_for(read(), timeout=self.spec.body_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {self.spec.body_timeout_s:g} s "
                f"({size} bytes received); send the whole body at once", code="request_timeout",
                headers={"connection": "close"},
            ) from None
        return b"".join(parts)

    async def _forward(self, parsed: ParsedRequest, started: float) -> Response:
        body = dict(parsed.body)
        inject_usage = parsed.stream and not parsed.client_wants_usage
        if parsed.stream:
            # Ask for the usage chunk so output tokens are counted exactly; dropped again below when
            # the client did not ask for it.
            options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
            body["stream_options"] = {**options, "include_usage": True}
        payload = encode_body(body)
        path = _PATHS[parsed.kind]
        failed: set[str] = set()
        last_error = "no engine deployment was tried"
        for _ in range(len(self._streams) + 1):
            try:
                decision = choose_route(parsed.max_tokens, self.table, self._load(), self._healthy - failed,
                                        temperature=parsed.temperature)
            except NoHealthyDeploymentError as e:
                last_error = str(e) if not failed else f"{e}; last failure: {last_error}"
                break
            dep = decision.deployment
            self._track(dep, +1)
            gen = self._streams[dep].generate.remote(path, payload)
            try:
                head = await self._first_chunk(gen, dep)
                status = int(head["status"])
                if status >= 500:
                    raise RuntimeError(f"engine answered HTTP {status}")
            except Exception as e:  # the engine never answered: try elsewhere, client saw nothing
                gen.cancel()
                self._track(dep, -1)
                failed.add(dep)
                last_error = f"{dep}: {type(e).__name__}: {str(e)[:300]}"
                logger.warning("engine deployment %s failed before the first byte; rerouting (%s)", dep, last_error)
                self._metrics.errors.inc(tags={"kind": "engine_unavailable"})
                continue
            return await self._respond(parsed, decision, gen, head, started, inject_usage)
        self._metrics.errors.inc(tags={"kind": "no_healthy_engine"})
        return _error_response(
            ApiError(503, f"no engine can take the request now: {last_error}", "service_unavailable",
                     code="no_healthy_engine", headers={"retry-after": "5"})
        )

    async def _first_chunk(self, gen: Any, deployment: str) -> Any:
        """The engine's first chunk; raises as soon as ``deployment`` has no running replica left.

        Serve's handle holds a request for a deployment whose replicas all died (a lost node) until a
        replacement replica is up (an LMDeploy model load: minutes), while another bucket's engine
        could answer now: the caller reroutes on the error, as for an engine that failed."""
        first = asyncio.ensure_future(gen.__anext__())
        while True:
            done, _ = await asyncio.wait({first}, timeout=self.spec.status_refresh_s)
            if done:
                return first.result()
            if deployment not in self._healthy:
                first.cancel()
                raise RuntimeError(f"{deployment} has no running replica (lost while the request waited)")

    async def _respond(
        self, parsed: ParsedRequest, d: RouteDecision, gen: Any, head: Mapping[str, Any], started: float, inject_usage: bool
    ) -> Response:
        headers = {
            "x-route-bucket": d.bucket,
            "x-route-deployment": d.deployment,
            "x-route-reason": d.reason,
            "x-route-cell": d.cell,
            "x-routing-table-version": str(self.table.version),
        }
        if head.get("simulated"):
            headers[SIM_HEADER] = "true"  # the engine's marker, passed on
        if d.fallback_header:
            headers["x-route-fallback"] = d.fallback_header
            self._metrics.fallbacks.inc(tags={"from_bucket": d.fallback_from or "", "to_bucket": d.bucket})
        status = int(head["status"])
        tags = {"bucket": d.bucket, "engine": d.deployment, "cell": d.cell}
        first = head.get("first") or b""
        if parsed.stream and status == 200:
            relay = self._relay(gen, first, d, tags, started, inject_usage)
            return _RelayResponse(relay, status_code=200, media_type="text/event-stream", headers=headers)
        # Not streamed (or an engine 4xx): the body is one JSON document, sent when complete.
        chunks: list[bytes] = [first]
        try:
            async for chunk in gen:
                chunks.append(chunk)
        except asyncio.CancelledError:  # the client left before the whole body was ready
            gen.cancel()
            self._metrics.requests.inc(tags={**tags, "status": "499"})
            raise
        except Exception as e:
            self._metrics.errors.inc(tags={"kind": "engine_failed_mid_response"})
            self._metrics.requests.inc(tags={**tags, "status": "502"})
            return _error_response(ApiError(502, f"engine {d.deployment} failed mid-response: {type(e).__name__}", "server_error",
                                            code="engine_failed", headers=headers))
        finally:
            self._track(d.deployment, -1)
        content = b"".join(chunks)
        self._metrics.requests.inc(tags={**tags, "status": str(status)})
        if status == 200:
            tokens = _completion_tokens(content)
            if tokens:
                self._metrics.output_tokens.inc(tokens, tags=tags)
        else:
            self._metrics.errors.inc(tags={"kind": f"engine_{status}"})
        return Response(content, status_code=status, media_type=str(head.get("content_type") or "application/json"), headers=headers)

    async def _relay(
        self, gen: Any, first: bytes, d: RouteDecision, tags: dict[str, str], started: float, inject_usage: bool
    ) -> AsyncIterator[bytes]:
        """Forward SSE events as soon as each is complete; count tokens from the usage chunk."""
        pending = b""
        first_at = last_at = None
        tokens: int | None = None
        content_events = 0
        status = "200"
        finished = False
        delivered = False  # the client has every event up to [DONE]: what happens after is no client's leaving
        try:
            async for chunk in _prepend(first, gen):
                now = time.perf_counter()
                if first_at is None:
                    first_at = now
                    self._metrics.ttft.observe(now - started, tags=tags)
                last_at = now
                pending += chunk
                if b"\n\n" not in pending:
                    continue
                complete, _, pending = pending.rpartition(b"\n\n")
                out, n_content, usage_tokens = _process_events(complete, inject_usage)
                content_events += n_content
                if usage_tokens is not None:
                    tokens = usage_tokens
                if out:
                    yield out
                    delivered = delivered or _ends_stream(out)
            if pending:
                out, n_content, usage_tokens = _process_events(pending, inject_usage)
                content_events += n_content
                tokens = usage_tokens if usage_tokens is not None else tokens
                if out:
                    yield out
            finished = True
        except (asyncio.CancelledError, GeneratorExit):
            # Cancelled while waiting on the engine, or closed at a yield: the client left, unless it
            # already had the whole stream (it may close right after [DONE], before the engine's end).
            status = "200" if delivered else "499"
            raise
        except Exception as e:
            status = "502"
            self._metrics.errors.inc(tags={"kind": "engine_failed_mid_stream"})
            err = ApiError(502, f"engine {d.deployment} failed mid-stream: {type(e).__name__}", "server_error", code="engine_failed")
            yield b"event: error\ndata: " + json.dumps(err.body()).encode() + b"\n\n"
        finally:
            if not finished:
                gen.cancel()
            self._track(d.deployment, -1)
            self._metrics.requests.inc(tags={**tags, "status": status})
            n = tokens if tokens is not None else content_events
            if n:
                self._metrics.output_tokens.inc(n, tags=tags)
            if n and n > 1 and first_at is not None and last_at is not None and last_at > first_at:
                self._metrics.tpot.observe((last_at - first_at) / (n - 1), tags=tags)

    # ----- live state ------------------------------------------------------------------------------
    def _track(self, deployment: str, delta: int) -> None:
        self._in_flight[deployment] += delta
        self._metrics.in_flight.set(self._in_flight[deployment], tags={"engine": deployment})

    def _load(self) -> dict[str, float]:
        return {name: n / max(1, self._replicas.get(name, 1)) for name, n in self._in_flight.items()}

    def _ensure_background(self) -> None:
        if self._metrics is None:
            from orchestrator.serve.metrics import RouterMetrics

            self._metrics = RouterMetrics()
        if self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_status())

    async def _refresh_status(self) -> None:
        """Keep the healthy set and replica counts current from Serve's controller."""
        from ray import serve

        while True:
            try:
                status = await asyncio.to_thread(serve.status)
                app = status.applications.get(self._app_name) if self._app_name else None
                healthy, replicas = set(), {}
                for name in self._streams:
                    overview = app.deployments.get(name) if app else None
                    running = 0
                    if overview is not None:
                        for state, count in overview.replica_states.items():
                            if getattr(state, "value", state) == "RUNNING":
                                running = int(count)
                    replicas[name] = running
                    if running > 0:
                        healthy.add(name)
                self._healthy, self._replicas = frozenset(healthy), replicas
                self._status_ok_at = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep the last known state; the call-failure path still reroutes
                logger.warning("router could not refresh deployment status: %r", e)
            await asyncio.sleep(self.spec.status_refresh_s)

    def __del__(self) -> None:
        task = getattr(self, "_refresher", None)
        if task is not None:
            task.cancel()


# Routes are module-level functions that look up the replica's Router instance, not methods under
# ``@serve.ingress``: Serve's class-based-view rewrite of method signatures is not seen by FastAPI
# >= 0.137 (it nests included routers and keeps the dependants computed at decoration time), which
# turns ``self`` into a required query parameter and answers every call with 422.
def _router() -> Router:
    from ray import serve

    return serve.get_replica_context().servable_object


@api.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _router()._handle(request, "chat")


@api.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _router()._handle(request, "completions")


@api.get("/v1/models")
async def models(request: Request) -> Response:
    return await _router().models(request)


@api.get("/sim/info")
async def sim_info(request: Request) -> Response:
    return await _router().sim_info(request)


@api.get("/health")
async def health() -> Response:
    return await _router().health()


def _process_events(block: bytes, inject_usage: bool) -> tuple[bytes, int, int | None]:
    """Complete SSE events -> (bytes to forward, content events, completion tokens from usage).

    Only events that carry a usage object are parsed (one per stream), so the per-token cost is a
    substring test. When the router injected ``include_usage`` the usage-only chunk is dropped and a
    usage field on a content chunk is nulled, so the client gets what it asked for.
    """
    out: list[bytes] = []
    n_content = 0
    tokens: int | None = None
    for event in block.split(b"\n\n"):
        if not event.strip():
            continue
        if b'"usage"' in event and b'"usage":null' not in event and b'"usage": null' not in event:
            data = _sse_data(event)
            try:
                obj = json.loads(data) if data is not None else None
            except ValueError:
                obj = None
            usage = obj.get("usage") if isinstance(obj, dict) else None
            if isinstance(usage, dict):
                ct = usage.get("completion_tokens")
                if isinstance(ct, int):
                    tokens = ct
                if inject_usage:
                    if not obj.get("choices"):
                        continue
                    obj["usage"] = None
                    event = b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8")
                    n_content += 1
                    out.append(event + b"\n\n")
                    continue
        if event.startswith(b"data:") and not event.startswith(b"data: [DONE]"):
            n_content += 1
        out.append(event + b"\n\n")
    return b"".join(out), n_content, tokens


async def _prepend(first: bytes, gen: Any) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in gen:
        yield chunk


def _ends_stream(block: bytes) -> bool:
    """Whether forwarded events end the OpenAI stream (its ``data: [DONE]`` event)."""
    return block.rstrip().endswith(b"data: [DONE]")


def _sse_data(event: bytes) -> bytes | None:
    lines = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _completion_tokens(content: bytes) -> int | None:
    try:
        usage = json.loads(content).get("usage") or {}
        ct = usage.get("completion_tokens")
        return ct if isinstance(ct, int) else None
    except (ValueError, AttributeError):
        return None
