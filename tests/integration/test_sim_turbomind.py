"""The simulated TurboMind end to end (#19 items 4 and 5 on the simulator): a sweep measures it next to
the PyTorch engine with and without MTP and commits it to the routing table; a table mixing a
TurboMind replica and a PyTorch+MTP replica deploys on Serve, routes, and each engine's own counters
show where the requests went. Profile: the 83M test checkpoint's, whose TurboMind constants are fitted
to the H200 measurement (there TurboMind wins by 3-4x, so the sweep must pick it)."""
from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pandas as pd
import pytest

from orchestrator import table as routing
from orchestrator.config import Backend, EngineConfig
from orchestrator.serve.metrics import ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS, RUNNING, WAITING, parse_prometheus_text
from tuning.buckets import make_buckets
from tuning.sweep import SweepSpec, run_sweep
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH, ROLE_STATIC, SearchSpace

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

PROFILE = "qwen35-test-83m-1xh200"
FAST = ("--startup-delay", "1")
APP = "mtp-turbomind-test"
TURBOMIND = EngineConfig(backend="sim", model=PROFILE, tp=1, simulated_backend="turbomind")
MTP3 = EngineConfig(backend="sim", model=PROFILE, tp=1, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)

pytestmark = pytest.mark.timeout(300)


def test_a_sweep_measures_turbomind_and_commits_it_where_it_wins(tmp_path):
    space = SearchSpace(engine="sim", model=PROFILE, tp=1, num_draft_tokens=(3,), memory_fraction=(0.8,),
                        max_batch_size=(64,), off_backends=("pytorch", "turbomind"), extra_flags=FAST).with_baselines()
    buckets = make_buckets((256,), input_len=256, concurrency_levels=(8,), num_prompts=16)
    spec = SweepSpec(sweep_id="tm", run_dir=str(tmp_path / "tm"), space=space, buckets=buckets, sim_time_scale=2.0,
                     steady_state=None, max_concurrent_trials=2, n_startup_trials=3, ready_timeout_s=60)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = run_sweep(spec, num_trials=3, live=False)
    finally:
        ray.shutdown()
    assert out.error is None, out.error

    df = pd.read_parquet(Path(spec.run_dir) / "results.parquet")
    assert set(df.role) == {ROLE_MTP_OFF, ROLE_STATIC, ROLE_SEARCH} and (df.status == "ok").all()
    by_engine = df.set_index(df.simulated_backend.fillna("pytorch") + "/" + df.speculative.astype(str))
    tm, off = by_engine.loc["turbomind/False"], by_engine.loc["pytorch/False"]
    assert tm.engine_label.startswith("sim-turbomind-nospec") and pd.isna(tm.accept_length)
    assert tm.output_throughput > 2.5 * off.output_throughput  # the fitted launch-bound gap, through HTTP

    table = routing.load(Path(spec.run_dir) / "routing_table.json")
    chosen = table.bucket("le256").engine_config()
    assert chosen.engine_name == Backend.TURBOMIND and not chosen.speculative
    assert table.bucket("le256").gains["mtp_off"] > 1.5
    argv = chosen.command(host="127.0.0.1", port=1)
    assert argv[argv.index("--backend") + 1] == "turbomind"


@pytest.fixture(scope="module")
def mixed_app(tmp_path_factory, write_sim_table, sim_app_args, serve_app):
    tmp = tmp_path_factory.mktemp("turbomind-serve")
    table_path = write_sim_table(tmp / "routing.json", [("le256", 256, TURBOMIND), ("le4096", 4096, MTP3)],
                                 sweep_id="test-turbomind", default_max_tokens=128)
    args = sim_app_args(table_path, tmp / "engine-logs", sim_time_scale=5.0,
                        engine={"health_check_period_s": 1, "metrics_poll_s": 1})
    with serve_app(args, app_name=APP, num_cpus=4) as base:
        yield base


def _engine_url(config: EngineConfig) -> str:
    return serve.get_deployment_handle(config.key(), app_name=APP).engine_info.remote().result(timeout_s=30)["base_url"]


def _metrics(config: EngineConfig) -> dict[str, float]:
    return parse_prometheus_text(httpx.get(_engine_url(config) + "/metrics", timeout=10).text)


def test_a_table_mixing_turbomind_and_mtp_replicas_routes_and_the_engines_counters_agree(mixed_app):
    client = openai.OpenAI(base_url=mixed_app + "/v1", api_key="unused", max_retries=0, timeout=120)
    info = httpx.get(_engine_url(TURBOMIND) + "/sim/info", timeout=10).json()
    assert info["simulated"] and info["backend"] == "turbomind" and "83M" in info["backend_fitted_on"]

    served = client.models.list().data[0].id  # the table's model name (the engines run PROFILE)
    before = {cfg.key(): _metrics(cfg) for cfg in (TURBOMIND, MTP3)}
    for max_tokens, engine in ((16, TURBOMIND), (300, MTP3), (16, TURBOMIND)):
        raw = client.completions.with_raw_response.create(model=served, prompt="Once upon a time",
                                                          max_tokens=max_tokens, temperature=0.0)
        assert raw.headers["x-route-deployment"] == engine.key()
        assert raw.parse().usage.completion_tokens <= max_tokens
    after = {cfg.key(): _metrics(cfg) for cfg in (TURBOMIND, MTP3)}

    def moved(cfg: EngineConfig, name: str) -> float:
        return after[cfg.key()].get(name, 0.0) - before[cfg.key()].get(name, 0.0)

    assert moved(TURBOMIND, "sim_requests_total") == 2 and moved(MTP3, "sim_requests_total") == 1
    # LMDeploy's metrics logger is the same for both engines: TurboMind's /metrics carries the same
    # names, its speculative-decoding counters registered and never moving (it never drafts).
    assert set(after[TURBOMIND.key()]) == set(after[MTP3.key()])
    assert {RUNNING, WAITING, DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS} <= set(after[TURBOMIND.key()])
    assert all(after[TURBOMIND.key()][n] == 0 for n in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS))
    assert moved(MTP3, DRAFTS) > 0 and moved(MTP3, ACCEPTED_TOKENS) > 0
