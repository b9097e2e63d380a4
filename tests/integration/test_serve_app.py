"""The Serve app end to end on local Ray with simulated engines: routing by max_tokens, the OpenAI
client (streaming and not), fallback when an engine dies, bad requests, API keys, Prometheus metrics,
table updates with requests in flight, and refusal of an invalid table.

Serve is started once for the module (starting Ray + two engines costs ~15 s on 2 cores). Tests run
in file order and the update test (which changes the table) comes last.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from orchestrator.config import EngineConfig
from tests.waiting import wait_for

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

MODEL = "intern-s2-preview-8xh200"
API_KEY = "sk-test-router-key"
APP = "mtp-router-test"
TIME_SCALE = 2.0
NOSPEC = EngineConfig(backend="sim", model=MODEL, tp=8)
MTP3 = EngineConfig(backend="sim", model=MODEL, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
MTP2 = MTP3.replace(num_draft_tokens=2)

pytestmark = pytest.mark.timeout(240)


def _cells(long_config: EngineConfig) -> dict:
    """A v2 cell: sampled short requests go to the long bucket's engine (no extra engine to start)."""
    return {"le256": [("sampled", 1, long_config)]}


def _buckets(long_config: EngineConfig) -> list[tuple[str, int, EngineConfig]]:
    """The app's table: short requests to the engine without speculation, long ones to ``long_config``."""
    return [("le256", 256, NOSPEC), ("le4096", 4096, long_config)]


def _app_args(sim_app_args, table_path: Path, log_dir: Path) -> dict:
    """This app's deploy args for ``table_path``: keys, time scale, long graceful shutdowns."""
    return sim_app_args(
        table_path, log_dir, api_keys=[API_KEY], sim_time_scale=TIME_SCALE,
        engine={"health_check_period_s": 1, "health_check_timeout_s": 5, "health_timeout_s": 2,
                "metrics_poll_s": 1, "graceful_shutdown_timeout_s": 120},
        router={"status_refresh_s": 0.5, "graceful_shutdown_timeout_s": 120})


