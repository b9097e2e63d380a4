"""`EngineReplica`: a Serve deployment whose every replica owns one engine process.

One replica = one :class:`~orchestrator.engine.EngineProcess` bound to ``127.0.0.1`` inside the
replica's actor, on the GPUs Ray reserved for it (``ray_actor_options={"num_gpus": tp}``;
``ray.get_gpu_ids()`` -> ``EngineProcess(gpus=...)`` -> ``CUDA_VISIBLE_DEVICES``). The router
reaches the engine only through this replica (a Serve handle call that streams raw response bytes),
so Serve's replica health, autoscaling and draining apply to the engine.

Lifecycle, as Ray Serve 2.60 drives it (``ray/serve/_private/replica.py``):

- **start**: ``__init__`` starts the engine and blocks until it answers ``/v1/models``; Serve marks
  the replica RUNNING only after the constructor returns, so no request reaches a loading engine.
- **health**: Serve calls :meth:`check_health` every ``health_check_period_s``; it raises when the
  engine process died or stopped answering, Serve then marks the replica unhealthy, stops routing to
  it, and starts a replacement.
- **stop**: on scale-down, update or deletion Serve first drains the replica (waits until its
  ongoing requests — including streams in progress — finish, bounded by
  ``graceful_shutdown_timeout_s``), then calls the user ``__del__`` exactly once
  (``UserCallableWrapper.call_destructor``), which stops the engine's whole process group and so
  frees its GPUs before the actor exits. If the actor is force-killed instead (``ray.kill``, the
  graceful timeout exceeded, ``ray stop``), ``__del__`` never runs; the engine lives in a session of
  its own and would keep its GPUs, so each replica also starts a tiny *reaper* process that stops the
  engine's process group as soon as the replica's process is gone.

LMDeploy with ``tp > 1``: :func:`orchestrator.engine.engine_argv` adds
``--distributed-executor-backend mp``. Without it LMDeploy may choose its Ray executor, which joins
*our* Ray cluster from inside this actor and creates placement groups of its own — GPUs outside the
reservation Serve made for this replica (or a deadlock waiting for GPUs this replica already holds).
The ``mp`` executor forks its TP workers on exactly the GPUs in ``CUDA_VISIBLE_DEVICES``, and they
are in the engine's process group, so :meth:`EngineProcess.stop` takes them down too.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from orchestrator.config import EngineConfig
from orchestrator.errors import EngineDiedError, EngineNotReadyError, OrchestratorError
from orchestrator.serve.metrics import (
    ESTIMATE_WINDOW_S,
    AcceptLengthTracker,
    EngineMetrics,
    drafting_sequences,
    parse_prometheus_text,
)
from orchestrator.sim.gpu_share import SHARED_GPU_ENV
from orchestrator.sim.server import SIM_HEADER

__all__ = ["EngineReplica", "EngineUnavailableError", "default_log_dir"]

logger = logging.getLogger("ray.serve")


class EngineUnavailableError(OrchestratorError, RuntimeError):
    """The replica's engine cannot take a request (dead, or did not answer). Raised *before* the
    first item of a stream, so the router can send the request elsewhere."""


_REAPER = """
import os, signal, sys, time
replica, group = int(sys.argv[1]), int(sys.argv[2])
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
def group_alive():
    try:
        os.killpg(group, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
while alive(replica) and group_alive():
    time.sleep(0.5)
if group_alive():
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive():
        os.killpg(group, signal.SIGKILL)
"""


def _spawn_reaper(replica_pid: int, engine_pgid: int | None) -> subprocess.Popen[bytes] | None:
    """Start the process that stops the engine group once the replica process has died (see the
    module docstring). It polls twice a second and exits with the engine; no Python imports beyond
    the standard library, so it costs a few MB."""
    if engine_pgid is None:
        return None
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(replica_pid), str(engine_pgid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )


def default_log_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "mtp-autotune", "engine-logs")


class EngineReplica:
    """Serve deployment class (wrapped with ``serve.deployment`` by :mod:`orchestrator.serve.app`).

    Args:
        config: the engine config as a dict (``EngineConfig.to_dict()``; dicts pickle stably).
        served_model_name: the model name the engine answers to.
        log_dir: where engine logs go (one file per engine process).
        sim_time_scale: simulator ``--time-scale`` (backend ``sim`` only).
        ready_timeout_s: how long the engine may take to load.
        health_timeout_s: per-check timeout of the engine's ``/health``; keep it below the
            deployment's ``health_check_timeout_s``.
        metrics_poll_s: how often the replica scrapes the engine's ``/metrics``.
        accept_length_low_threshold: the ``mtp_engine_accept_length_low`` gauge is 1 when the engine's
            estimated tokens per step (``mtp_engine_tokens_per_step_estimate``) is below this.
        accept_length_window_s: how far back that estimate looks.
        sim_shared_gpu: the directory of the simulated GPU this engine shares with others (backend ``sim``
            only; :mod:`orchestrator.sim.gpu_share`): engines busy on it at once slow each other.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        served_model_name: str,
        log_dir: str | None = None,
        sim_time_scale: float | None = None,
        ready_timeout_s: float = 1800.0,
        health_timeout_s: float = 5.0,
        metrics_poll_s: float = 5.0,
        accept_length_low_threshold: float = 1.5,
        accept_length_window_s: float = ESTIMATE_WINDOW_S,
        sim_shared_gpu: str | None = None,
    ) -> None:
        import ray

        from orchestrator.engine import EngineProcess

        self.config = EngineConfig.from_dict(config)
        self.key = self.config.key()
        gpus: list[int] | None = None
        if not self.config.simulated:
            ids = ray.get_gpu_ids()
            if len(ids) != self.config.tp:
                raise EngineNotReadyError(
                    f"replica for {self.key} was given GPUs {ids} but the config needs tp={self.config.tp}; "
                    "deploy with ray_actor_options num_gpus equal to tp (orchestrator.serve.app does this)"
                )
            gpus = [int(g) for g in ids]
        self._health_timeout_s = float(health_timeout_s)
        self._metrics_poll_s = float(metrics_poll_s)
        self._threshold = float(accept_length_low_threshold)
        self._accept_window_s = float(accept_length_window_s)
        self.engine = EngineProcess(
            self.config,
            gpus=gpus,
            host="127.0.0.1",
            log_dir=Path(log_dir or default_log_dir()),
            ready_timeout_s=ready_timeout_s,
            served_model_name=served_model_name,
            sim_time_scale=sim_time_scale if self.config.simulated else None,
            env={SHARED_GPU_ENV: sim_shared_gpu} if sim_shared_gpu and self.config.simulated else None,
        )
        self.engine.start()
        try:
            self.engine.wait_until_ready()
        except BaseException:
            self.engine.stop()
            raise
        self._gpus = gpus
        self._reaper = _spawn_reaper(os.getpid(), self.engine.pid)
        self._session: Any = None
        self._poller: asyncio.Task[None] | None = None
        self._names = self.config.engine.metrics_for(self.config)
        self._accept = AcceptLengthTracker.for_poll(self.config.num_draft_tokens, self._metrics_poll_s, self._names,
                                                   window_s=self._accept_window_s)
        # Sequences that could draft, of requests the engine answered (ended or cut off): the tracker's divisor.
        self._sequences_answered = 0
        self._metrics_scrapes = 0  # successful scrapes of the engine's /metrics
        self._metrics: EngineMetrics | None = None
        self._last_samples: dict[str, float] = {}
        logger.info("engine %s ready at %s (pid %s, gpus %s)", self.key, self.engine.base_url, self.engine.pid, gpus)

    # ----- request path ----------------------------------------------------------------------------
    async def generate(self, path: str, body: bytes) -> AsyncIterator[Any]:
        """Forward one request; yields ``{"status", "content_type", "first"}`` once the engine sent its
        first body bytes, then the rest of the body as raw byte chunks, each as soon as it arrives
        (no buffering).

        One item is *everything the engine had sent* when the generator resumed (``readany``): events
        that arrived together travel as one handle item, so the per-item cost of Serve's stream (the
        dominant per-token cost of the router path) is paid once for them; nothing ever waits for more
        bytes to fill an item. Items are not aligned to SSE events; the router re-frames them.

        Raises :class:`EngineUnavailableError` before the first item when the engine can't be
        reached, so the router may retry another deployment without the client seeing anything.
        """
        import aiohttp

        self._ensure_background()
        if not self.engine.is_alive():
            raise EngineUnavailableError(f"engine {self.key} is not running (exit code {self.engine.returncode})")
        try:
            resp = await self._session.post(
                self.engine.base_url + path, data=body, headers={"content-type": "application/json"}
            )
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise EngineUnavailableError(f"engine {self.key} at {self.engine.base_url} unreachable: {e!r}") from None
        finished = answered = False
        try:
            # The head travels with the first body chunk (for a stream: the first token): one Serve
            # stream item less per request, and a failure before the first token is still reroutable.
            try:
                first = await resp.content.readany()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                raise EngineUnavailableError(f"engine {self.key} failed before the first byte: {e!r}") from None
            answered = resp.status < 400
            yield {"status": resp.status, "content_type": resp.headers.get("content-type", "application/json"),
                   "first": first, "simulated": resp.headers.get(SIM_HEADER, "").lower() == "true"}
            async for chunk in resp.content.iter_any():
                yield chunk
            finished = True
        finally:
            # Cut the connection when the caller went away mid-stream, so the engine aborts the
            # generation instead of finishing it for nobody.
            resp.release() if finished else resp.close()
            # The engine's spec-decode counters saw this request's outputs, cut off or not (a refused
            # request drafted nothing): the accept-length tracker divides the counted drafts by its
            # sequences. Parsed after the response, so the client never waits for it.
            if answered:
                self._sequences_answered += drafting_sequences(body)

    async def sim_info(self) -> dict[str, Any] | None:
        """The simulated engine's ``GET /sim/info`` (time scale, profile, counters); ``None`` for a real
        engine. The router answers its own ``/sim/info`` from these, so clients benchmarking through
        it know the figures are simulated and how to scale them."""
        if not self.config.simulated:
            return None
        async with self._session.get(self.engine.base_url + "/sim/info") as resp:
            resp.raise_for_status()
            return await resp.json()

    async def engine_info(self) -> dict[str, Any]:
        """Where this replica's engine is and how it is doing (tests and operators use it)."""
        return {
            "config_key": self.key,
            "base_url": self.engine.base_url,
            "pid": self.engine.pid,
            "alive": self.engine.is_alive(),
            "gpus": self._gpus,
            "log_path": str(self.engine.log_path),
            "accept_length": self._accept.accept_length,
            "tokens_per_step_estimate": self._accept.tokens_per_step_estimate,
            "outputs_per_request": self._accept.outputs_per_request,
            "sequences_answered": self._sequences_answered,
            "metrics_scrapes": self._metrics_scrapes,
            "engine_metrics": dict(self._last_samples),
        }

    # ----- Serve hooks -----------------------------------------------------------------------------
    async def check_health(self) -> None:
        """Serve's health check: raise when the engine died or hangs (Serve then replaces us)."""
        self._ensure_background()
        if not self.engine.is_alive():
            raise EngineDiedError(
                f"engine {self.key} exited (code {self.engine.returncode}); replica unhealthy",
                log_tail=self.engine.log_tail(20),
            )
        await asyncio.to_thread(self.engine.check_health, self._health_timeout_s)

    def __del__(self) -> None:
        """Called once by Serve after draining (see the module docstring); stops the engine group."""
        poller = getattr(self, "_poller", None)
        if poller is not None:
            poller.cancel()
        session = getattr(self, "_session", None)
        if session is not None and not session.closed:
            with contextlib.suppress(Exception):
                # Closing an aiohttp connector only releases sockets; safe without awaiting.
                session.connector.close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()
        reaper = getattr(self, "_reaper", None)
        if reaper is not None and reaper.poll() is None:
            reaper.kill()
            reaper.wait(timeout=5)

    # ----- background: session + metrics poller ----------------------------------------------------
    def _ensure_background(self) -> None:
        if self._session is None:
            import aiohttp

            # One pooled session per replica; no overall timeout (generations can be long), but
            # connecting must be quick: the engine is on 127.0.0.1.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_connect=10.0),
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                auto_decompress=False,
            )
        if self._poller is None:
            self._metrics = EngineMetrics(self.key)
            self._poller = asyncio.get_running_loop().create_task(self._poll_metrics())

    async def _poll_metrics(self) -> None:
        assert self._metrics is not None
        m, tags = self._metrics, self._metrics.tags
        while True:
            started = time.monotonic()
            try:
                # The session passes generation bytes through undecoded (auto_decompress=False), and
                # LMDeploy's /metrics gzips when asked (aiohttp asks by default): ask for plain text.
                async with self._session.get(self.engine.base_url + "/metrics",
                                             headers={"Accept-Encoding": "identity"}) as resp:
                    text = await resp.text()
                samples = parse_prometheus_text(text)
                self._last_samples = samples
                m.scrape_errors.set(1, tags=tags)
                if self._names.running in samples:
                    m.running.set(samples[self._names.running], tags=tags)
                if self._names.waiting in samples:
                    m.waiting.set(samples[self._names.waiting], tags=tags)
                value = self._accept.update(samples, self._sequences_answered)
                if value is not None:
                    m.accept_length.set(value, tags=tags)
                if self._accept.tokens_per_step_estimate is not None:
                    m.tokens_per_step_estimate.set(self._accept.tokens_per_step_estimate, tags=tags)
                    m.accept_length_low.set(1 if self._accept.low(self._threshold) else 0, tags=tags)
                self._metrics_scrapes += 1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failed scrape must never take the replica down
                m.scrape_errors.set(0, tags=tags)
                logger.debug("scrape of %s/metrics failed: %r", self.engine.base_url, e)
            await asyncio.sleep(max(0.1, self._metrics_poll_s - (time.monotonic() - started)))
