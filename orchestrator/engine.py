"""`EngineProcess`: one engine server (any engine family, or the simulator) as a child process we own.

The process handling is here and the same for every engine; what differs between engines (command
line, environment, readiness path, health path) the config's backend says
(:mod:`orchestrator.backends`).

Modelled on vLLM's benchmark server process: the engine starts in a *new session* so that it and
every worker it forks (LMDeploy's tensor-parallel workers hold the GPU memory) share one process
group, and stopping means ``killpg`` of that group — SIGTERM, a grace period, then SIGKILL — and
then waiting until the group is empty, so the GPUs are free when :meth:`EngineProcess.stop`
returns. Readiness is polled over HTTP and fails fast when the process has died, with its exit code
and the end of its log in the error.

The class installs no signal handlers and relies on no ``__del__``: it is safe inside Ray actors
(which own signals) and every caller stops what it starts, usually through ``with``. The config is a
frozen dataclass and pickles; the process handle itself is not meant to cross processes.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from orchestrator.config import EngineConfig
from orchestrator.errors import (
    ConfigError,
    EngineDiedError,
    EngineNotReadyError,
    PreflightError,
)
from orchestrator.ports import find_free_port, port_is_free, wait_for_port_free

__all__ = [
    "EngineProcess",
    "engine_argv",
    "find_free_port",
    "port_is_free",
    "wait_for_port_free",
]

logger = logging.getLogger(__name__)

_ADDRESS_IN_USE_MARKERS = ("address already in use", "errno 98", "eaddrinuse")
_POLL_INTERVAL_S = 0.25
_MAX_POLL_INTERVAL_S = 2.0
_GROUP_GONE_AFTER_KILL_S = 15.0
HEALTH_CHECK_TIMEOUT_S = 5.0
"""How long :meth:`EngineProcess.check_health` waits for an answer by default."""
STOP_GRACE_S = 30.0
"""How long :meth:`EngineProcess.stop` waits after SIGTERM before SIGKILL: an engine that answers gets
time to finish its graceful shutdown."""
UNRESPONSIVE_STOP_GRACE_S = 3.0
"""The same wait for an engine whose last health check went unanswered: its graceful shutdown waits on
requests that never finish, so a long grace only keeps its GPU memory held."""


def engine_argv(
    config: EngineConfig,
    *,
    host: str,
    port: int,
    served_model_name: str | None = None,
    sim_time_scale: float | None = None,
    sim_fault: str | None = None,
) -> list[str]:
    """The full command line :class:`EngineProcess` runs: :meth:`EngineConfig.command` (the backend's)
    plus what the process owner adds to a simulated engine: ``--time-scale S`` and ``--fault SPEC``."""
    argv = config.command(host=host, port=port, served_model_name=served_model_name)
    if config.simulated:
        if sim_time_scale is not None:
            if not sim_time_scale > 0:
                raise ConfigError(f"sim_time_scale={sim_time_scale!r} is invalid; allowed: > 0")
            argv += ["--time-scale", f"{sim_time_scale:g}"]
        if sim_fault:
            argv += ["--fault", sim_fault]
    elif sim_time_scale is not None or sim_fault:
        raise ConfigError(
            f"sim_time_scale / sim_fault apply to backend='sim' only, not {config.backend!r}"
        )
    return argv


class EngineProcess:
    """An engine server process: start on given GPUs and a free port, wait until it answers, stop
    its whole process group.

    Args:
        config: what to run.
        gpus: GPU indices for ``CUDA_VISIBLE_DEVICES`` (real engines; must be ``config.tp`` of
            them). ``None`` inherits the caller's environment (e.g. what Ray set for an actor). The
            simulator always gets ``CUDA_VISIBLE_DEVICES=""``: it uses no GPU.
        port: port to serve on; ``None`` picks a free one (and retries once on a fresh port if the
            engine loses the race for it).
        host: interface the engine binds and we connect to.
        log_dir: folder for the engine's stdout+stderr, ``<config.key()>-<port>.log``.
        ready_timeout_s: how long :meth:`wait_until_ready` waits for ``GET /v1/models``.
        served_model_name: ``--model-name`` for the engine (the name clients send).
        sim_time_scale: simulator ``--time-scale`` (backend ``sim`` only).
        sim_fault: simulator ``--fault`` spec, e.g. ``crash-after:30`` (backend ``sim`` only).
        env: extra environment variables for the engine.
        preflight: run :func:`orchestrator.preflight.preflight` before starting.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        gpus: Sequence[int] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_dir: str | Path,
        ready_timeout_s: float = 600.0,
        served_model_name: str | None = None,
        sim_time_scale: float | None = None,
        sim_fault: str | None = None,
        env: Mapping[str, str] | None = None,
        preflight: bool = True,
    ) -> None:
        if not isinstance(config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {type(config).__name__}")
        if gpus is not None and not config.simulated:
            gpus = [int(g) for g in gpus]
            if len(gpus) != config.tp or len(set(gpus)) != len(gpus) or min(gpus) < 0:
                raise ConfigError(
                    f"gpus={gpus} is invalid for tp={config.tp}; pass exactly {config.tp} distinct "
                    f"non-negative GPU indices (or gpus=None to inherit CUDA_VISIBLE_DEVICES)"
                )
        if not ready_timeout_s > 0:
            raise ConfigError(f"ready_timeout_s={ready_timeout_s!r} is invalid; allowed: > 0")
        self.config = config
        self.host = host
        self.gpus: tuple[int, ...] | None = tuple(gpus) if gpus is not None else None
        self.log_dir = Path(log_dir)
        self.ready_timeout_s = float(ready_timeout_s)
        self.served_model_name = served_model_name
        self.sim_time_scale = sim_time_scale
        self.sim_fault = sim_fault
        self.extra_env = dict(env or {})
        self.run_preflight = preflight
        self._port_was_chosen = port is None
        self.port = int(port) if port is not None else find_free_port(host)
        # Validate sim-only arguments now, not at start().
        engine_argv(
            config, host=host, port=self.port, served_model_name=served_model_name,
            sim_time_scale=sim_time_scale, sim_fault=sim_fault,
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._retried_port = False
        self._stopped = False
        self._unresponsive = False
        self._lock = threading.RLock()

    # ----- identity --------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.config.key()}-{self.port}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has exited (negative: killed by that signal), else ``None``."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def argv(self) -> list[str]:
        return engine_argv(
            self.config, host=self.host, port=self.port, served_model_name=self.served_model_name,
            sim_time_scale=self.sim_time_scale, sim_fault=self.sim_fault,
        )

    def __repr__(self) -> str:
        state = "not started" if self._proc is None else ("alive" if self.is_alive() else f"exited {self.returncode}")
        return f"EngineProcess({self.config.label()}, {self.base_url}, pid={self.pid}, {state})"

    # ----- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Run preflight, then start the engine in a new session with its output in :attr:`log_path`.

        Returns as soon as the process exists; call :meth:`wait_until_ready` (or use ``with``).
        """
        with self._lock:
            if self._proc is not None:
                raise EngineDiedError(f"{self!r} was already started; create a new EngineProcess")
            if self.run_preflight:
                from orchestrator.preflight import preflight

                preflight(self.config, env=self.extra_env)
            self._spawn()

    def _spawn(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = self.argv
        env = self._environment()
        logger.info("starting engine %s on %s (log %s)", self.config.label(), self.base_url, self.log_path)
        with open(self.log_path, "ab") as log:
            log.write(f"# {' '.join(argv)}\n".encode())
            log.flush()
            try:
                self._proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True, close_fds=True,
                )
            except FileNotFoundError as exc:
                raise PreflightError(
                    f"cannot start the engine: {argv[0]!r} not found ({exc}). Check the Python "
                    f"environment on this node and install the engine there ({self.config.engine.package}; "
                    f"docs/gpu.md)."
                ) from None
        self._stopped = False
        self._unresponsive = False

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach the file (and our error messages) as they happen
        env.update(self.config.engine.environment(self.config, self.gpus, env))
        return env

    def wait_until_ready(self) -> None:
        """Poll the backend's readiness path (``GET /v1/models``) until it answers 200.

        Raises:
            EngineDiedError: the process exited first (exit code and log tail attached).
            EngineNotReadyError: no answer within ``ready_timeout_s``; the engine is stopped first,
                so nothing is left running.
        """
        proc = self._require_started()
        deadline = time.monotonic() + self.ready_timeout_s
        interval = _POLL_INTERVAL_S
        while True:
            if proc.poll() is not None:
                if self._should_retry_port():
                    proc = self._restart_on_new_port()
                    deadline = time.monotonic() + self.ready_timeout_s
                    continue
                raise self._died_error("engine exited before it was ready")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._http_ok(self.config.engine.readiness_path, timeout_s=min(5.0, max(0.5, remaining))):
                logger.info("engine %s ready at %s", self.config.label(), self.base_url)
                return
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            interval = min(interval * 1.5, _MAX_POLL_INTERVAL_S)
        tail = self.log_tail()
        self.stop()
        raise EngineNotReadyError(
            f"engine {self.config.label()} at {self.base_url} did not answer GET "
            f"{self.config.engine.readiness_path} within "
            f"{self.ready_timeout_s:g} s and was stopped; raise ready_timeout_s if the model is still "
            f"loading, otherwise see {self.log_path}",
            log_tail=tail,
        )

    def _should_retry_port(self) -> bool:
        """Restart once on a new port if we picked the port and another process took it meanwhile."""
        if not self._port_was_chosen or self._retried_port:
            return False
        tail = self.log_tail(lines=80).lower()
        return any(marker in tail for marker in _ADDRESS_IN_USE_MARKERS)

    def _restart_on_new_port(self) -> subprocess.Popen[bytes]:
        old_port = self.port
        self._retried_port = True
        self.stop()
        self._proc = None
        self.port = find_free_port(self.host)
        logger.warning("engine lost port %d to another process; restarting on port %d", old_port, self.port)
        self._spawn()
        return self._require_started()

    def check_health(self, timeout_s: float = HEALTH_CHECK_TIMEOUT_S) -> None:
        """The backend's health path (``GET /health``; its readiness path when the engine answers 404
        there) within ``timeout_s``.

        Raises:
            EngineDiedError: the process has exited.
            EngineNotReadyError: it is alive but does not answer (hung or overloaded).
        """
        proc = self._require_started()
        if proc.poll() is not None:
            raise self._died_error("engine is not running")
        status = self._http_status(self.config.engine.health_path, timeout_s)
        if status == 404:
            status = self._http_status(self.config.engine.readiness_path, timeout_s)
        if status == 200:
            self._unresponsive = False
            return
        if proc.poll() is not None:  # died while we were asking
            raise self._died_error("engine is not running")
        self._unresponsive = True
        what = "did not answer" if status is None else f"answered HTTP {status}"
        raise EngineNotReadyError(
            f"engine {self.config.label()} at {self.base_url} {what} to a health check within "
            f"{timeout_s:g} s (process {proc.pid} is alive); it may be hung — stop and restart it",
            log_tail=self.log_tail(),
        )

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout_s``, and return once the
        group is gone (LMDeploy's TP workers hold GPU memory until they exit). Idempotent.

        ``timeout_s`` defaults to :data:`STOP_GRACE_S`, or :data:`UNRESPONSIVE_STOP_GRACE_S` when the last
        :meth:`check_health` went unanswered."""
        if timeout_s is None:
            timeout_s = UNRESPONSIVE_STOP_GRACE_S if self._unresponsive else STOP_GRACE_S
        with self._lock:
            proc = self._proc
            if proc is None or self._stopped:
                return
            pgid = proc.pid  # start_new_session=True: the engine leads its own group
            if _group_exists(pgid):
                _signal_group(pgid, signal.SIGTERM)
                deadline = time.monotonic() + timeout_s
                try:
                    proc.wait(timeout=max(0.0, timeout_s))
                except subprocess.TimeoutExpired:
                    pass
                if not _wait_group_gone(pgid, deadline):
                    logger.warning("engine group %d still alive %g s after SIGTERM; sending SIGKILL", pgid, timeout_s)
                    _signal_group(pgid, signal.SIGKILL)
            try:
                proc.wait(timeout=_GROUP_GONE_AFTER_KILL_S)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
                logger.error("engine process %d did not exit after SIGKILL", pgid)
            if _group_exists(pgid):
                _signal_group(pgid, signal.SIGKILL)
                if not _wait_group_gone(pgid, time.monotonic() + _GROUP_GONE_AFTER_KILL_S):
                    logger.error(
                        "processes of engine group %d remain after SIGKILL (unreaped zombies?); "
                        "GPU memory may still be held", pgid,
                    )
            self._stopped = True
            logger.info("engine %s stopped (exit code %s)", self.config.label(), proc.returncode)

    def __enter__(self) -> EngineProcess:
        self.start()
        try:
            self.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ----- logs ------------------------------------------------------------------------------------
    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the engine log ("" when there is none yet)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                data = f.read()
        except FileNotFoundError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # ----- helpers ---------------------------------------------------------------------------------
    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise EngineNotReadyError(f"{self!r}: call start() first")
        return self._proc

    def _died_error(self, what: str) -> EngineDiedError:
        return EngineDiedError(
            f"{what}: engine {self.config.label()} at {self.base_url}; full log: {self.log_path}",
            exit_code=self.returncode,
            log_tail=self.log_tail(),
        )

    def _http_status(self, path: str, timeout_s: float) -> int | None:
        """HTTP status of ``GET path``, ``None`` when there is no answer. Proxies are bypassed: the
        engine is on this host or a peer, never behind the caller's HTTP proxy."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.base_url + path, timeout=timeout_s) as resp:
                resp.read()
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (OSError, ValueError):  # URLError, connection refused/reset, timeout
            return None

    def _http_ok(self, path: str, timeout_s: float) -> bool:
        return self._http_status(path, timeout_s) == 200


def _group_exists(pgid: int) -> bool:
    """Whether a live (non-zombie) process of group ``pgid`` remains.

    Zombies do not count: they hold no memory (GPU memory included), and orphaned workers become
    zombies of PID 1, which may reap them only seconds later.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pgid reused by someone else's group: ours is gone
        return False
    return _live_group_members(pgid) != 0


def _live_group_members(pgid: int) -> int | None:
    """Number of non-zombie processes in group ``pgid`` from ``/proc``; ``None`` without ``/proc``."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return None
    live = 0
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            live += 1
    return live


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_group_gone(pgid: int, deadline: float) -> bool:
    while _group_exists(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
