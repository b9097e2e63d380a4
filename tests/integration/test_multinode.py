"""Multi-node behaviour on one machine: Ray's own multi-node harness (``ray.cluster_utils.Cluster``:
a head raylet without GPUs and three raylets declaring 8 GPUs each) with simulated engines.

No 8-GPU node is available to the project, so this is how the sweep's placement (a tp=8 trial takes a
whole node, never two on one node, never one across nodes), node loss during a sweep and while
serving, and autoscaling across nodes are shown. What it cannot show (a real cloud launch, real GPUs,
a network between hosts) is listed in docs/multinode.md.

Where an engine runs is read from the engine process itself: every raylet is started with
``MTP_TEST_NODE=<label>`` in its environment, Ray's workers inherit it from their raylet and the
engines from their worker, so ``/proc/<engine pid>/environ`` names the node the engine started on,
and the engine's log file (its stdout, under the sweep's ``engine-logs/<trial id>/``) names its trial.

One cluster serves the whole module (starting one costs ~15 s on 2 cores); a test that removes a
node adds a fresh one before it returns, so the next test finds three GPU nodes again.
"""
from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator import onehost
from orchestrator import table as routing
from orchestrator.config import EngineConfig
from orchestrator.onehost import live_processes
from tests.waiting import wait_for
from tuning.buckets import make_buckets
from tuning.results import behind_schedule_rows
from tuning.sweep import SweepSpec, run_sweep
from tuning.sweep.records import reported_trial_ids
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_STATIC, NamedPoint, SearchSpace

pytestmark = pytest.mark.timeout(600)

NODE_ENV = "MTP_TEST_NODE"
"""Environment variable naming the raylet an engine process descends from (see the module docstring)."""
SERVE_ENV = {
    # Serve's autoscaler sees load through metrics the router's handles and the replicas push every
    # 10 s by default; each second here, so a load ramp of seconds is seen while it lasts.
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
    "RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR": "0.02",
}
GPU_NODES = 3
GPUS_PER_NODE = 8
PROFILE = "intern-s2-preview-8xh200"
FAST = ("--startup-delay", "1")  # simulated seconds of engine start-up


# ----- the cluster ----------------------------------------------------------------------------------------
@dataclass
class MultiNode:
    """The module's cluster: the ``Cluster`` and the label of every raylet by node id."""

    cluster: object
    labels: dict[str, str] = field(default_factory=dict)  # node id -> label
    _next: int = 0

    def add_gpu_node(self) -> object:
        label = f"gpu-{self._next}"
        self._next += 1
        node = self.cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE, env_vars={NODE_ENV: label, **SERVE_ENV},
                                     resources={f"node_{label}": 1})
        self.labels[node.node_id] = label
        return node

    def node(self, label: str) -> object:
        return next(n for n in self.cluster.worker_nodes if self.labels.get(n.node_id) == label)

    def remove(self, label: str) -> None:
        """Kill the raylet ``label`` and everything it started, as a lost machine would."""
        self.cluster.remove_node(self.node(label), allow_graceful=False)

    def gpu_labels(self) -> list[str]:
        return sorted(self.labels[n.node_id] for n in self.cluster.worker_nodes)


@pytest.fixture(scope="module")
def multinode() -> Iterator[MultiNode]:
    """The module's cluster, in a Ray temp folder of its own: ``Cluster`` writes its address to
    ``$RAY_TMPDIR/ray/ray_current_cluster``, where a plain ``ray.init()`` on this machine (the deploy CLI
    without --address, tests/integration/test_deploy_cli.py on another pytest-xdist worker) would find
    it and join it. A short path: Ray's Unix sockets live under it."""
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="raymn-", dir="/tmp")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", temp_dir)
        yield from _cluster(ray, Cluster)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _cluster(ray, Cluster) -> Iterator[MultiNode]:
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        # No CPUs to lend either: simulated engines reserve no GPU, and nothing but Ray's own
        # zero-CPU actors (Serve's controller, the router, the sweep's cache) may land on the head.
        "num_cpus": 0, "num_gpus": 0, "include_dashboard": False, "env_vars": {NODE_ENV: "head", **SERVE_ENV},
        # A lost raylet is declared dead after 3 missed 1 s health checks instead of 5 x 3 s.
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                           "health_check_timeout_ms": 1000},
    })
    mn = MultiNode(cluster, {cluster.head_node.node_id: "head"})
    try:
        for _ in range(GPU_NODES):
            mn.add_gpu_node()
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield mn
    finally:
        ray.shutdown()
        cluster.shutdown()


