"""EngineProcess lifecycle against the real simulated engine (real processes, real HTTP, no GPU)."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.config import EngineConfig
from orchestrator.engine import UNRESPONSIVE_STOP_GRACE_S, EngineProcess, port_is_free
from orchestrator.errors import ConfigError, EngineDiedError, EngineNotReadyError, PreflightError

SIM = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8)
TIME_SCALE = 50.0  # simulated start-up delays pass 50x faster


def engine(log_dir: Path, **kwargs: object) -> EngineProcess:
    kwargs.setdefault("ready_timeout_s", 90.0)  # generous: other test suites share 2 cores
    kwargs.setdefault("sim_time_scale", TIME_SCALE)
    return EngineProcess(SIM, log_dir=log_dir, **kwargs)  # type: ignore[arg-type]


def live_group_members(pgid: int) -> list[int]:
    """PIDs of non-zombie processes in process group ``pgid`` (zombies hold no memory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def assert_gone(proc: EngineProcess) -> None:
    assert proc.pid is not None
    assert not proc.is_alive()
    assert proc.returncode is not None
    assert live_group_members(proc.pid) == []


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_ready_then_stop_frees_port_and_group(tmp_log_dir: Path) -> None:
    proc = engine(tmp_log_dir, served_model_name="intern-s2")
    proc.start()
    try:
        proc.wait_until_ready()
        assert proc.is_alive()
        proc.check_health()
        assert proc.base_url == f"http://127.0.0.1:{proc.port}"
        assert get_json(proc.base_url + "/v1/models")["data"][0]["id"] == "intern-s2"
        assert not port_is_free(proc.host, proc.port)
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{proc.pid}/environ").read_text().split("\0") if "=" in item
        )
        assert environ["CUDA_VISIBLE_DEVICES"] == ""  # the simulator never touches a GPU
        assert environ["PYTHONUNBUFFERED"] == "1"
        assert proc.log_path == tmp_log_dir / f"{SIM.key()}-{proc.port}.log"
        assert proc.log_path.is_file()
    finally:
        proc.stop()
    assert_gone(proc)
    assert port_is_free(proc.host, proc.port)
    proc.stop()  # idempotent


def test_context_manager(tmp_log_dir: Path) -> None:
    with engine(tmp_log_dir) as proc:
        proc.check_health(timeout_s=10)
        pid = proc.pid
    assert pid is not None
    assert_gone(proc)


def test_crash_at_start_reports_exit_code_and_log(tmp_log_dir: Path) -> None:
    proc = engine(tmp_log_dir, sim_fault="crash-at-start")
    proc.start()
    try:
        with pytest.raises(EngineDiedError) as info:
            proc.wait_until_ready()
    finally:
        proc.stop()
    err = info.value
    assert err.exit_code not in (None, 0)
    assert err.log_tail  # the engine's own last words
    assert "crash" in err.log_tail.lower()
    assert str(proc.log_path) in str(err)
    assert_gone(proc)


def test_oom_at_start_is_a_death(tmp_log_dir: Path) -> None:
    proc = engine(tmp_log_dir, sim_fault="oom-at-start")
    with pytest.raises(EngineDiedError) as info:
        with proc:
            pass
    assert info.value.exit_code not in (None, 0)
    assert_gone(proc)


def test_never_ready_times_out_and_leaves_nothing(tmp_log_dir: Path) -> None:
    proc = engine(tmp_log_dir, sim_fault="never-ready", ready_timeout_s=3)
    proc.start()
    started = time.monotonic()
    with pytest.raises(EngineNotReadyError) as info:
        proc.wait_until_ready()
    assert 3 <= time.monotonic() - started < 30
    assert "did not answer GET /v1/models within 3 s" in str(info.value)
    assert_gone(proc)


def test_kill_9_is_seen_by_check_health(tmp_log_dir: Path) -> None:
    with engine(tmp_log_dir) as proc:
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(EngineDiedError) as info:
            proc.check_health()
        assert info.value.exit_code == -signal.SIGKILL
    assert_gone(proc)


def test_hang_is_not_ready_and_stop_escalates_to_sigkill(tmp_log_dir: Path) -> None:
    """``hang-after``: the process lives but stops answering — a hang, not a death. A hung server
    also ignores SIGTERM (its graceful shutdown waits on requests that never finish), so stop()
    must fall back to SIGKILL, after a short grace once a health check went unanswered."""
    with engine(tmp_log_dir, sim_fault="hang-after:50") as proc:  # 50 simulated s = 1 s at 50x
        # Timed faults count from the first request.
        req = urllib.request.Request(proc.base_url + "/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "hi", "max_tokens": 2}).encode())
        urllib.request.urlopen(req, timeout=10).close()
        deadline = time.monotonic() + 30
        while True:
            try:
                proc.check_health(timeout_s=1)
            except EngineNotReadyError:
                break
            assert time.monotonic() < deadline, "the engine kept answering after hang-after"
            time.sleep(0.2)
        assert proc.is_alive()
        started = time.monotonic()
        proc.stop()  # the unanswered health check shortens the grace (30 s for an engine that answers)
        assert time.monotonic() - started < UNRESPONSIVE_STOP_GRACE_S + 10
    assert_gone(proc)


def test_port_taken_before_start_is_retried_once(tmp_log_dir: Path) -> None:
    proc = engine(tmp_log_dir)
    first_port = proc.port
    blocker = socket.socket()  # bound, not listening: the engine's bind fails, our probes are refused
    try:
        blocker.bind((proc.host, first_port))
        with proc:
            assert proc.port != first_port
            proc.check_health()
    finally:
        blocker.close()
    assert_gone(proc)


def test_preflight_failure_starts_nothing(tmp_log_dir: Path) -> None:
    proc = EngineProcess(SIM.replace(model="no-such-profile"), log_dir=tmp_log_dir)
    with pytest.raises(PreflightError, match="no-such-profile"):
        proc.start()
    assert proc.pid is None
    proc.stop()  # nothing to stop, no error


def test_invalid_arguments_are_rejected_up_front(tmp_log_dir: Path) -> None:
    lmdeploy = EngineConfig(backend="pytorch", model="/m", tp=2)
    with pytest.raises(ConfigError, match="pass exactly 2 distinct"):
        EngineProcess(lmdeploy, gpus=[0], log_dir=tmp_log_dir)
    with pytest.raises(ConfigError, match="backend='sim' only"):
        EngineProcess(lmdeploy, gpus=[0, 1], sim_fault="crash-at-start", log_dir=tmp_log_dir)
    with pytest.raises(EngineNotReadyError, match="call start"):
        EngineProcess(SIM, log_dir=tmp_log_dir).check_health()
