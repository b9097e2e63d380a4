"""The CPUs an engine replica reserves: a measured fraction for simulated engines, so the default
sweep's table deploys on the 2-core machine that swept it; a whole CPU for LMDeploy; ``num_cpus`` when
given (pure: tables on disk, no Ray)."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError
from orchestrator.sim.resources import ENGINE_CPUS


def _sim(drafts: int) -> EngineConfig:
    return EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8, memory_fraction=0.8,
                        speculative_algorithm="qwen3_5_mtp", num_draft_tokens=drafts)


def _lmdeploy(drafts: int) -> EngineConfig:
    return EngineConfig(model="/ckpt", tp=1, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=drafts,
                        memory_fraction=0.5)


def _app(path: Path, **args):
    from orchestrator.serve.app import AppArgs, load_table

    app_args = AppArgs.parse({"routing_table": str(path), **args})
    return app_args, load_table(app_args)


def test_the_simulated_fraction_is_below_a_whole_cpu():
    assert 0 < ENGINE_CPUS < 1


def test_four_simulated_engines_and_the_router_fit_two_cpus(tmp_path, write_table):
    """The default sweep's table has at most four configs (one per bucket): 1 + 4 x 0.25 CPUs."""
    from orchestrator.serve.app import check_resources, resources_needed

    args, table = _app(write_table(tmp_path / "t.json", [_sim(d) for d in (1, 2, 3, 4)]))
    assert resources_needed(args, table) == {"GPU": 0, "CPU": pytest.approx(1 + 4 * ENGINE_CPUS)}
    check_resources(args, table, {"CPU": 2})
    with pytest.raises(ConfigError, match=r"reserves 2 CPUs .* cluster has 1\.5"):
        check_resources(args, table, {"CPU": 1.5})


def test_lmdeploy_engines_reserve_a_whole_cpu_and_num_cpus_overrides_both(tmp_path, write_table):
    from orchestrator.serve.app import resources_needed

    args, table = _app(write_table(tmp_path / "gpu.json", [_lmdeploy(1), _lmdeploy(2)]))
    assert resources_needed(args, table)["CPU"] == pytest.approx(1 + 2 * 1.0)
    args, table = _app(write_table(tmp_path / "sim.json", [_sim(1), _sim(2)]), engine={"num_cpus": 0.5})
    assert resources_needed(args, table)["CPU"] == pytest.approx(1 + 2 * 0.5)
    assert args.engine.cpus_for(_lmdeploy(1)) == 0.5


def test_the_built_app_reserves_what_the_check_counted(tmp_path, write_table):
    from orchestrator.serve.app import build_app

    args, table = _app(write_table(tmp_path / "mixed.json", [_sim(1), _lmdeploy(2)]))
    app = build_app(args, table=table)
    reserved = {k: v._bound_deployment.ray_actor_options["num_cpus"]
                for k, v in app._bound_deployment.init_args[1].items()}  # the router's bound engines
    assert reserved == {_sim(1).key(): ENGINE_CPUS, _lmdeploy(2).key(): 1.0}


def test_an_update_counts_each_running_and_new_engine_at_its_own_reservation(tmp_path, write_table):
    """Old and new engines run side by side until the router switches: the peak is the router, the
    running engines and the new ones, each at its backend's CPUs."""
    from orchestrator.serve.app import RunningEngine, check_resources

    args, table = _app(write_table(tmp_path / "new.json", [_sim(3), _sim(4)]))
    running = {c.key(): RunningEngine(c) for c in (_sim(1), _sim(2))}
    check_resources(args, table, {"CPU": 2}, running=running)  # 1 + 4 x 0.25
    three = {**running, _sim(5).key(): RunningEngine(_sim(5))}
    with pytest.raises(ConfigError, match=r"2\.25 CPUs at that peak"):  # 1 + 5 x 0.25
        check_resources(args, table, {"CPU": 2}, running=three)
    with pytest.raises(ConfigError, match=r"2\.5 CPUs at that peak"):  # one running engine at 3 replicas
        check_resources(args, table, {"CPU": 2}, running={**running, _sim(1).key(): RunningEngine(_sim(1), replicas=3)})