# ----- engines, found through /proc --------------------------------------------------------------------
@dataclass(frozen=True)
class EngineSeen:
    pid: int
    node: str  # the MTP_TEST_NODE label it inherited
    log: str  # its stdout: a file under the run's engine-logs folder
    argv: tuple[str, ...]

    def flag(self, name: str) -> str | None:
        """The value of ``name`` (its last occurrence wins, as with argparse)."""
        at = [i for i, a in enumerate(self.argv[:-1]) if a == name]
        return self.argv[at[-1] + 1] if at else None


def engines_under(folder: Path) -> list[EngineSeen]:
    """Live ``orchestrator.sim`` processes whose stdout is a file under ``folder``."""
    folder_s = str(folder.resolve())
    found = []
    for proc in live_processes():
        if "orchestrator.sim" not in proc.argv:
            continue
        log = proc.stdout()
        if log is None or not log.startswith(folder_s):
            continue
        found.append(EngineSeen(proc.pid, proc.env().get(NODE_ENV, "?"), log, proc.argv))
    return found


class EngineWatch:
    """Samples the engines under a folder every ``period_s`` while the ``with`` body runs."""

    def __init__(self, folder: Path, period_s: float = 0.2) -> None:
        self.folder, self.period_s = folder, period_s
        self.samples: list[tuple[float, list[EngineSeen]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), engines_under(self.folder)))
            self._stop.wait(self.period_s)

    def __enter__(self) -> EngineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def most_at_once(self) -> int:
        return max((len(engines) for _, engines in self.samples), default=0)

    def most_on_one_node(self) -> int:
        return max((max(_count(e.node for e in engines).values(), default=0) for _, engines in self.samples),
                   default=0)

    def trial_nodes(self) -> dict[str, set[str]]:
        """Trial id (the engine log's folder) -> the nodes its engines ran on."""
        out: dict[str, set[str]] = {}
        for _, engines in self.samples:
            for e in engines:
                out.setdefault(Path(e.log).parent.name, set()).add(e.node)
        return out


def _count(items: object) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:  # type: ignore[attr-defined]
        out[x] = out.get(x, 0) + 1
    return out


# ----- the sweep ------------------------------------------------------------------------------------------
def _point(role: str, drafts: int, *flags: str) -> NamedPoint:
    return NamedPoint(role, {"speculative": True, "num_draft_tokens": drafts, "memory_fraction": 0.8,
                             "max_batch_size": 64}, (*FAST, *flags))


def _sweep_spec(run_dir: Path, points: tuple[NamedPoint, ...], *, resources: dict[str, float],
                max_concurrent: int) -> SweepSpec:
    """A tp=8 sweep whose trials are exactly ``points`` after the two baselines (the budget is their
    count, so the searcher adds none). ``resources``: what each trial reserves, as a tp=8 LMDeploy
    trial does (``{"cpu": 1, "gpu": 8}``); the simulator itself needs no GPU."""
    space = SearchSpace(engine="sim", model=PROFILE, tp=8, num_draft_tokens=(1, 2, 3, 4, 5, 6),
                        memory_fraction=(0.8,), max_batch_size=(64,), extra_flags=FAST).with_baselines()
    space = space.replace(points=(*space.points, *points))
    # Concurrency 8: short outputs lose with MTP, long ones gain (the buckets disagree). The burn-in
    # run keeps the first bucket's figure out of the seconds when three engines start at once on this
    # machine's two cores (on separate hosts they would not compete).
    buckets = make_buckets((256, 4096), input_len=128, concurrency_levels=(8,), num_prompts=8)
    return SweepSpec(sweep_id=run_dir.name, run_dir=str(run_dir), space=space, buckets=buckets,
                     sim_time_scale=SIM_TIME_SCALE, steady_state=None, max_concurrent_trials=max_concurrent,
                     n_startup_trials=3, ready_timeout_s=60, trial_resources=resources, burn_in=True)


