"""Router replicas' direct-ingress URLs (Ray Serve direct ingress: no proxy hop).

The pure part reads Serve instance details documents; the end-to-end test deploys a simulated table
with ``python -m orchestrator.deploy``'s ``main`` on a local Ray started with
``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` — in a subprocess, because the flag must be in the environment
before Ray (and Serve's constants) start — and talks to the printed URL with the OpenAI client.
The direct-ingress-off case on a live cluster is in ``tests/integration/test_serve_app.py``.
"""
from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.deploy import direct_ingress_urls_from_details
from orchestrator.serve.app import ROUTER_DEPLOYMENT

ROOT = Path(__file__).resolve().parents[2]
APP = "mtp-router"


def _replica(name: str, state: str = "RUNNING") -> dict:
    return {"actor_name": name, "state": state, "node_ip": "10.0.0.1", "replica_id": name[-6:]}


def _details(target_groups: list[dict], *, host: str | None = "0.0.0.0",
             replicas: tuple[str, ...] = ("SERVE_REPLICA::mtp-router#router#aaaaaa",
                                          "SERVE_REPLICA::mtp-router#router#bbbbbb")) -> dict:
    d: dict = {
        "applications": {APP: {"deployments": {
            ROUTER_DEPLOYMENT: {"replicas": [_replica(r) for r in replicas]},
            "sim-engine": {"replicas": [_replica("SERVE_REPLICA::mtp-router#sim-engine#cccccc")]},
        }}},
        "target_groups": target_groups,
    }
    if host is not None:
        d["http_options"] = {"host": host, "port": 8000}
    return d


PROXY_GROUP = {"protocol": "HTTP", "route_prefix": "/", "app_name": "",
               "targets": [{"ip": "10.0.0.1", "port": 8000, "instance_id": "", "name": "SERVE_PROXY_ACTOR-node1"}]}


def _app_group(*targets: tuple[str, int, str], prefix: str = "/", protocol: str = "HTTP", app: str = APP) -> dict:
    return {"protocol": protocol, "route_prefix": prefix, "app_name": app, "ingress_deployment_name": ROUTER_DEPLOYMENT,
            "targets": [{"ip": ip, "port": port, "instance_id": "", "name": name} for ip, port, name in targets]}


A, B = "SERVE_REPLICA::mtp-router#router#aaaaaa", "SERVE_REPLICA::mtp-router#router#bbbbbb"


def test_direct_ingress_off_lists_nothing():
    # Direct ingress off: Serve's target groups are its proxies only (app_name "").
    assert direct_ingress_urls_from_details(_details([PROXY_GROUP]), APP) == []
    # On, but no router replica running yet: the app's group points at the proxies.
    proxies_for_app = _app_group(("10.0.0.1", 8000, "SERVE_PROXY_ACTOR-node1"))
    assert direct_ingress_urls_from_details(_details([proxies_for_app]), APP) == []
    assert direct_ingress_urls_from_details({}, APP) == []  # no Serve instance
    assert direct_ingress_urls_from_details(_details([], replicas=()), "other-app") == []


def test_each_router_replica_is_listed_by_node_ip_port_and_prefix():
    groups = [PROXY_GROUP,
              _app_group(("10.0.0.2", 30001, B), ("10.0.0.1", 30000, A)),
              _app_group(("10.0.0.1", 40000, A), protocol="gRPC"),
              _app_group(("10.0.0.9", 30005, "SERVE_REPLICA::other#router#dddddd"), app="other")]
    assert direct_ingress_urls_from_details(_details(groups), APP) == [
        "http://10.0.0.1:30000/v1", "http://10.0.0.2:30001/v1"]
    # A replica of another deployment of the app (not the router) is not a router URL.
    assert direct_ingress_urls_from_details(_details(groups), APP, deployment="sim-engine") == []
    prefixed = _app_group(("10.0.0.1", 30000, A), prefix="/llm/")
    assert direct_ingress_urls_from_details(_details([prefixed]), APP) == ["http://10.0.0.1:30000/llm/v1"]
    # Enum values as the controller returns them in-process (not JSON strings).
    from ray.serve._private.common import RequestProtocol

    enum_group = {**_app_group(("10.0.0.1", 30000, A)), "protocol": RequestProtocol.HTTP}
    assert direct_ingress_urls_from_details(_details([enum_group]), APP) == ["http://10.0.0.1:30000/v1"]