class Cluster:
    def __init__(self, base: str, table_path: Path, log_dir: Path, write_table, app_args) -> None:
        self.base, self.table_path, self.log_dir = base, table_path, log_dir
        self._write_table, self._app_args = write_table, app_args
        # This cluster's own session folder: /tmp/ray/session_latest may be another test run's.
        self.session_dir = Path(ray._private.worker._global_node.get_session_dir_path())
        self.client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        self.engine_pids: set[int] = set()

    def engine_info(self, config: EngineConfig) -> dict:
        h = serve.get_deployment_handle(config.key(), app_name=APP)
        info = h.engine_info.remote().result(timeout_s=30)
        self.engine_pids.add(info["pid"])
        return info

    def write_table(self, path: Path, long_config: EngineConfig) -> Path:
        return self._write_table(path, _buckets(long_config), sweep_id="test-serve", default_max_tokens=128,
                                 cells=_cells(long_config))

    def args(self, table_path: Path) -> dict:
        return _app_args(self._app_args, table_path, self.log_dir)

    def sim_requests(self, config: EngineConfig) -> float:
        text = httpx.get(self.engine_info(config)["base_url"] + "/metrics", timeout=10).text
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("sim_requests_total"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, write_sim_table, sim_app_args, serve_app):
    tmp = tmp_path_factory.mktemp("serve")
    table_path = tmp / "routing.json"
    write_sim_table(table_path, _buckets(MTP3), sweep_id="test-serve", default_max_tokens=128, cells=_cells(MTP3))
    with serve_app(_app_args(sim_app_args, table_path, tmp / "engine-logs"), app_name=APP, num_cpus=4) as base:
        c = Cluster(base, table_path, tmp / "engine-logs", write_sim_table, sim_app_args)
        for cfg in (NOSPEC, MTP3):
            c.engine_info(cfg)
        yield c
    # Graceful shutdown ran each replica's __del__, which stops its engine's process group.
    deadline = time.monotonic() + 30
    alive = set(c.engine_pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _pid_alive(p)}
        time.sleep(0.2)
    assert not alive, f"engine processes outlived Serve: {alive}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_requests_route_by_max_tokens_streaming_and_not(cluster: Cluster):
    before = {cfg.key(): cluster.sim_requests(cfg) for cfg in (NOSPEC, MTP3)}

    raw = cluster.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something short."}], max_tokens=16)
    chat = raw.parse()
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 16
    assert (raw.headers["x-route-bucket"], raw.headers["x-route-deployment"]) == ("le256", NOSPEC.key())
    assert "x-route-fallback" not in raw.headers

    raw = cluster.client.completions.with_raw_response.create(
        model=MODEL, prompt="Once upon a time", max_tokens=300, stream=True)
    assert (raw.headers["x-route-bucket"], raw.headers["x-route-deployment"]) == ("le4096", MTP3.key())
    chunks = list(raw.parse())
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text and all(c.usage is None for c in chunks), "the router must not leak the usage chunk it asked for"

    # max_completion_tokens, streaming chat with usage requested by the client.
    stream = cluster.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=400, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens <= 400

    # No max_tokens: the table's default_max_tokens (128) -> le256.
    raw = cluster.client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert raw.headers["x-route-bucket"] == "le256"

    after = {cfg.key(): cluster.sim_requests(cfg) for cfg in (NOSPEC, MTP3)}
    assert after[NOSPEC.key()] - before[NOSPEC.key()] == 2
    assert after[MTP3.key()] - before[MTP3.key()] == 2

    models = cluster.client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_sampled_requests_take_their_cell_and_say_so(cluster: Cluster):
    """A v2 table's cell: temperature > 0 short requests go to the cell's engine (its own counter moves),
    greedy and unset-temperature ones (the table has no default temperature) to the bucket's primary."""
    before = {cfg.key(): cluster.sim_requests(cfg) for cfg in (NOSPEC, MTP3)}
    sampled = cluster.client.completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=8, temperature=0.8)
    assert (sampled.headers["x-route-bucket"], sampled.headers["x-route-deployment"]) == ("le256", MTP3.key())
    assert (sampled.headers["x-route-cell"], sampled.headers["x-route-reason"]) == ("sampled@1", "cell:sampled@1")
    for temperature in (0.0, None):
        kw = {} if temperature is None else {"temperature": temperature}
        greedy = cluster.client.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=8, **kw)
        assert (greedy.headers["x-route-deployment"], greedy.headers["x-route-cell"]) == (NOSPEC.key(), "primary")
    after = {cfg.key(): cluster.sim_requests(cfg) for cfg in (NOSPEC, MTP3)}
    assert (after[MTP3.key()] - before[MTP3.key()], after[NOSPEC.key()] - before[NOSPEC.key()]) == (1, 2)


def test_the_router_says_its_engines_are_simulated(cluster: Cluster):
    """Simulated figures are labelled on every path: the engines' marker header passes through the
    router, and the router answers ``/sim/info`` for its simulated engines (one time scale)."""
    raw = cluster.client.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=4)
    assert raw.headers["x-simulated-engine"] == "true"
    auth = {"authorization": f"Bearer {API_KEY}"}
    assert httpx.get(cluster.base + "/v1/models", headers=auth, timeout=30).headers["x-simulated-engine"] == "true"
    r = httpx.get(cluster.base + "/sim/info", headers=auth, timeout=60)
    assert r.status_code == 200 and r.headers["x-simulated-engine"] == "true", r.text
    info = r.json()
    assert info["simulated"] is True and info["via_router"] is True and info["time_scale"] == TIME_SCALE
    assert set(info["engines"]) == {NOSPEC.key(), MTP3.key()}
    assert all(e["simulated"] and e["time_scale"] == TIME_SCALE for e in info["engines"].values())
    assert "monotonic_start" not in info  # each engine keeps its own clock: clients time by arrival
    assert httpx.get(cluster.base + "/sim/info", timeout=30).status_code == 401  # keys apply here too