TP8 = {"cpu": 1, "gpu": GPUS_PER_NODE}
SIM_TIME_SCALE = 4.0
"""Three simulated engines and their clients share this host's two cores while the tp=8 trials run at
once; at 8 the fastest engine (MTP off, short outputs) fell ~20 % behind its single-node figure beside
another test file's load and flipped a bucket's choice. At 4 each needs half the CPU."""


@pytest.mark.slow
def test_tp8_trials_take_one_whole_node_each_and_commit_the_one_node_table(multinode, tmp_path):
    """Three tp=8 trials on three 8-GPU nodes: they run at once, one per node (a trial's 8 GPUs are one
    placement bundle, which Ray never splits across nodes, and a node has room for one); each engine
    starts on its trial's node; the committed table is the one a one-node run of the same trials
    commits."""
    points = (_point("drafts_6", 6),)
    multi = _sweep_spec(tmp_path / "multi", points, resources=TP8, max_concurrent=GPU_NODES)
    with EngineWatch(Path(multi.run_dir)) as watch:
        out = run_sweep(multi, num_trials=3, live=False)
    assert out.error is None, out.error
    assert (out.results.status == "ok").all(), out.results[["role", "status", "failure_reason"]]

    trial_nodes = watch.trial_nodes()
    assert sorted(trial_nodes) == sorted(out.results.trial_id.unique()), trial_nodes  # every trial's engine seen
    assert all(len(nodes) == 1 and next(iter(nodes)).startswith("gpu-") for nodes in trial_nodes.values()), trial_nodes
    assert watch.most_on_one_node() == 1, "two tp=8 engines ran on one 8-GPU node"
    assert watch.most_at_once() == GPU_NODES, f"expected {GPU_NODES} trials at once, saw {watch.most_at_once()}"
    assert len(set().union(*trial_nodes.values())) == GPU_NODES

    # The same trials on one node (pinned by that node's own resource): one at a time, same choices.
    label = multinode.gpu_labels()[0]
    one = _sweep_spec(tmp_path / "one", points, resources={**TP8, f"node_{label}": 1}, max_concurrent=GPU_NODES)
    with EngineWatch(Path(one.run_dir)) as watch_one:
        single = run_sweep(one, num_trials=3, live=False)
    assert single.error is None, single.error
    assert set().union(*watch_one.trial_nodes().values()) == {label} and watch_one.most_at_once() == 1

    multi_table = routing.load(Path(multi.run_dir) / "routing_table.json")
    one_table = routing.load(Path(one.run_dir) / "routing_table.json")
    chosen = {b.name: b.engine_config().key() for b in multi_table.buckets}
    one_chosen = {b.name: b.engine_config().key() for b in one_table.buckets}
    if chosen != one_chosen:
        # Three simulated tp=8 engines share this host's two cores; where the fastest falls behind its
        # schedule (after the sweep's own re-measurements), its figures rank nothing and the sweep says so.
        late = len(behind_schedule_rows(out.results)) + len(behind_schedule_rows(single.results))
        assert late, f"the tables differ ({chosen} vs {one_chosen}) though every engine kept its schedule"
    assert len(set(one_chosen.values())) == 2, one_chosen  # the buckets disagree, so the comparison means something
    print("trial -> node:", {t: sorted(n) for t, n in trial_nodes.items()},
          "node ids:", {lbl: nid for nid, lbl in multinode.labels.items()})


