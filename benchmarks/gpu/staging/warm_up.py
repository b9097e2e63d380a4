"""On a fresh H200 machine: pay LMDeploy's one-time compilation (TileLang/Triton kernels cached in
$HOME) in the background while the other wheel parts travel, so the sweep's engines start warm.

Builds a checkpoint of the trained one's shape (constructed weights, ``tuning.checkpoint.build
--oracle``), starts an MTP engine and an MTP-off engine on it side by side, sends each a few
requests (prefill + decode + draft/verify kernels), stops them. Prints timings.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from orchestrator.config import EngineConfig
from orchestrator.engine import EngineProcess
from tuning.checkpoint.build import main as build_main


def main() -> int:
    t0 = time.monotonic()
    ckpt = Path(sys.argv[1] if len(sys.argv) > 1 else "/root/warm")
    if not (ckpt / "config.json").exists():
        build_main([str(ckpt), "--oracle"])
    print(f"[warm] checkpoint ready ({time.monotonic() - t0:.0f} s)", flush=True)
    base = EngineConfig(model=str(ckpt), memory_fraction=0.1, max_batch_size=64, session_len=4096,
                        extra_flags=("--language-model-only",))
    engines = [EngineProcess(c, log_dir="/root/e2e/warm-logs", ready_timeout_s=900)
               for c in (base.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3), base)]
    import httpx

    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_until_ready()
            print(f"[warm] {e.config.label()} ready ({time.monotonic() - t0:.0f} s)", flush=True)
            model = httpx.get(e.base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
            for n in (16, 200):
                httpx.post(e.base_url + "/v1/completions", timeout=300,
                           json={"model": model, "prompt": "def main():\n", "max_tokens": n, "ignore_eos": True})
    finally:
        for e in engines:
            e.stop()
    print(f"[warm] done ({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
