"""A real Prometheus behind the dashboard: it scrapes Ray's metrics through Ray's service-discovery
file during a load run on the Serve app (simulated engines), every query of
``orchestrator/serve/grafana_dashboard.json`` returns data, and the low-accept-length alert fires
when an engine's acceptance drops.

Prometheus is the Debian package (``.ci/install_prometheus.sh``); without the binary the test is
skipped with that reason. The simulator's acceptance falls with the request's temperature
(``orchestrator.sim.model``: 2.5 accepted-length at temperature 0 with 2 draft tokens, 1.4 at
temperature 1), so sampled traffic is what drops an engine below the replica's threshold (1.5).

Ray writes the discovery file (``prom_metrics_service_discovery.json``, the one ``ray metrics
launch-prometheus`` points Prometheus at) from its dashboard, under its temp dir; this test gives Ray
a temp dir of its own so the file is this cluster's and no other Ray session's on the machine.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.fsutil import utc_now_iso
from orchestrator.ports import find_free_port
from tests.waiting import wait_for

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus binary (Debian package prometheus: "
                                                  ".ci/install_prometheus.sh)"),
]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "orchestrator" / "serve" / "grafana_dashboard.json"
APP = "mtp-prometheus"
PROFILE = "intern-s2-preview-8xh200"
OFF = dict(backend="sim", model=PROFILE, tp=8)
BUCKET_CONFIGS = {
    "le256": OFF,
    "le1024": {**OFF, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 2},
    # An engine that crashes 2 simulated seconds after its first request, again after every restart:
    # while Serve replaces it, its bucket falls back to le1024 (the fallback and error panels' data).
    "le4096": {**OFF, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4,
               "extra_flags": ("--fault", "crash-after:2")},
}
ACCEPT_WINDOW_S = 10.0
"""The live accept-length estimate's window (a minute by default): the alert follows the traffic within it."""
ACCEPT_LENGTH_LOW_ALERT = "max by (engine) (ray_mtp_engine_accept_length_low) == 1"
"""The alert the README recommends on a low live accept length."""


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the Grafana dashboard, ``$application`` filled in."""
    board = json.loads(DASHBOARD.read_text())
    return [(p.get("title", "?"), t["expr"].replace("$application", APP))
            for p in board["panels"] for t in p.get("targets", []) if t.get("expr")]


# ----- Prometheus ------------------------------------------------------------------------------------------
class Prometheus:
    """A Prometheus server scraping the targets of one file-discovery file each second."""

    def __init__(self, discovery_file: Path, folder: Path) -> None:
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (folder / "rules.yml").write_text(
            "groups:\n- name: mtp\n  interval: 1s\n  rules:\n  - alert: MtpAcceptLengthLow\n"
            f"    expr: {ACCEPT_LENGTH_LOW_ALERT}\n")
        (folder / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "rule_files:\n  - rules.yml\n"
            f"scrape_configs:\n- job_name: ray\n  file_sd_configs:\n  - files:\n    - '{discovery_file}'\n"
            "    refresh_interval: 1s\n")
        self.log = folder / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def firing(self) -> dict[str, str]:
        """Engine -> state of the accept-length alert (``pending`` or ``firing``)."""
        alerts = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return {a["labels"].get("engine", "?"): a["state"] for a in alerts if a["labels"]["alertname"] == "MtpAcceptLengthLow"}

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


_wait = functools.partial(wait_for, timeout_s=60.0, period_s=1.0)


# ----- Ray, Serve and load ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack() -> Iterator[dict]:
    """Ray (with its dashboard, which writes the discovery file; metrics exported each second), the
    Serve app, and Prometheus scraping it."""
    import ray
    from ray import serve

    from orchestrator.serve.app import build_app

    temp = Path(tempfile.mkdtemp(prefix="mtp-prom-", dir="/tmp"))  # short: Ray's socket paths live under it
    prom = None
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=True, dashboard_port=find_free_port(),
                 log_to_driver=False, _temp_dir=str(temp / "ray"),
                 _system_config={"metrics_report_interval_ms": 1000})
        table_path = temp / "routing_table.json"
        routing.commit({
            "provenance": {"model": PROFILE, "gpu_type": "none (simulated)", "gpu_count": 0,
                           "sweep_id": "prometheus", "created_at": utc_now_iso(), "simulated": True},
            "buckets": [{"name": b, "max_output_len": int(b[2:]), "config": EngineConfig(**c).to_dict(),
                         "figures": {"output_throughput": 1000.0}} for b, c in BUCKET_CONFIGS.items()],
            "default_max_tokens": 64,
        }, table_path)
        port = find_free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app({
            "routing_table": str(table_path), "sim_time_scale": 4.0,
            "engine": {"log_dir": str(temp / "engine-logs"), "metrics_poll_s": 1.0, "num_cpus": 0.5,
                       "health_check_period_s": 1.0, "health_check_timeout_s": 3.0, "health_timeout_s": 1.0,
                       "accept_length_window_s": ACCEPT_WINDOW_S, "graceful_shutdown_wait_loop_s": 0.5},
            "router": {"num_cpus": 0.5, "status_refresh_s": 0.5, "graceful_shutdown_wait_loop_s": 0.5},
        }), name=APP, route_prefix="/")
        discovery = temp / "ray" / "prom_metrics_service_discovery.json"
        _wait("Ray's service-discovery file", discovery.exists, timeout_s=30)
        (temp / "prom").mkdir()
        prom = Prometheus(discovery, temp / "prom")
        _wait("Prometheus ready", prom.ready, timeout_s=30)
        yield {"url": f"http://127.0.0.1:{port}", "prom": prom,
               "keys": {b: EngineConfig(**c).key() for b, c in BUCKET_CONFIGS.items()}}
    finally:
        if prom is not None:
            prom.stop()
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


class Load:
    """Closed-loop streaming clients, one per (bucket, temperature) given, until stopped."""

    def __init__(self, url: str, clients: list[tuple[int, float]]) -> None:
        self.url, self.stop_event = url, threading.Event()
        self.statuses: list[int] = []
        self.threads = [threading.Thread(target=self._run, args=c, daemon=True) for c in clients]
        for t in self.threads:
            t.start()

    def _run(self, max_tokens: int, temperature: float) -> None:
        body = {"model": PROFILE, "prompt": "Tell me about Ray.", "max_tokens": max_tokens, "stream": True,
                "temperature": temperature, "ignore_eos": True}
        with httpx.Client(timeout=60) as http:
            while not self.stop_event.is_set():
                with http.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                    for _ in r.iter_bytes():
                        pass
                    self.statuses.append(r.status_code)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=60)


@pytest.mark.slow  # ~35-45 s with its stack on 2 busy cores
def test_every_dashboard_query_returns_data_and_the_low_accept_alert_fires(stack):
    url, prom, keys = stack["url"], stack["prom"], stack["keys"]
    mtp_engine = keys["le1024"]
    # Greedy traffic on every bucket (le4096's engine crash-loops: its requests fall back).
    load = Load(url, [(256, 0.0), (1024, 0.0), (2048, 0.0)])
    try:
        # One request the router refuses (beyond the model's token limit): the errors panel's data.
        refused = httpx.post(f"{url}/v1/completions", timeout=30,
                             json={"model": PROFILE, "prompt": "x", "max_tokens": 10_000_000})
        assert refused.status_code == 400, refused.text
        queries = dashboard_queries()
        assert len(queries) >= 10, queries

        def empty() -> list[str]:
            return [f"{title}: {expr}" for title, expr in queries if not prom.query(expr)]

        missing = empty()
        deadline = time.monotonic() + 90
        while missing and time.monotonic() < deadline:
            time.sleep(2)
            missing = empty()
        assert not missing, f"dashboard queries without data after 90 s: {missing}"
        # Greedy MTP traffic keeps the engine's acceptance above the threshold: no alert for it.
        accept = prom.query(f'max by (engine) (ray_mtp_engine_accept_length{{engine="{mtp_engine}"}})')
        assert accept and float(accept[0]["value"][1]) > 1.5, accept
        assert mtp_engine not in prom.firing()
    finally:
        load.stop()
    assert load.statuses and set(load.statuses) == {200}, load.statuses

    # Sampled traffic (temperature 1) drops the MTP engine's acceptance: the alert fires for it once the
    # estimate's window holds mostly sampled steps.
    sampled = Load(url, [(1024, 1.0), (1024, 1.0)])
    try:
        _wait("the accept-length alert firing for the MTP engine", lambda: prom.firing().get(mtp_engine) == "firing",
              timeout_s=120)
        low = prom.query(f'max by (engine) (ray_mtp_engine_accept_length{{engine="{mtp_engine}"}})')
        assert float(low[0]["value"][1]) < 1.5, low
    finally:
        sampled.stop()
    assert set(sampled.statuses) == {200}, sampled.statuses