def test_losing_a_node_mid_trial_fails_that_trial_keeps_the_others_and_commits(multinode, tmp_path):
    """Three tp=8 trials, one per node; once the two baselines have reported, the raylet of the third
    (its engine still starting) is killed. That trial ends failed with the reason, the finished
    trials keep their rows, and the sweep commits its table."""
    slow = _point("on_lost_node", 2, "--startup-delay", "120")  # 30 s of wall-clock start-up at scale 4
    spec = _sweep_spec(tmp_path / "loss", (slow,), resources=TP8, max_concurrent=GPU_NODES)
    result: dict[str, object] = {}
    sweep = threading.Thread(target=lambda: result.update(out=run_sweep(spec, num_trials=3, live=False)),
                             name="sweep", daemon=True)
    victim = None
    with EngineWatch(Path(spec.run_dir)) as watch:
        sweep.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sweep.is_alive():
            victim = next((e for e in engines_under(Path(spec.run_dir)) if e.flag("--startup-delay") == "120"), None)
            if victim is not None and len(reported_trial_ids(spec.run_dir)) == 2:
                break
            time.sleep(0.2)
        assert victim is not None and len(reported_trial_ids(spec.run_dir)) == 2, "the baselines did not finish"
        lost_trial = Path(victim.log).parent.name
        finished_before = reported_trial_ids(spec.run_dir)
        multinode.remove(victim.node)
        sweep.join(timeout=240)
    try:
        assert not sweep.is_alive(), "the sweep did not finish after the node loss"
        out = result["out"]
        assert out.error is None, out.error
        df = out.results
        assert df.trial_id.nunique() == 3 and set(finished_before) < set(df.trial_id)
        lost = df[df.trial_id == lost_trial]
        assert (lost.status == "failed").all(), lost
        reason = str(lost.failure_reason.iloc[0])
        # Ray words the lost actor by timing: "died" (the node was declared dead first) or "unavailable"
        # (its worker's socket closed first, e.g. a reused trial worker); either way it names the actor.
        assert reason.startswith("trial errored") and "actor" in reason.lower(), reason
        assert "died" in reason or "unavailable" in reason, reason
        kept = df[df.trial_id.isin(finished_before)]
        assert (kept.status == "ok").all() and set(kept.role) == {ROLE_MTP_OFF, ROLE_STATIC}, kept
        assert routing.load(Path(spec.run_dir) / "routing_table.json").version == 1
        assert watch.trial_nodes()[lost_trial] == {victim.node}
        print("lost trial", lost_trial, "on", victim.node, "reason:", reason[:300])
    finally:
        _reap(victim)
        multinode.add_gpu_node()
        multinode.cluster.wait_for_nodes()


def _reap(engine: EngineSeen | None) -> None:
    """Safety net: the lost node's engine dies with its raylet (seen here within seconds); should one
    ever outlive it, it must not outlive the test."""
    if engine is None:
        return
    import signal

    try:
        os.killpg(engine.pid, signal.SIGKILL)
    except OSError:
        pass


# ----- serving ---------------------------------------------------------------------------------------------
APP = "mtp-multinode"
OFF = dict(backend="sim", model=PROFILE, tp=8)
BUCKET_CONFIGS = {  # bucket -> engine config: one engine deployment per bucket
    "le256": OFF,
    "le1024": {**OFF, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 2},
    "le4096": {**OFF, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 4},
}
DEPLOYMENTS = ["router", *(EngineConfig(**c).key() for c in BUCKET_CONFIGS.values())]
"""Deployment names replica titles are matched against (a deploy with other engine flags adds its keys)."""


