"""CI runs ``notebooks/sweep_analysis.ipynb`` top to bottom (nbclient, a python3 kernel) on fresh
simulated sweeps: a synthetic one built from the simulator's pure model (seconds), and a real tiny
``python -m tuning.sweep`` on the simulator (Ray Tune + Optuna; about a minute on 2 cores)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

# the synthetic run dir builder
from tests.unit.test_report import BUCKET_NAMES, make_sim_run_dir

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "sweep_analysis.ipynb"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A python3 kernelspec for *this* interpreter in a temp prefix, found through JUPYTER_PATH, so the
    test needs no `ipykernel install` on the machine and never runs another Python's kernel."""
    from ipykernel.kernelspec import install

    prefix = tmp_path_factory.mktemp("jupyter")
    install(prefix=str(prefix), kernel_name="python3")
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    mp.setenv("MPLBACKEND", "Agg")
    yield
    mp.undo()


def _execute(run_dir: Path, monkeypatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("SWEEP_RUN_DIR", str(run_dir))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    return nb


def _text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            for mime, data in out.get("data", {}).items():
                if mime.startswith("text/"):
                    parts.append(data)
    return "\n".join(parts)


def _images(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))


def test_committed_notebook_has_no_outputs_and_calls_the_report():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "clear the notebook's outputs"
    src = "\n".join(c.source for c in code)
    for fn in ("plot_throughput_vs_length", "plot_gain_vs_published", "plot_accept_length", "plot_tpot_vs_throughput"):
        assert f"report.{fn}(" in src
    assert "import matplotlib.pyplot" not in src  # plotting code lives in tuning.report only


def test_notebook_runs_on_a_synthetic_simulated_sweep(kernel_env, tmp_path, monkeypatch):
    run_dir = make_sim_run_dir(tmp_path / "sweep-synthetic")
    nb = _execute(run_dir, monkeypatch)
    text = _text(nb)
    assert "SIMULATED" in text and "sweep-synthetic" in text
    assert all(b in text for b in BUCKET_NAMES)
    assert "t999" in text  # the failed trial's table
    assert _images(nb) == 4


@pytest.mark.slow
def test_notebook_and_report_on_a_real_tiny_sweep(kernel_env, tmp_path, monkeypatch):
    run_dir = tmp_path / "sweep-tiny"
    argv = [sys.executable, "-m", "tuning.sweep", "--buckets", "256,1024", "--concurrency", "16", "--num-prompts",
            "16", "--num-trials", "3", "--num-draft-tokens", "2,3", "--memory-fraction", "0.8",
            "--sim-time-scale", "10", "--num-cpus", "2", "--no-live", "--run-dir", str(run_dir), "--sweep-id", "sweep-tiny"]
    sweep = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if sweep.returncode and "timed out during startup" in sweep.stderr:  # Ray's own start on a busy machine
        sweep = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    assert (run_dir / "routing_table.json").exists()

    rep = subprocess.run([sys.executable, "-m", "tuning.report", str(run_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    page = (run_dir / "report" / "report.html").read_text()
    assert "SIMULATED" in page and "le256" in page and "le1024" in page

    nb = _execute(run_dir, monkeypatch)
    text = _text(nb)
    assert "SIMULATED" in text and "sweep-tiny" in text and "le1024" in text
    assert _images(nb) == 4