def test_bench_through_the_router_reports_simulated_figures_in_simulated_time(cluster: Cluster):
    from tuning.bench import benchmark
    from tuning.workload import Workload

    # One 1024-token request at a time, so the span it measures (~4 s of wall time) outlasts the call's own
    # overhead (its client and tokenizer set-up: 0.9 s beside a busy loop, when 256-token requests 4 at a
    # time spanned 0.8 s).
    workload = Workload(input_len=16, output_len=1024, range_ratio=1.0, num_prompts=8, max_concurrency=1)
    started = time.monotonic()
    result = benchmark(cluster.base, workload, api_key=API_KEY)
    wall_s = time.monotonic() - started
    assert result.simulated is True and result.time_scale == TIME_SCALE
    assert result.completed == 8 and result.failed == 0
    # Scaled: the measured wall duration times the time scale (2), so longer than the call's own wall time.
    assert result.duration_s > wall_s, (result.duration_s, wall_s)


def test_a_normal_streaming_load_logs_no_error_in_the_router(cluster: Cluster):
    """Clients that all finish normally: the router's Serve log holds no ERROR (Serve cancelling a
    finished request's receive channel used to log an 'unhandled error' traceback)."""
    def stream(i: int) -> int:
        chunks = cluster.client.completions.create(model=MODEL, prompt="word " * (i % 8 + 1), max_tokens=24,
                                                   stream=True)
        return sum(1 for c in chunks if c.choices and c.choices[0].text)

    with cf.ThreadPoolExecutor(16) as pool:
        assert all(n > 0 for n in pool.map(stream, range(96)))
    time.sleep(1.0)  # the replica's log handler flushes
    logs = list((cluster.session_dir / "logs" / "serve").glob(f"replica_{APP}_router_*.log"))
    assert logs, "no router replica log found"
    errors = [ln for p in logs for ln in p.read_text(errors="replace").splitlines() if ln.startswith("ERROR")]
    assert errors == []


def test_no_router_replica_urls_without_direct_ingress(cluster: Cluster):
    """This cluster runs without RAY_SERVE_ENABLE_DIRECT_INGRESS: traffic enters through the proxy only
    (the direct-ingress case is tests/integration/test_direct_ingress.py)."""
    from orchestrator.deploy import direct_ingress_urls
    from orchestrator.raycompat import serve_client

    assert direct_ingress_urls(APP) == []
    details = serve_client().get_serve_details()
    assert details["applications"][APP]["deployments"]["router"]["replicas"]  # a router runs, and yet none listed
    assert {t["port"] for g in details["target_groups"] for t in g["targets"]} == {int(cluster.base.rsplit(":", 1)[1])}


def test_an_update_counts_the_replicas_that_run_now(cluster: Cluster):
    """What deploy's update check reads from Serve: every running deployment with its live replicas."""
    from orchestrator.deploy import _running_replicas

    counts = _running_replicas(APP)
    assert counts.get("router", 0) >= 1
    assert all(counts.get(cfg.key(), 0) >= 1 for cfg in (NOSPEC, MTP3)), counts
    assert _running_replicas("no-such-app") == {}


