"""`python -m tuning.report` on a synthetic simulated run dir, and its pure functions on hand-made frames.

The run dir is built the way the sweep builds one, without Ray: each config's bucket figures come from
the simulator's pure model (:func:`orchestrator.sim.simulate_workload`), rows from
:func:`tuning.results.rows_for_trial`, the table from :func:`tuning.choose.pick.pick_best` and
:func:`tuning.choose.commit.commit_table`.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.config import EngineConfig
from orchestrator.fsutil import utc_now_iso
from orchestrator.sim import load_profile, simulate_workload
from orchestrator.table import Provenance
from tuning import report
from tuning.buckets import make_buckets
from tuning.choose.commit import commit_table
from tuning.choose.pick import pick_best
from tuning.results import failed_rows, results_frame, rows_for_trial, write_results
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH, ROLE_STATIC

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "intern-s2-preview-8xh200"
BOUNDS = (1024, 4096, 8192)
BUCKET_NAMES = ("le1024", "le4096", "le8192")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAILED_REASON = "engine exited with exit code 3 before it was ready (CUDA out of memory)"


def _config(drafts: int, mem: float, bs: int = 64) -> EngineConfig:
    return EngineConfig(backend="sim", model=PROFILE, tp=8, speculative_algorithm="qwen3_5_mtp" if drafts else None,
                        num_draft_tokens=drafts, memory_fraction=mem, max_batch_size=bs)


def _bench(profile, cfg: EngineConfig, output_len: int, concurrency: int, prompts: int) -> dict:
    s = simulate_workload(profile, num_draft_tokens=cfg.num_draft_tokens, memory_fraction=cfg.memory_fraction,
                          max_batch_size=cfg.max_batch_size, output_len=output_len, num_prompts=prompts,
                          concurrency=concurrency, tp=cfg.tp)
    return {"output_throughput": s.output_throughput, "request_throughput": s.request_throughput,
            "accept_length": s.accept_length, "completed": s.completed, "failed": 0, "duration_s": s.duration_s,
            "simulated": True, "time_scale": 1.0,
            "ttft_ms": {"median": s.ttft_ms_median, "mean": s.ttft_ms_mean},
            "tpot_ms": {"median": s.tpot_ms_median, "mean": s.tpot_ms_mean},
            "e2e_ms": {"median": s.e2e_ms_median}}


def make_sim_run_dir(run_dir: Path, *, sweep_id: str = "sweep-synthetic") -> Path:
    """A run dir like the sweep's: 2 baselines, 4 searched configs and 1 failed trial over 3 buckets,
    figures from the simulator's pure model (a second or two). Returns ``run_dir``."""
    profile = load_profile(PROFILE)
    concurrency, prompts = 32, 32
    buckets = make_buckets(BOUNDS, concurrency_levels=(concurrency,), num_prompts=prompts)
    trials = [
        (ROLE_MTP_OFF, _config(0, 0.8)),
        (ROLE_STATIC, _config(4, 0.8)),
        (ROLE_SEARCH, _config(1, 0.85)),
        (ROLE_SEARCH, _config(2, 0.9)),
        (ROLE_SEARCH, _config(3, 0.9)),
        (ROLE_SEARCH, _config(0, 0.9, bs=128)),
    ]
    rows = []
    for i, (role, cfg) in enumerate(trials):
        measurements = {(b.name, concurrency): _bench(profile, cfg, b.max_output_len, concurrency, prompts)
                        for b in buckets}
        rows += rows_for_trial(sweep_id=sweep_id, trial_id=f"t{i:03d}", role=role, config=cfg, buckets=buckets,
                               measurements=measurements, engine_startup_s=5.0)
    rows += failed_rows(sweep_id=sweep_id, trial_id="t999", role=ROLE_SEARCH, config=_config(6, 0.95),
                        buckets=buckets, reason=FAILED_REASON)
    df = results_frame(rows)
    write_results(df, run_dir)
    provenance = Provenance(model=PROFILE, gpu_type="none (simulated)", gpu_count=8, sweep_id=sweep_id,
                            created_at=utc_now_iso(), simulated=True)
    commit_table(pick_best(df, buckets, provenance=provenance), run_dir / "routing_table.json")
    return run_dir


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory) -> Path:
    return make_sim_run_dir(tmp_path_factory.mktemp("report") / "sweep-synthetic")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuning.report", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_writes_pngs_and_a_self_contained_page(sim_run, tmp_path):
    out = tmp_path / "out"
    r = _cli(str(sim_run), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "SIMULATED" in r.stdout
    for name in report.FIGURE_FILES.values():
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(report.FIGURE_FILES)
    assert "SIMULATED" in page
    for name in BUCKET_NAMES:
        assert name in page
    assert "t999" in page and "exit code 3" in page  # the failed trial, with its reason
    assert "+15.68%" in page  # the published table is shown beside the measured gains
    assert "Mixed workload: the table vs one config everywhere" in page


def test_mixed_summary_of_gpu_run_5_is_the_cap_its_readme_quotes():
    """The committed H200 sweep of run 5: its README quotes the table at 15,363 tok/s predicted on the
    mixed workload, 1.083x the best single config (MTP-4, fraction 0.06, 14,191)."""
    run = report.load_run(ROOT / "benchmarks/results/gpu_e2e_h200_2026-11-30_run5/sweep_1gpu")
    mixed = report.mixed_summary(run.table, run.results)
    assert mixed["predicted_output_throughput"].iloc[0] == pytest.approx(15363, abs=1)
    assert mixed["deployment"].iloc[1] == "pytorch-mtp4-mem0.06-bs64-tp1 for every bucket"
    assert mixed["predicted_output_throughput"].iloc[1] == pytest.approx(14191, abs=1)
    assert 1 + mixed["table_vs_this"].iloc[1] == pytest.approx(1.083, abs=0.001)


def test_main_can_reference_the_pngs(sim_run, tmp_path):
    assert report.main([str(sim_run), "--out", str(tmp_path), "--no-embed", "--top", "1"]) == 0
    page = (tmp_path / "report.html").read_text()
    for name in report.FIGURE_FILES.values():
        assert f"src='{name}'" in page
    assert "data:image" not in page


def test_cli_exits_2_without_results(tmp_path):
    r = _cli(str(tmp_path))
    assert r.returncode == 2
    assert "results.parquet" in r.stderr and "tuning.sweep" in r.stderr
    assert not (tmp_path / "report").exists()


def test_help_and_missing_dir(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        report.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "RESULTS_DIR" in out and "--out" in out
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    pd.DataFrame(columns=["sweep_id", "status"]).to_csv(empty / "results.csv", index=False)
    assert report.main([str(empty)]) == 2
    assert "no rows" in capsys.readouterr().err


def test_data_functions_on_the_synthetic_sweep(sim_run):
    run = report.load_run(sim_run)
    assert run.simulated and run.table is not None and not run.notes

    thr = report.throughput_by_length(run.results, top=2)
    assert set(thr["bucket"]) == set(BUCKET_NAMES)
    assert thr["engine_key"].nunique() == 6  # the failed trial has no successful row
    highlighted = thr.loc[thr["highlight"], ["engine_key", "role"]].drop_duplicates()
    assert len(highlighted) == 4 and {ROLE_MTP_OFF, ROLE_STATIC} <= set(highlighted["role"])

    gains = report.gain_table(run.results, run.table)
    assert list(gains["bucket"]) == list(BUCKET_NAMES)
    assert list(gains["published_gain"]) == [0.1568, 0.5132, 0.7597]
    for b in run.table.buckets:
        assert gains.set_index("bucket").loc[b.name, "gain_vs_mtp_off"] == pytest.approx(b.gains["mtp_off"])
    # Without the routing table the chosen rows are the best measured ones: same here (no constraints).
    no_table = report.gain_table(run.results, None)
    assert list(no_table["chosen"]) == list(gains["chosen"])
    assert no_table["gain_vs_mtp_off"].to_numpy() == pytest.approx(gains["gain_vs_mtp_off"].to_numpy())

    acc = report.accept_length_table(run.results)
    assert sorted(acc["num_draft_tokens"].unique()) == [1, 2, 3, 4]
    four = acc[acc["num_draft_tokens"] == 4].sort_values("max_output_len")["accept_length"].tolist()
    assert four == sorted(four)  # the model's acceptance rises with output position

    summary = report.routing_summary(run.table)
    assert list(summary["bucket"]) == list(BUCKET_NAMES) and summary["config"].str.startswith("sim-").all()

    mixed = report.mixed_summary(run.table, run.results)
    assert mixed["deployment"].iloc[0].startswith("routing table")
    assert len(mixed) == 1 + 5 and (mixed["table_vs_this"].iloc[1:] >= 0).all()  # the table has every bucket's best
    assert mixed["predicted_output_throughput"].iloc[1:].is_monotonic_decreasing

    failed = report.failed_trials(run.results)
    assert list(failed["trial_id"]) == ["t999"] and failed["reason"].iloc[0] == FAILED_REASON
    assert failed["buckets"].iloc[0] == "le1024@32, le4096@32, le8192@32"


def test_csv_only_run_without_table_still_reports(sim_run, tmp_path):
    # An interrupted sweep: CSV results only (booleans as text), no routing table yet.
    run_dir = tmp_path / "partial"
    run_dir.mkdir()
    (run_dir / "results.csv").write_text((sim_run / "results.csv").read_text())
    run = report.load_run(run_dir)
    assert run.table is None and run.simulated and "routing_table.json" in run.notes[0]
    assert run.results["primary_load"].dtype == bool
    paths = report.write_report(run, tmp_path / "out")
    assert "SIMULATED" in paths["html"].read_text()


def test_not_simulated_has_no_banner(sim_run):
    run = report.load_run(sim_run)
    real = run.results.assign(simulated=False, backend="pytorch")
    assert not report.is_simulated(real)
    page = report.render_html(report.SweepRun(run_dir=None, results=real), {})
    assert "SIMULATED" not in page
    fig = report.plot_throughput_vs_length(real, simulated=False)
    assert "SIMULATED" not in fig._suptitle.get_text()


def test_pareto_front_on_a_hand_made_frame():
    df = pd.DataFrame({
        "name": ["a", "b", "c", "d", "e", "f", "g"],
        "tpot_ms_median": [2.0, 3.0, 4.0, 3.5, 5.0, 2.0, None],
        "output_throughput": [100.0, 200.0, 300.0, 250.0, 290.0, 90.0, 999.0],
    })
    # a, b, d, c trade latency for throughput; e is dominated by c (slower and fewer tok/s), f by a,
    # g has no TPOT.
    front = report.pareto_front(df)
    assert list(front["name"]) == ["a", "b", "d", "c"]
    # Ties: an identical point is kept, a point equal in one axis and worse in the other is not.
    tie = pd.DataFrame({"name": ["x", "y", "z"], "tpot_ms_median": [1.0, 1.0, 1.0],
                        "output_throughput": [10.0, 10.0, 9.0]})
    assert sorted(report.pareto_front(tie)["name"]) == ["x", "y"]
    assert report.pareto_front(df.iloc[0:0]).empty


def test_published_table_matches_the_sim_profile():
    import json

    from orchestrator.sim.model import PROFILES_DIR

    published = json.loads((PROFILES_DIR / f"{PROFILE}.json").read_text())["published"]
    for p in report.PUBLISHED:
        row = published[str(p.output_len)]
        assert row["on"] / row["off"] - 1 == pytest.approx(p.gain, abs=5e-5)
        assert row["accept_length"] == p.accept_length


def test_the_page_shows_the_serving_budget_and_the_planned_replicas(sim_run):
    from orchestrator.table import GpuBudget

    run = report.load_run(sim_run)
    assert "Serving budget" not in report.render_html(run, {})  # no --serve-gpus, no section
    key, cfg = next(iter(run.table.distinct_configs().items()))
    budget = GpuBudget(gpus=32, replicas={key: 4}, notes=("replicas planned on 32 GPU(s) for the traffic mix",))
    planned = run.table.model_copy(update={"provenance": run.table.provenance.model_copy(update={"gpu_budget": budget})})
    page = report.render_html(report.SweepRun(run_dir=None, results=run.results, table=planned), {})
    assert "Serving budget: 32 GPU(s)" in page and f"{cfg.label()}</code> x4" in page
    assert "replicas planned on 32 GPU(s) for the traffic mix" in page


def test_the_page_says_where_a_shared_config_serves_a_bucket_within_noise(sim_run):
    run = report.load_run(sim_run)
    assert "Within noise" not in report.render_html(run, {})  # one round per figure: no such choice
    note = "le1024: MTP-4 (8,400 tok/s) serves it, within noise of MTP-3 (8,600 tok/s) (-2.3%; intervals over 3 rounds overlap)"
    noted = run.table.model_copy(update={"provenance": run.table.provenance.model_copy(update={"notes": (note,)})})
    page = report.render_html(report.SweepRun(run_dir=None, results=run.results, table=noted), {})
    assert "<h2>Within noise</h2>" in page and "intervals over 3 rounds overlap" in page