def replicas_by_node(app: str = APP) -> dict[str, list[str]]:
    return onehost.replicas_by_node(app, DEPLOYMENTS, NODE_ENV)


def running_replicas(app: str = APP) -> dict[str, int]:
    return onehost.running_replicas(app)


_wait = functools.partial(wait_for, timeout_s=90.0, period_s=0.5)


@pytest.fixture(scope="module")
def served(multinode, tmp_path_factory):
    """The app on the cluster: one engine deployment per bucket (scaling per test through
    ``deploy``), the router as ingress, HTTP on the head only."""
    from ray import serve

    from orchestrator.config import EngineConfig
    from orchestrator.fsutil import utc_now_iso
    from orchestrator.ports import find_free_port
    from orchestrator.serve.app import build_app

    base = tmp_path_factory.mktemp("serve")
    table_path = base / "routing_table.json"
    routing.commit({
        "provenance": {"model": PROFILE, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "multinode",
                       "created_at": utc_now_iso(), "simulated": True},
        "buckets": [{"name": b, "max_output_len": int(b[2:]), "config": EngineConfig(**c).to_dict(),
                     "figures": {"output_throughput": 1000.0}} for b, c in BUCKET_CONFIGS.items()],
        "default_max_tokens": 64,
    }, table_path)
    keys = {b: EngineConfig(**c).key() for b, c in BUCKET_CONFIGS.items()}
    port = find_free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})

    def deploy(*, time_scale: float, scaling: dict | None = None, startup_delay_s: float = 0.0) -> None:
        """(Re)deploy the app; ``startup_delay_s`` (simulated) makes every engine, and so every replacement
        replica, take that long to start, as a real model load does (the engine keys change with it)."""
        path = table_path
        configs = {b: EngineConfig(**c) for b, c in BUCKET_CONFIGS.items()}
        if startup_delay_s:
            configs = {b: c.replace(extra_flags=("--startup-delay", f"{startup_delay_s:g}")) for b, c in configs.items()}
            path = base / f"routing_table_startup_{startup_delay_s:g}.json"
            routing.commit({
                "provenance": {"model": PROFILE, "gpu_type": "none (simulated)", "gpu_count": 0,
                               "sweep_id": "multinode", "created_at": utc_now_iso(), "simulated": True},
                "buckets": [{"name": b, "max_output_len": int(b[2:]), "config": c.to_dict(),
                             "figures": {"output_throughput": 1000.0}} for b, c in configs.items()],
                "default_max_tokens": 64,
            }, path)
        keys.update({b: c.key() for b, c in configs.items()})
        DEPLOYMENTS.extend(k for k in keys.values() if k not in DEPLOYMENTS)
        args = {"routing_table": str(path), "sim_time_scale": time_scale, "scaling": scaling or {},
                "engine": {"log_dir": str(base / "engine-logs"), "health_check_period_s": 1.0,
                           "health_check_timeout_s": 3.0, "health_timeout_s": 1.0, "metrics_poll_s": 1.0,
                           "graceful_shutdown_timeout_s": 5.0, "graceful_shutdown_wait_loop_s": 0.5},
                "router": {"num_cpus": 0, "status_refresh_s": 0.5, "graceful_shutdown_wait_loop_s": 0.5}}
        serve.run(build_app(args), name=APP, route_prefix="/")

    try:
        yield {"url": f"http://127.0.0.1:{port}", "keys": keys, "deploy": deploy}
    finally:
        serve.shutdown()


def _complete(url: str, max_tokens: int, timeout_s: float = 60.0):  # noqa: ANN201
    import httpx

    return httpx.post(f"{url}/v1/completions", timeout=timeout_s,
                      json={"model": PROFILE, "prompt": "Tell me about Ray.", "max_tokens": max_tokens})


def _concurrently(fn, items):  # noqa: ANN001, ANN202
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(fn, items))