def test_bad_requests_and_api_keys_get_openai_errors(cluster: Cluster):
    url = cluster.base + "/v1/chat/completions"
    auth = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    ok_body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    cases = [
        ({"content-type": "application/json"}, json.dumps(ok_body).encode(), 401),
        ({"authorization": "Bearer wrong", "content-type": "application/json"}, json.dumps(ok_body).encode(), 401),
        ({"authorization": API_KEY}, json.dumps(ok_body).encode(), 401),  # no "Bearer"
        (auth, b"{not json", 400),
        (auth, b"\xff\xfe\x00garbage", 400),
        (auth, json.dumps({**ok_body, "max_tokens": -1}).encode(), 400),
        (auth, json.dumps({**ok_body, "max_tokens": 0}).encode(), 400),
        (auth, json.dumps({**ok_body, "max_tokens": 10**9}).encode(), 400),
        (auth, json.dumps({**ok_body, "max_tokens": "12"}).encode(), 400),
        (auth, json.dumps({**ok_body, "model": "no-such-model"}).encode(), 404),
        (auth, json.dumps({"model": MODEL}).encode(), 400),
        (auth, b'{"messages": [{"role": "user", "content": "' + b"a" * (5 * 1024 * 1024) + b'"}]}', 413),
    ]
    with httpx.Client(timeout=60) as http:
        for headers, body, status in cases:
            r = http.post(url, content=body, headers=headers)
            assert r.status_code == status, (status, r.text[:300])
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
            assert API_KEY not in r.text
        r = http.post(cluster.base + "/v1/completions", json={"model": MODEL, "max_tokens": 3}, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = http.get(cluster.base + "/v1/nothing-here", headers=auth)
        assert r.status_code == 404 and "error" in r.json()
        assert http.get(cluster.base + "/health").status_code == 200
        # The router survived all of it.
        assert http.post(url, json=ok_body, headers=auth).status_code == 200

    bad = openai.OpenAI(base_url=cluster.base + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        cluster.client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)


def test_metrics_reach_rays_prometheus_endpoint(cluster: Cluster):
    # Traffic on both buckets so the accept-length poller sees MTP counters move; a streamed request
    # (TTFT/TPOT) and a refused one (errors), so the test does not lean on the tests before it.
    answered = cluster.engine_info(MTP3)["sequences_answered"]
    for _ in range(3):
        cluster.client.completions.create(model=MODEL, prompt="a b c", max_tokens=300)
    # A one-token ping (sampled: the le256 cell's MTP engine) runs no decode step, so drafts nothing.
    cluster.client.completions.create(model=MODEL, prompt="ping", max_tokens=1, temperature=0.8)
    for _chunk in cluster.client.completions.create(model=MODEL, prompt="a b c", max_tokens=50, stream=True):
        pass
    with pytest.raises(openai.BadRequestError):
        cluster.client.completions.create(model=MODEL, prompt="a b c", max_tokens=-1)
    port = ray._private.worker.global_worker.node.metrics_export_port
    wanted = [
        "ray_mtp_router_requests_total", "ray_mtp_router_output_tokens_total", "ray_mtp_router_ttft_seconds_bucket",
        "ray_mtp_router_tpot_seconds_bucket", "ray_mtp_router_errors_total", "ray_mtp_engine_accept_length",
        "ray_mtp_engine_accept_length_low", "ray_mtp_engine_requests_running",
        "ray_mtp_engine_tokens_per_step_estimate",
    ]
    deadline = time.monotonic() + 90
    missing = wanted
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        missing = [m for m in wanted if m not in text]
        if not missing:
            break
        time.sleep(2)
    assert not missing, f"not exported after 90 s: {missing}"
    line = next(ln for ln in text.splitlines() if ln.startswith("ray_mtp_engine_accept_length{") and MTP3.key() in ln)
    assert float(line.split()[-1]) > 1.0
    # The replica counts a request when its response ended (possibly after the client saw the end), and
    # its tracker sees the count at its next scrape: wait for both, then read the figures.
    def info_once(condition):
        info = cluster.engine_info(MTP3)
        return info if condition(info) else None

    counted = wait_for("the replica counting the three requests",
                       lambda: info_once(lambda i: i["sequences_answered"] - answered >= 3), timeout_s=30, period_s=0.5)
    info = wait_for("a scrape after the count",
                    lambda: info_once(lambda i: i["metrics_scrapes"] > counted["metrics_scrapes"]),
                    timeout_s=30, period_s=0.5)
    # Three sequences that drafted (the ping drafted nothing, the refused request reached no engine); the
    # simulator counts every decode step, unlike LMDeploy under load: many outputs per sequence, so the
    # engine's estimated tokens per step is the counted figure, barely corrected.
    assert info["sequences_answered"] - answered == 3
    assert info["outputs_per_request"] >= 8 and 1.0 < info["tokens_per_step_estimate"] <= 4.0
    line = next(ln for ln in text.splitlines()
                if ln.startswith("ray_mtp_engine_tokens_per_step_estimate{") and MTP3.key() in ln)
    assert 1.0 < float(line.split()[-1]) <= 4.0
    assert 'bucket="le4096"' in text and f'engine="{MTP3.key()}"' in text
    requests = [ln for ln in text.splitlines() if ln.startswith("ray_mtp_router_requests_total{")]
    assert any('cell="primary"' in ln for ln in requests), "the requests counter names the routing cell"


def test_client_disconnect_aborts_the_engine_request(cluster: Cluster):
    def generated() -> float:
        text = httpx.get(cluster.engine_info(MTP3)["base_url"] + "/metrics", timeout=10).text
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("sim_generation_tokens_total"))

    answered = cluster.engine_info(MTP3)["sequences_answered"]
    body = {"model": MODEL, "prompt": "x", "max_tokens": 20000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", cluster.base + "/v1/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {API_KEY}"}) as r:
        lines = r.iter_lines()
        for _ in range(20):
            next(lines)
        before = generated()
        for _ in range(200):
            next(lines)
        assert generated() > before  # the engine is generating while the client reads
    time.sleep(1.0)  # the cancellation travels client -> proxy -> router -> replica -> engine connection
    settled = generated()
    time.sleep(2.0)
    # 20000 tokens take > 10 s here: had the engine kept going, the counter would still be rising.
    assert generated() == settled, "the engine kept generating for a client that left"
    # Its outputs reached the engine's counters: the accept-length tracker counts its sequence.
    assert cluster.engine_info(MTP3)["sequences_answered"] - answered == 1


def test_killed_engine_falls_back_and_replica_is_replaced(cluster: Cluster):
    old = cluster.engine_info(MTP3)
    os.kill(old["pid"], signal.SIGKILL)
    fallbacks, deadline = [], time.monotonic() + 60
    with httpx.Client(timeout=60, headers={"authorization": f"Bearer {API_KEY}"}) as http:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 300}
        while time.monotonic() < deadline:
            r = http.post(cluster.base + "/v1/completions", json=body)
            assert r.status_code == 200, r.text  # never an error for the client
            fallbacks.append(r.headers.get("x-route-fallback"))
            if r.headers.get("x-route-fallback") is None and len(fallbacks) > 1:
                break  # the bucket's own deployment serves again
            time.sleep(0.2)
    assert "le4096->le256" in fallbacks, fallbacks
    assert fallbacks[-1] is None, "the killed engine's replica was not replaced within 60 s"
    new = cluster.engine_info(MTP3)
    assert new["pid"] != old["pid"] and new["alive"]


