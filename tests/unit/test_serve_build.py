"""Building the Serve app from a table: deployments per config, GPUs, autoscaling per bucket, stable
versions (unchanged engines are not restarted by an update), and the `serve deploy` config. No Ray
cluster is started: ``build_app`` only builds the application graph."""
from __future__ import annotations

import pytest
import yaml

from orchestrator.config import EngineConfig
from orchestrator.deploy import main as deploy_main
from orchestrator.errors import ConfigError
from orchestrator.serve.app import build_app
from orchestrator import table as routing
from orchestrator.fsutil import utc_now_iso

pytest.importorskip("ray.serve")

MODEL = "intern-s2-preview-8xh200"
GPU = EngineConfig(backend="pytorch", model="/models/intern-s2", tp=4)
GPU_MTP = GPU.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)
SIM = EngineConfig(backend="sim", model=MODEL, tp=8)


def _commit(path, configs, variants=()):
    data = {
        "provenance": {"model": MODEL, "gpu_type": "H200", "gpu_count": 8, "sweep_id": "s",
                       "created_at": utc_now_iso(), "simulated": False},
        "buckets": [
            {"name": f"le{1024 * 4 ** i}", "max_output_len": 1024 * 4 ** i, "config": c.to_dict(),
             "figures": {"output_throughput": 1.0}}
            for i, c in enumerate(configs)
        ],
    }
    if variants:
        data["buckets"][0]["cells"] = [{"min_in_flight": 64 * (i + 1), "config": v.to_dict(),
                                        "figures": {"output_throughput": 1.0}} for i, v in enumerate(variants)]
    return routing.commit(data, path)


def _engines(app) -> dict:
    return {k: v._bound_deployment for k, v in app._bound_deployment.init_args[1].items()}


def test_one_deployment_per_distinct_config_with_gpus_and_scaling(tmp_path):
    path = tmp_path / "t.json"
    _commit(path, [GPU_MTP, SIM, GPU_MTP], variants=[GPU])  # le1024 and le16384 share a config
    app = build_app({"routing_table": str(path), "scaling": {
        "le1024": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 48},
        "default": {"num_replicas": 2}}})
    engines = _engines(app)
    assert set(engines) == {GPU_MTP.key(), GPU.key(), SIM.key()}
    mtp = engines[GPU_MTP.key()]
    assert mtp._replica_config.ray_actor_options["num_gpus"] == 4
    auto = mtp._deployment_config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (1, 4, 48)
    assert engines[SIM.key()]._replica_config.ray_actor_options["num_gpus"] == 0
    assert engines[SIM.key()]._deployment_config.num_replicas == 2
    assert engines[GPU.key()]._deployment_config.num_replicas == 2  # load cell: default scaling
    router = app._bound_deployment
    assert router.name == "router" and router._deployment_config.max_surge_percent == 100


def test_versions_change_only_for_what_changed(tmp_path):
    path = tmp_path / "t.json"
    _commit(path, [GPU_MTP, SIM])
    v1 = build_app({"routing_table": str(path)})
    _commit(path, [GPU, SIM])  # first bucket's config changes
    v2 = build_app({"routing_table": str(path)})
    assert _engines(v1)[SIM.key()]._version == _engines(v2)[SIM.key()]._version  # SIM engine not restarted
    assert v1._bound_deployment._version != v2._bound_deployment._version  # router rolls (new table)
    assert build_app({"routing_table": str(path)})._bound_deployment._version == v2._bound_deployment._version


@pytest.mark.parametrize("args, message", [
    ({"scaling": {"le9": {"num_replicas": 1}}}, "match no bucket"),
    ({"scaling": {"default": {"num_replicas": 1, "max_replicas": 3}}}, "either num_replicas"),
    ({"scaling": {"default": {"max_replicas": 3, "look_back_period_s": 2}}}, "longer than Serve's metrics interval"),
    ({"engine": {"health_timeout_s": 40}}, "health_check_timeout_s"),
    ({"bogus": 1}, "bogus"),
])
def test_invalid_args_are_refused(tmp_path, args, message):
    path = tmp_path / "t.json"
    _commit(path, [GPU_MTP, SIM])
    with pytest.raises(ConfigError, match=message):
        build_app({"routing_table": str(path), **args})


def test_cli_writes_a_pinned_serve_config_and_refuses_bad_input(tmp_path, capsys):
    path = tmp_path / "t.json"
    _commit(path, [GPU_MTP, SIM])
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-secret-1\n")
    out = tmp_path / "serve.yaml"
    assert deploy_main(["--routing-table", str(path), "--write-serve-config", str(out), "--api-key-file", str(keys),
                        "--scale", "le1024=1:8:32"]) == 0
    text = out.read_text()
    assert "sk-secret-1" not in text
    args = yaml.safe_load(text)["applications"][0]["args"]
    assert args["scaling"]["le1024"]["max_replicas"] == 8 and len(args["api_key_sha256"]) == 1
    assert yaml.safe_load(text)["http_options"]["host"] == "127.0.0.1"  # nothing public unless asked
    public = tmp_path / "public.yaml"
    assert deploy_main(["--routing-table", str(path), "--write-serve-config", str(public), "--http-host", "0.0.0.0"]) == 0
    assert yaml.safe_load(public.read_text())["http_options"]["host"] == "0.0.0.0"
    # A changed table no longer matches the pin: the builder refuses instead of serving an unvetted table.
    _commit(path, [GPU, SIM])
    with pytest.raises(routing.RoutingTableError, match="regenerate"):
        build_app(args)
    assert deploy_main(["--routing-table", str(tmp_path / "missing.json")]) == 2
    assert deploy_main(["--routing-table", str(path), "--scale", "le1024=x"]) == 2
    assert "Nothing was deployed" in capsys.readouterr().err


def test_engine_options_reach_every_engine_replica(tmp_path):
    path = tmp_path / "t.json"
    _commit(path, [SIM])
    app = build_app({"routing_table": str(path), "engine": {"metrics_poll_s": 2.0, "accept_length_window_s": 20.0,
                                                            "graceful_shutdown_wait_loop_s": 0.5},
                     "router": {"graceful_shutdown_wait_loop_s": 0.25}})
    (node,) = app._bound_deployment.init_args[1].values()
    kwargs = node._bound_deployment.init_kwargs
    assert (kwargs["metrics_poll_s"], kwargs["accept_length_window_s"]) == (2.0, 20.0)
    assert node._bound_deployment._deployment_config.graceful_shutdown_wait_loop_s == 0.5
    assert app._bound_deployment._deployment_config.graceful_shutdown_wait_loop_s == 0.25