def _victim(served, startup_delay_s: float = 0.0) -> tuple[str, str, str]:  # noqa: ANN001
    """Deploy at half real speed (a stream of any bucket then lasts seconds, long enough to be cut) and
    pick the longest bucket whose only engine replica is on a GPU node without the router: (bucket,
    its engine deployment, that node)."""
    served["deploy"](time_scale=0.5, startup_delay_s=startup_delay_s)
    keys = served["keys"]
    placed = _wait("one replica per deployment", lambda: (lambda r: r if all(
        len(r.get(k, [])) == 1 for k in keys.values()) and r.get("router") else None)(replicas_by_node()))
    bucket, node = next((b, placed[k][0]) for b, k in reversed(keys.items())
                        if placed[k][0] not in ("head", placed["router"][0]))
    return bucket, keys[bucket], node


SHORTEST = {"le256": 16, "le1024": 257, "le4096": 1025}
"""The fewest output tokens that route to each bucket (the quickest request of that bucket)."""


@pytest.mark.slow
def test_losing_a_node_while_serving(multinode, served):
    """The node holding a bucket's only engine replica is lost with streams in flight: those streams
    end with an error naming the engine (never a silent truncation), requests sent right after the loss
    all succeed, the other buckets stay on their own engines, and the lost replica comes back on a node
    that remains."""
    import openai

    victim_bucket, victim_key, victim_node = _victim(served)
    url, keys = served["url"], served["keys"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    outcomes: list[tuple[str, str]] = []  # (kind, detail) per in-flight stream
    started = threading.Barrier(4)

    def stream() -> None:
        got, finish = 0, None
        try:
            for chunk in client.completions.create(model=PROFILE, prompt="Tell me about Ray.", stream=True,
                                                   max_tokens=int(victim_bucket[2:]),
                                                   extra_body={"ignore_eos": True}):
                got += 1
                finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
                if got == 1:
                    started.wait(timeout=30)
            # A stream that ends without a finish reason was cut short without saying so.
            outcomes.append(("completed" if finish else "truncated", f"{got} chunks, finish_reason {finish}"))
        except openai.APIError as e:
            outcomes.append(("error", str(e)))

    streams = [threading.Thread(target=stream, daemon=True) for _ in range(3)]
    for t in streams:
        t.start()
    started.wait(timeout=30)  # every stream has its first chunk: in flight on the victim's engine
    multinode.remove(victim_node)
    try:
        sent = [b for b in keys for _ in range(2)]
        after = _concurrently(lambda b: _complete(url, SHORTEST[b]), sent)
        for t in streams:
            t.join(timeout=60)
        assert [kind for kind, _ in outcomes] == ["error"] * 3, outcomes
        assert all(victim_key in detail and "failed mid-stream" in detail for _, detail in outcomes), outcomes
        assert [r.status_code for r in after] == [200] * len(after), [r.text[:200] for r in after]
        routes = [(b, r.headers.get("x-route-deployment"), r.headers.get("x-route-fallback")) for b, r in zip(sent, after)]
        assert all(dep == keys[b] for b, dep, _ in routes if b != victim_bucket), routes

        # Serve replaces the lost replica on a node that remains, and the bucket is served by it again.
        back = _wait("the lost replica back on another node", lambda: (lambda r: r if len(r.get(victim_key, [])) == 1
                     and r[victim_key][0] != victim_node and running_replicas().get(victim_key) == 1 else None)(
                         replicas_by_node()), timeout_s=120)
        again = _wait("the bucket served by its own engine again", lambda: (lambda r: r if r.status_code == 200
                      and r.headers.get("x-route-deployment") == victim_key else None)(
                          _complete(url, SHORTEST[victim_bucket])))
        assert "x-route-fallback" not in again.headers
        print(f"lost {victim_node} with {victim_bucket}; replica back on {back[victim_key][0]}; routes after the "
              f"loss {routes}; in-flight: {outcomes[0][1]}")
    finally:
        multinode.add_gpu_node()
        multinode.cluster.wait_for_nodes()


def test_new_requests_of_a_bucket_emptied_by_a_node_loss_fall_back_at_once(multinode, served):
    """Requests of the bucket whose only replica was on the lost node, sent right after the loss, are
    answered by the nearest bucket's engine (``x-route-fallback``), not held until Serve has started a
    replacement replica (with a real engine, a model load of minutes: here every engine takes 8 s of wall
    time to start, so the replacement cannot be up before the router has to decide)."""
    victim_bucket, victim_key, victim_node = _victim(served, startup_delay_s=4.0)
    url = served["url"]
    multinode.remove(victim_node)
    try:
        after = _concurrently(lambda _: _complete(url, SHORTEST[victim_bucket]), range(4))
        routes = [(r.status_code, r.headers.get("x-route-deployment"), r.headers.get("x-route-fallback"))
                  for r in after]
        assert all(status == 200 and dep != victim_key and fallback for status, dep, fallback in routes), routes
    finally:
        multinode.add_gpu_node()
        multinode.cluster.wait_for_nodes()


@pytest.mark.slow
def test_a_load_ramp_scales_one_buckets_engines_out_across_nodes_and_back(multinode, served):
    """Closed-loop clients on one bucket, 2 then 8 at once, then none: that bucket's engine deployment
    (autoscaled, target 1 request in flight per replica) grows onto other nodes and shrinks back to
    one replica after the ramp; every request completes."""
    import httpx

    bucket = "le1024"
    served["deploy"](time_scale=2.0, scaling={bucket: {"min_replicas": 1, "max_replicas": 3,
                                                       "target_ongoing_requests": 1, "upscale_delay_s": 0,
                                                       "downscale_delay_s": 1, "look_back_period_s": 11}})
    url, key = served["url"], served["keys"][bucket]
    _wait("the app at one replica per deployment", lambda: all(v == 1 for v in running_replicas().values())
          and len(running_replicas()) == 4)
    results: list[tuple[int, str | None]] = []
    timeline: list[tuple[float, int, list[str]]] = []  # (t, running replicas, their nodes)
    stop_load, stop_watch = threading.Event(), threading.Event()

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop_load.is_set():
                r = http.post(f"{url}/v1/completions", json={"model": PROFILE, "prompt": "Tell me about Ray.",
                                                               "max_tokens": 1024, "ignore_eos": True})
                finish = r.json()["choices"][0].get("finish_reason") if r.status_code == 200 else None
                results.append((r.status_code, finish))

    def watch() -> None:
        t0 = time.monotonic()
        while not stop_watch.is_set():
            timeline.append((round(time.monotonic() - t0, 1), running_replicas().get(key, 0),
                             replicas_by_node().get(key, [])))
            stop_watch.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    clients = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for c in clients:
        c.start()
    time.sleep(4)
    more = [threading.Thread(target=client, daemon=True) for _ in range(6)]
    for c in more:
        c.start()
    try:
        _wait("the bucket's engines on more than one node", lambda: len(set(replicas_by_node().get(key, []))) > 1,
              timeout_s=60)
        time.sleep(4)  # the ramp's top, served by the grown deployment
    finally:
        stop_load.set()
        for c in clients + more:
            c.join(timeout=60)
    try:
        _wait("the deployment back at one replica", lambda: running_replicas().get(key) == 1
              and len(replicas_by_node().get(key, [])) == 1, timeout_s=120)
    finally:
        stop_watch.set()
        watcher.join()
    # Grown onto another node at some moment the watcher saw (the first sample at the most replicas can
    # come while a new replica still starts, before it is listed on its node).
    assert any(n >= 2 and len(set(nodes)) >= 2 for _, n, nodes in timeline), timeline
    assert results and all(status == 200 and finish == "length" for status, finish in results), results
    print(f"{len(results)} requests, all complete; replicas over time: {timeline}")