def test_force_killed_replica_does_not_orphan_its_engine(cluster: Cluster):
    from ray.util import list_named_actors

    old = cluster.engine_info(NOSPEC)
    names = [a["name"] for a in list_named_actors(all_namespaces=True)
             if a["namespace"] == "serve" and f"#{NOSPEC.key()}#" in a["name"]]
    assert len(names) == 1, names
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)  # no __del__ runs
    deadline = time.monotonic() + 30
    while _pid_alive(old["pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pid_alive(old["pid"]), "engine outlived its force-killed replica"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # Serve replaces the replica
        try:
            if cluster.engine_info(NOSPEC)["pid"] != old["pid"]:
                break
        except Exception:
            pass
        time.sleep(0.5)
    deadline = time.monotonic() + 15  # the router sees the new replica on its next status refresh
    while True:
        r = cluster.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=8)
        if "x-route-fallback" not in r.headers or time.monotonic() > deadline:
            break
        # le256's own other config (its sampled cell, MTP-3) is tried before another bucket's.
        assert (r.headers["x-route-fallback"], r.headers["x-route-deployment"]) == ("le256->le256", MTP3.key())
        time.sleep(0.5)
    assert r.headers["x-route-deployment"] == NOSPEC.key() and "x-route-fallback" not in r.headers


def test_invalid_table_is_refused_before_anything_changes(cluster: Cluster, tmp_path: Path):
    from orchestrator.deploy import deploy
    from orchestrator.table import RoutingTableError

    bad = tmp_path / "bad.json"
    data = json.loads(cluster.write_table(tmp_path / "good.json", MTP2).read_text())
    data["buckets"].reverse()  # bounds not increasing
    bad.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-m", "orchestrator.deploy", "--routing-table", str(bad)],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2 and "strictly increasing" in proc.stderr, proc.stderr
    with pytest.raises(RoutingTableError):
        deploy(cluster.args(bad), app_name=APP)
    r = httpx.post(cluster.base + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 300},
                   headers={"authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-routing-table-version"] == "1"
    assert r.headers["x-route-deployment"] == MTP3.key()

    # The declarative config: valid for `serve deploy`, table pinned by hash, no cleartext key.
    from ray.serve.schema import ServeDeploySchema

    out = tmp_path / "serve.yaml"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.deploy", "--routing-table", str(cluster.table_path),
                           "--write-serve-config", str(out), "--scale", "le4096=1:4:32", "--sim-time-scale", "10"],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(out.read_text())
    ServeDeploySchema.model_validate(config)
    app = config["applications"][0]
    assert app["import_path"] == "orchestrator.serve.app:app_builder"
    assert len(app["args"]["routing_table_sha256"]) == 64
    from orchestrator.serve.app import app_builder

    assert app_builder(app["args"]) is not None  # what `serve deploy` will import and call


