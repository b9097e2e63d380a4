"""Measure how fast the wall-clock driver can run: ``python -m orchestrator.sim.timescale_check``.

Starts the server at each time scale, drives it closed-loop at the given concurrency with streaming
requests (aiohttp, the same process pair a benchmark uses), and compares the output throughput
measured by the client (wall time x scale) with :func:`simulate_workload` on the virtual clock.
The largest scale whose figure stays within 5% is the driver's limit on this machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import aiohttp

from orchestrator.sim.model import DEFAULT_PROFILE
from orchestrator.sim.scheduler import simulate_workload
from orchestrator.sim.tokenizer import sample_text


async def _drive(base: str, n: int, conc: int, in_len: int, out_len: int, seed: int) -> tuple[float, int]:
    import numpy as np

    rng = np.random.default_rng(seed)
    ins = rng.integers(in_len // 2, in_len + 1, n)
    outs = rng.integers(out_len // 2, out_len + 1, n)
    queue = list(range(n))
    total = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal total
        while queue:
            i = queue.pop()
            body = {"prompt": sample_text(int(ins[i]), rng), "max_tokens": int(outs[i]), "stream": True,
                    "ignore_eos": True, "temperature": 0}
            async with session.post(base + "/v1/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        total += len(json.loads(line[6:])["choices"][0]["text"].split())

    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        await asyncio.gather(*(worker(s) for _ in range(conc)))
    return time.monotonic() - t0, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", default="5,10,20,40,80")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--draft-tokens", type=int, default=3)
    a = ap.parse_args()
    ref = simulate_workload(DEFAULT_PROFILE, a.draft_tokens, input_len=a.input_len,
                            output_len=a.output_len, num_prompts=a.num_prompts, concurrency=a.concurrency)
    print(f"virtual clock: {ref.output_throughput:.0f} tok/s ({ref.duration_s:.1f} simulated s)")
    for scale in [float(s) for s in a.scales.split(",")]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        spec = ["--speculative-algorithm", "qwen3_5_mtp", "--speculative-num-draft-tokens", str(a.draft_tokens)]
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.sim", "--server-port", str(port),
                                 "--time-scale", str(scale), "--log-level", "WARNING",
                                 *(spec if a.draft_tokens else [])])
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    with socket.create_connection(("127.0.0.1", port), 0.2):
                        break
                except OSError:
                    time.sleep(0.05)
            wall, tokens = asyncio.run(_drive(base, a.num_prompts, a.concurrency, a.input_len, a.output_len, 0))
            tput = tokens / (wall * scale)
            print(f"scale {scale:>5g}: {tput:.0f} tok/s simulated, {tput / ref.output_throughput - 1:+.1%} vs "
                  f"virtual clock, wall {wall:.1f} s", flush=True)
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
