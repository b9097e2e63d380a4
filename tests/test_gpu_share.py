"""Engines sharing a GPU (``--share-gpu``): what each reserves, how many run at once, and the per-GPU
measurement lease that keeps neighbours out of each other's figures (real Ray actors and threads)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from orchestrator.config import SHARED_GPU_HEADROOM, EngineConfig
from orchestrator.errors import ConfigError
from tuning.space import ROLE_STATIC
from tuning.sweep import _parser, build_spec
from tuning.trial import GpuMeasureLease, measure_lease


def test_gpu_request_is_tp_unless_a_tp1_engine_shares():
    cfg = EngineConfig(model="/m", memory_fraction=0.3)
    assert cfg.gpu_request() == 1
    assert cfg.gpu_request(share_gpu=True) == pytest.approx(0.3 + SHARED_GPU_HEADROOM)
    assert EngineConfig(model="/m", memory_fraction=0.95).gpu_request(share_gpu=True) == 1.0
    assert EngineConfig(model="/m", tp=2, memory_fraction=0.3).gpu_request(share_gpu=True) == 2
    assert EngineConfig(backend="sim", model="p", tp=8).gpu_request(share_gpu=True) == 0


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    return d


def test_shared_sweep_reserves_each_trials_fraction_and_runs_as_many_as_fit(tmp_path):
    args = _parser().parse_args(["--model", str(_model_dir(tmp_path)), "--tp", "1", "--share-gpu",
                                 "--memory-fraction", "0.2,0.3", "--run-dir", str(tmp_path / "r")])
    spec = build_spec(args, cluster_gpus=1)
    assert spec.share_gpu
    assert spec.max_concurrent_trials == 3  # 1 GPU / (0.2 + 0.1)
    ctx = spec.trial_context("cache", "ns")
    assert ctx.measure_lease_actor == spec.measure_lease_name()

    def gpu_of(point_params):
        pgf = spec.resources_for(point_params)
        (bundle,) = pgf.bundles
        return bundle["GPU"]

    static = next(p for p in spec.space.points if p.role == ROLE_STATIC)
    assert gpu_of(static.params) == pytest.approx(0.8 + SHARED_GPU_HEADROOM)  # runs alone
    assert gpu_of({"speculative": True, "num_draft_tokens": 2, "memory_fraction": 0.2,
                   "max_batch_size": 256}) == pytest.approx(0.3)
    # An invalid point keeps the fixed request (the trial then reports the invalid config itself).
    assert gpu_of({"speculative": "maybe"}) == 1


def test_share_gpu_is_refused_for_tp_above_one(tmp_path):
    args = _parser().parse_args(["--model", str(_model_dir(tmp_path)), "--tp", "2", "--share-gpu",
                                 "--run-dir", str(tmp_path / "r")])
    with pytest.raises(ConfigError, match="tp=1"):
        build_spec(args, cluster_gpus=2)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


def test_measurement_lease_lets_one_trial_per_gpu_measure(ray_local):
    lease = ray_local.remote(GpuMeasureLease).remote()
    intervals: dict[str, tuple[float, float]] = {}

    def measure(holder: str, gpu: str) -> None:
        with measure_lease(lease, [gpu], holder, poll_s=0.05):
            start = time.monotonic()
            time.sleep(0.6)
            intervals[holder] = (start, time.monotonic())

    threads = [threading.Thread(target=measure, args=(h, g)) for h, g in
               (("a", "node:0"), ("b", "node:0"), ("c", "node:1"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    (a0, a1), (b0, b1), (c0, c1) = intervals["a"], intervals["b"], intervals["c"]
    assert a1 <= b0 or b1 <= a0, "two trials measured on one GPU at the same time"
    first_end = min(a1, b1)
    assert c0 < first_end, "a trial on another GPU waited for GPU 0's lease"
    assert ray_local.get(lease.holders.remote()) == {}


def test_a_dead_holders_lease_expires(ray_local):
    lease = ray_local.remote(GpuMeasureLease).remote(ttl_s=0.5)
    assert ray_local.get(lease.try_acquire.remote("n:0", "dead-trial"))  # never renewed or released
    assert not ray_local.get(lease.try_acquire.remote("n:0", "next-trial"))
    t0 = time.monotonic()
    with measure_lease(lease, ["n:0"], "next-trial", poll_s=0.05):
        waited = time.monotonic() - t0
    assert 0.3 < waited < 5


def test_a_lease_is_renewed_while_its_holder_measures(ray_local):
    lease = ray_local.remote(GpuMeasureLease).remote(ttl_s=0.4)
    with measure_lease(lease, ["n:0"], "slow", poll_s=0.05, renew_s=0.1):
        time.sleep(1.0)  # well past the ttl: only renewal keeps it
        assert not ray_local.get(lease.try_acquire.remote("n:0", "other"))
    assert ray_local.get(lease.try_acquire.remote("n:0", "other"))


# ----- Serve: replicas of a shared GPU, and a table that does not fit is refused up front -------------------
def _table(path: Path, configs) -> Path:
    from tuning import routing

    data = {
        "provenance": {"model": "/ckpt", "gpu_type": "H200", "gpu_count": 1, "sweep_id": "s",
                       "created_at": routing.utc_now_iso(), "simulated": False},
        "buckets": [{"name": f"le{256 * 4 ** i}", "max_output_len": 256 * 4 ** i, "config": c.to_dict(),
                     "figures": {"output_throughput": 1.0}} for i, c in enumerate(configs)],
    }
    routing.commit(data, path)
    return path


MTP3 = EngineConfig(model="/ckpt", speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3, memory_fraction=0.3)
MTP4 = MTP3.replace(num_draft_tokens=4)


def test_shared_replicas_reserve_their_fraction_and_the_table_must_fit(tmp_path):
    from orchestrator.serve.app import AppArgs, build_app, load_table, resources_needed

    path = _table(tmp_path / "t.json", [MTP3, MTP4])
    args = AppArgs.parse({"routing_table": str(path), "engine": {"share_gpu": True},
                          "scaling": {"le256": {"num_replicas": 2}}})
    app = build_app(args)
    engines = {k: v._bound_deployment for k, v in app._bound_deployment.init_args[1].items()}
    assert engines[MTP3.key()]._replica_config.ray_actor_options["num_gpus"] == pytest.approx(0.4)
    assert resources_needed(args, load_table(args)) == {"GPU": pytest.approx(3 * 0.4), "CPU": 4}  # + router
    unshared = AppArgs.parse({"routing_table": str(path)})
    assert resources_needed(unshared, load_table(unshared))["GPU"] == 2


def test_deploy_refuses_a_table_whose_engines_do_not_fit_the_cluster(tmp_path, ray_local):
    """A replica that can never be placed would sit pending for ever; deploy says so and starts nothing."""
    from ray import serve

    from orchestrator.deploy import deploy

    path = _table(tmp_path / "t.json", [MTP3, MTP4])
    with pytest.raises(ConfigError, match="reserves 0.8 GPUs .* cluster has 0"):
        deploy({"routing_table": str(path), "engine": {"share_gpu": True}}, app_name="too-big")
    assert "too-big" not in serve.status().applications