def test_several_new_apps_deploy_at_once_after_all_are_checked(cluster: Cluster, tmp_path: Path):
    """``deploy_many`` starts several apps' engines side by side; an app that runs already, or apps that
    fit the cluster alone but not together, are refused before any of them is deployed."""
    from orchestrator.deploy import deploy_many
    from orchestrator.errors import ConfigError

    path = cluster._write_table(tmp_path / "one.json", [("le4096", 4096, NOSPEC)], sweep_id="many",
                                default_max_tokens=16)
    apps = [(cluster.args(path), name, f"/{name}") for name in ("many-a", "many-b")]
    with pytest.raises(ConfigError, match="running already"):
        deploy_many([apps[0], (cluster.args(path), APP, "/other")])
    greedy = [({**args, "engine": {**args["engine"], "num_cpus": 3}}, name, prefix) for args, name, prefix in apps]
    with pytest.raises(ConfigError, match="the 2 apps together .* reserve 6 CPU"):
        deploy_many(greedy)  # 3 CPUs each fit the cluster's 4 alone
    with pytest.raises(ConfigError, match="a name of its own"):
        deploy_many([apps[0], apps[0]])
    with pytest.raises(ConfigError, match=r"route prefix\(es\) \['/'\] given twice or served by a running app"):
        deploy_many([apps[0], (cluster.args(path), "many-c", "/")])  # the running app's prefix
    with pytest.raises(ConfigError, match="no app"):
        deploy_many([])
    assert not {"many-a", "many-b"} & set(serve.status().applications)  # nothing was deployed
    try:
        results = deploy_many(apps)
        assert [(r.app_name, r.engine_deployments) for r in results] == [
            ("many-a", (NOSPEC.key(),)), ("many-b", (NOSPEC.key(),))]
        for name in ("many-a", "many-b"):
            r = httpx.post(f"{cluster.base}/{name}/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": "x", "max_tokens": 8},
                           headers={"authorization": f"Bearer {API_KEY}"})
            assert r.status_code == 200 and r.headers["x-route-deployment"] == NOSPEC.key()
        r = httpx.post(cluster.base + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 300},
                       headers={"authorization": f"Bearer {API_KEY}"}, timeout=60)
        assert r.headers["x-route-deployment"] == MTP3.key()  # the app that ran before is as it was
    finally:
        for name in ("many-a", "many-b"):
            serve.delete(name)


