"""Shared test set-up: the ``gpu`` marker and a per-test log folder."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or ``None`` when they can (CUDA GPU, torch and LMDeploy)."""
    for module in ("torch", "lmdeploy"):
        if importlib.util.find_spec(module) is None:
            return f"needs {module} (GPU node with the [gpu] extra)"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def tmp_log_dir(tmp_path: Path) -> Path:
    """A fresh folder for engine logs; its files show up in pytest's tmp_path on failure."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    return log_dir


@pytest.fixture
def write_table():
    """Writes a routing table with one bucket per engine config (le256, le1024, ...) through the real
    ``orchestrator.table.commit`` and returns its path: the tables Serve tests deploy or size up."""
    from orchestrator import table as routing
    from orchestrator.fsutil import utc_now_iso

    def write(path: Path, configs) -> Path:
        data = {
            "provenance": {"model": "/ckpt", "gpu_type": "H200", "gpu_count": 1, "sweep_id": "s",
                           "created_at": utc_now_iso(), "simulated": False},
            "buckets": [{"name": f"le{256 * 4 ** i}", "max_output_len": 256 * 4 ** i, "config": c.to_dict(),
                         "figures": {"output_throughput": 1.0}} for i, c in enumerate(configs)],
        }
        routing.commit(data, path)
        return path

    return write


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A checkpoint folder just real enough for the sweep's CLI to accept ``--model`` (its config
    names the model type); nothing loads weights from it."""
    import json

    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    return d