def test_a_specific_bind_host_is_the_url_host():
    group = _app_group(("10.0.0.1", 30000, A))
    assert direct_ingress_urls_from_details(_details([group], host="127.0.0.1"), APP) == ["http://127.0.0.1:30000/v1"]
    # Unset: Serve's default bind host, the loopback address.
    assert direct_ingress_urls_from_details(_details([group], host=None), APP) == ["http://127.0.0.1:30000/v1"]
    v6 = _app_group(("fd00::1", 30000, A))
    assert direct_ingress_urls_from_details(_details([v6], host="::"), APP) == ["http://[fd00::1]:30000/v1"]


# ----- end to end ------------------------------------------------------------------------------------
_DRIVER = """
import sys
import ray
from ray import serve
from orchestrator.deploy import main

ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
try:
    rc = main(sys.argv[1:])
    print(f"DEPLOY-EXIT {rc}", flush=True)
    sys.stdin.readline()  # the test is done with the app
finally:
    serve.shutdown()
    ray.shutdown()
"""


@pytest.mark.timeout(240)
def test_deploy_prints_router_replica_urls_that_serve_the_openai_api(tmp_path: Path, write_sim_table):
    import openai

    from orchestrator.config import EngineConfig
    from orchestrator.ports import find_free_port

    model = "intern-s2-preview-8xh200"
    cfg = EngineConfig(backend="sim", model=model, tp=8)
    table = write_sim_table(tmp_path / "routing.json", [("all", 4096, cfg)], sweep_id="test-di",
                            figures={"output_throughput": 1.0})
    key = "sk-direct-ingress-test"
    (tmp_path / "keys.txt").write_text(key + "\n")
    proxy_port = find_free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                # Replicas of a direct-ingress app otherwise stay 30 s after shutdown for load balancers.
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    cmd = [sys.executable, "-c", _DRIVER, "--routing-table", str(table), "--address", "local",
           "--http-host", "127.0.0.1", "--http-port", str(proxy_port), "--api-key-file", str(tmp_path / "keys.txt"),
           "--sim-time-scale", "20", "--engine-log-dir", str(tmp_path / "engine-logs")]
    stderr = (tmp_path / "driver.stderr").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: ([lines.put(ln) for ln in proc.stdout], lines.put(None)), daemon=True).start()
    out: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while not out or not out[-1].startswith("DEPLOY-EXIT"):
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"driver exited early: {out}\n{(tmp_path / 'driver.stderr').read_text()[-3000:]}"
            out.append(line.rstrip("\n"))
        assert out[-1] == "DEPLOY-EXIT 0", out
        listed = [ln for ln in out if ln.startswith("router replicas (direct ingress, no proxy hop): ")]
        assert len(listed) == 1, out
        urls = listed[0].split(": ", 1)[1].split()
        assert len(urls) == 1, urls  # one router replica
        m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/v1", urls[0])
        assert m and 30000 <= int(m.group(1)) <= 31000 and int(m.group(1)) != proxy_port, urls

        client = openai.OpenAI(base_url=urls[0], api_key=key, max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [model]
        raw = client.completions.with_raw_response.create(model=model, prompt="Hello", max_tokens=8)
        assert raw.headers["x-routing-table-version"] == "1"  # answered by the router itself
        done = raw.parse()
        assert done.choices[0].text and 0 < done.usage.completion_tokens <= 8
        chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=8, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=urls[0], api_key="wrong", max_retries=0).models.list()

        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        stderr.close()