def test_a_new_app_with_room_in_the_cluster_but_not_beside_the_running_one_is_refused(cluster: Cluster, tmp_path: Path):
    """The cluster's total has room for the new app, what other work holds (a job's actor here; a running
    app or a Tune trial alike) leaves too little free: Serve would leave its replicas pending for ever, so
    deploy (and deploy_many) refuse before anything starts."""
    from orchestrator.deploy import deploy, deploy_many
    from orchestrator.errors import ConfigError

    @ray.remote(num_cpus=2)
    class Job:
        def ready(self) -> bool:
            return True

    path = cluster._write_table(tmp_path / "one.json", [("le4096", 4096, NOSPEC)], sweep_id="free",
                                default_max_tokens=16)
    args = cluster.args(path)
    job = Job.remote()
    try:
        assert ray.get(job.ready.remote(), timeout=60)
        free, total = ray.available_resources().get("CPU", 0.0), ray.cluster_resources()["CPU"]
        big = {**args, "router": {**args["router"], "num_cpus": 0},
               "engine": {**args["engine"], "num_cpus": free + 0.5}}
        assert free + 0.5 <= total  # the new app alone fits the cluster
        with pytest.raises(ConfigError, match=r"only .* CPU\(s\) .* are free: other Serve apps or jobs"):
            deploy(big, app_name="too-big", route_prefix="/too-big")
        with pytest.raises(ConfigError, match="the app reserves"):
            deploy_many([(big, "too-big", "/too-big")])
        assert "too-big" not in serve.status().applications
    finally:
        ray.kill(job)


def test_table_update_with_requests_in_flight_loses_none(cluster: Cluster):
    from orchestrator.deploy import deploy

    old_info = cluster.engine_info(MTP3)
    headers = {"authorization": f"Bearer {API_KEY}"}

    # Size the long streams from the measured speed so they outlast the update (~15-25 s here).
    t0 = time.monotonic()
    r = httpx.post(cluster.base + "/v1/completions", headers=headers, timeout=60,
                   json={"model": MODEL, "prompt": "x", "max_tokens": 1000, "ignore_eos": True})
    tokens_per_s = r.json()["usage"]["completion_tokens"] / (time.monotonic() - t0)
    long_tokens = int(min(30_000, max(2000, tokens_per_s * 15)))

    def long_stream(i: int) -> tuple[int, int, str]:
        body = {"model": MODEL, "prompt": f"story {i}", "max_tokens": long_tokens, "stream": True, "ignore_eos": True}
        events, last = 0, None
        with httpx.stream("POST", cluster.base + "/v1/completions", json=body, headers=headers, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    assert '"error"' not in line, line
                    events += 1
                if line.startswith("data:"):
                    last = line
            assert last == "data: [DONE]", f"the stream ended without [DONE] (last event {last!r:.200})"
            return r.status_code, events, r.headers["x-routing-table-version"]

    def short(i: int) -> int:
        r = httpx.post(cluster.base + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 300 + i % 2},
                       headers=headers, timeout=300)
        return r.status_code

    cluster.write_table(cluster.table_path, MTP2)  # v2: the long bucket changes config
    with cf.ThreadPoolExecutor(24) as pool:
        streams = [pool.submit(long_stream, i) for i in range(6)]
        time.sleep(1.0)  # they are in flight
        stop = time.monotonic() + 3600
        shorts: list[cf.Future] = []

        def trickle():
            i = 0
            while time.monotonic() < stop:
                shorts.append(pool.submit(short, i))
                i += 1
                time.sleep(0.25)

        trickler = pool.submit(trickle)
        in_flight_at_update = sum(not f.done() for f in streams)
        result = deploy(cluster.args(cluster.table_path), app_name=APP)
        assert result.steps == ("add", "switch", "remove") and result.removed == (MTP3.key(),)
        stop = time.monotonic()
        trickler.result()
        outcomes = [f.exception() or f.result() for f in streams]
        short_statuses = [f.result() for f in shorts]
    assert in_flight_at_update == len(streams), f"streams ({long_tokens} tokens) ended before the update: {outcomes}"
    assert all(status == 200 and events > 0 for status, events, _ in outcomes), outcomes
    assert {v for _, _, v in outcomes} == {"1"}
    assert short_statuses and all(s == 200 for s in short_statuses), short_statuses

    r = httpx.post(cluster.base + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 300},
                   headers=headers, timeout=60)
    assert r.headers["x-routing-table-version"] == "2" and r.headers["x-route-deployment"] == MTP2.key()
    # The removed deployment drained, then its __del__ stopped the engine.
    deadline = time.monotonic() + 60
    while _pid_alive(old_info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _pid_alive(old_info["pid"])
    assert MTP3.key() not in serve.status().applications[APP].deployments
    cluster.engine_info(MTP2)
