"""Serving reliability under faults (real Ray Serve, simulated engines, real HTTP).

Not repeated from ``tests/integration/test_serve_app.py``: an engine killed while *idle* (later requests fall
back, the replica is replaced), a force-killed replica does not orphan its engine, a table update
with requests in flight loses none. Added here:

- an engine killed *under load*: every in-flight request ends promptly and visibly — a stream that
  had started ends with an SSE ``error`` event naming the engine (never a silent truncation or a
  hang), a request that had received nothing yet is retried elsewhere (200 with
  ``x-route-fallback``) — and requests sent meanwhile all succeed; the replica is replaced;
- the router replica killed (``ray.kill(no_restart=False)``): it comes back serving the same table
  version with the same keys and limits (nothing of its configuration lives only in memory).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.config import EngineConfig

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

MODEL = "intern-s2-preview-8xh200"
API_KEY = "sk-reliability-serve"
APP = "mtp-reliability"
NOSPEC = EngineConfig(backend="sim", model=MODEL, tp=8)
MTP3 = EngineConfig(backend="sim", model=MODEL, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
HEADERS = {"authorization": f"Bearer {API_KEY}"}

pytestmark = pytest.mark.timeout(300)


class Cluster:
    def __init__(self, base: str) -> None:
        self.base = base

    def engine_info(self, cfg: EngineConfig) -> dict:
        return serve.get_deployment_handle(cfg.key(), app_name=APP).engine_info.remote().result(timeout_s=30)

    def post(self, body: dict, timeout: float = 120) -> httpx.Response:
        return httpx.post(self.base + "/v1/completions", json={"model": MODEL, **body}, headers=HEADERS, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, write_sim_table, sim_app_args, serve_app):
    tmp = tmp_path_factory.mktemp("rel-serve")
    table = write_sim_table(tmp / "routing.json", [("le256", 256, NOSPEC), ("le8192", 8192, MTP3)],
                            sweep_id="rel-serve", default_max_tokens=64)
    args = sim_app_args(table, tmp / "engine-logs", api_keys=[API_KEY], sim_time_scale=4.0,
                        engine={"health_check_period_s": 1, "health_check_timeout_s": 5, "health_timeout_s": 2,
                                "metrics_poll_s": 1, "graceful_shutdown_timeout_s": 10},
                        router={"status_refresh_s": 0.5, "graceful_shutdown_timeout_s": 10})
    with serve_app(args, app_name=APP) as base:
        yield Cluster(base)


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")


def test_engine_killed_under_load(cluster: Cluster):
    old = cluster.engine_info(MTP3)

    def stream(i: int, ready: list) -> dict:
        body = {"model": MODEL, "prompt": f"story {i}", "max_tokens": 6000, "ignore_eos": True, "stream": True}
        events, error = 0, None
        with httpx.stream("POST", cluster.base + "/v1/completions", json=body, headers=HEADERS, timeout=120) as r:
            status = r.status_code
            for line in r.iter_lines():
                if line.startswith("event: error"):
                    error = "event"
                elif line.startswith("data: {") and error == "event":
                    error = json.loads(line[6:])["error"]
                elif line.startswith("data: {"):
                    events += 1
                    if events == 5:
                        ready.append(i)
            return {"status": status, "events": events, "error": error, "deployment": r.headers.get("x-route-deployment")}

    def unary(i: int) -> httpx.Response:
        return cluster.post({"prompt": f"q {i}", "max_tokens": 2000, "ignore_eos": True})

    ready: list[int] = []
    with cf.ThreadPoolExecutor(32) as pool:
        streams = [pool.submit(stream, i, ready) for i in range(8)]
        unaries = [pool.submit(unary, i) for i in range(4)]
        deadline = time.monotonic() + 60
        while len(ready) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ready) == 8, "the streams did not start"
        os.kill(old["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        # Requests arriving during the outage: all answered (other bucket), none lost.
        during = [pool.submit(unary if i % 2 else lambda j: cluster.post({"prompt": "x", "max_tokens": 300}), i)
                  for i in range(12)]
        stream_out = [f.result(timeout=120) for f in streams]
        ended_within = time.monotonic() - killed_at
        unary_out = [f.result(timeout=120) for f in unaries]
        during_out = [f.result(timeout=120) for f in during]

    # In-flight streams: each ended with a clear error event naming the engine, promptly.
    for s in stream_out:
        assert s["status"] == 200 and s["events"] >= 5, s
        assert isinstance(s["error"], dict), f"stream cut without an error event: {s}"
        assert s["error"]["code"] == "engine_failed" and MTP3.key() in s["error"]["message"], s
    assert ended_within < 30, f"streams on the dead engine took {ended_within:.0f} s to end"
    # In-flight non-streamed requests had received nothing: retried elsewhere, or finished before.
    for r in unary_out + during_out:
        assert r.status_code == 200, r.text[:300]
        body = r.json()
        assert body["usage"]["completion_tokens"] > 0
    rerouted = [r.headers.get("x-route-fallback") for r in unary_out + during_out]
    assert "le8192->le256" in rerouted, rerouted

    # The replica is replaced with a new engine and the bucket is served by its own deployment again.
    deadline = time.monotonic() + 90
    new = None
    while time.monotonic() < deadline:
        try:
            new = cluster.engine_info(MTP3)
            if new["pid"] != old["pid"] and new["alive"]:
                r = cluster.post({"prompt": "x", "max_tokens": 300})
                if r.status_code == 200 and "x-route-fallback" not in r.headers:
                    break
        except Exception:  # noqa: BLE001 - the replica is being replaced
            pass
        time.sleep(0.5)
    assert new is not None and new["pid"] != old["pid"], "replica not replaced within 90 s"
    assert r.headers["x-route-deployment"] == MTP3.key() and "x-route-fallback" not in r.headers
    assert not _pid_alive(old["pid"])


def _router_actor_names() -> list[str]:
    from ray.util import list_named_actors

    return [a["name"] for a in list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and a["name"].startswith(f"SERVE_REPLICA::{APP}#router#")]


def test_router_restart_keeps_its_configuration(cluster: Cluster):
    handle = serve.get_deployment_handle("router", app_name=APP)
    spec_before = handle.deployed_spec.remote().result(timeout_s=30)
    r = cluster.post({"prompt": "x", "max_tokens": 300})
    version_before = r.headers["x-routing-table-version"]
    names = _router_actor_names()
    assert len(names) == 1, names

    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=False)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            r = cluster.post({"prompt": "x", "max_tokens": 300}, timeout=10)
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    assert r.status_code == 200, "the router did not come back within 90 s"
    assert r.headers["x-routing-table-version"] == version_before
    assert r.headers["x-route-deployment"] == MTP3.key() and r.headers["x-route-bucket"] == "le8192"
    assert handle.deployed_spec.remote().result(timeout_s=30) == spec_before
    # Keys and limits came back with it.
    assert httpx.post(cluster.base + "/v1/completions", json={"prompt": "x", "max_tokens": 3},
                      timeout=30).status_code == 401
    assert cluster.post({"prompt": "x", "max_tokens": 10**9}).status_code == 400
    r = httpx.get(cluster.base + "/health", timeout=30)
    assert r.json()["routing_table_version"] == int(version_before)
