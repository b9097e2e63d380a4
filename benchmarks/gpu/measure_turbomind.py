"""TurboMind (MTP off) against LMDeploy's PyTorch engine with MTP off and with MTP, side by side on
one checkpoint: output throughput at one concurrency and output length, at temperature 0 and 0.8.

Why: TurboMind has no speculative decoding, so for each bucket, load and sampling class the choice is
a faster plain engine or a slower engine that drafts. This is the first measurement of that choice
(issue #19 item 3), on the project's small test checkpoint.

How: one engine on the GPU at a time. Each engine is started, sent one unmeasured full-length wave per
temperature at the largest concurrency (warm-up: kernels, CUDA graphs, allocator; the first sampled
wave after a start was seen to pay a one-time cost when the warm-up was greedy only), then one
measured wave per (concurrency, temperature) cell: the same requests for every engine (same seed,
fixed lengths). ``--waves N`` measures N waves per cell per engine start, cycling through the cells,
wave k with the prompts of seed k: a wave costs seconds where an engine start costs a minute or two,
and a low-concurrency cell then sees N prompt samples; a round's figure is the mean of its waves.
Two rounds, the second in reverse order (ABC, CBA), so a drift of the machine touches every engine
alike; the engine at the turn stays up across it. Every figure is kept per round, with its mean and
spread ((max - min) / mean). Without MTP the work does not depend on the weights (fixed lengths, dense
model), so an oracle checkpoint of the same shape measures the plain engines as well.

    python -m benchmarks.gpu.measure_turbomind --ckpt /root/ckpt --out $OUT [--concurrency 8,64,256] [--deadline-s 480]
    python -m benchmarks.gpu.measure_turbomind --sim --out /tmp/tm      # dry run, simulated engines
    python -m benchmarks.gpu.measure_turbomind --render results.json     # the markdown report
    python -m benchmarks.gpu.measure_turbomind --render a.json b.json    # several runs pooled per cell

``--out``/``turbomind_results.json`` is rewritten after every wave (a timeout keeps what was
measured). With ``--sim`` the engines are the simulator's (no TurboMind backend there yet: its
"turbomind" is the simulated PyTorch engine without MTP), labelled SIMULATED: a dry run of the
script, never a figure.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tuning.engine_grid import pooled, render_markdown, summarize

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["engine_configs"]

ENGINES = ("turbomind", "pytorch-mtp-off", "pytorch-mtp3")
"""The default comparison; ``--engines`` takes any ``pytorch-mtpN`` (N draft tokens)."""


def log(msg: str) -> None:
    print(f"[tm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def engine_configs(ckpt: str, names: list[str], *, sim: bool, memory_fraction: float,
                   max_batch_size: int) -> dict[str, Any]:
    """name -> EngineConfig for ``turbomind``, ``pytorch-mtp-off`` and ``pytorch-mtpN`` (``sim``: the
    simulator's stand-ins); an unknown name raises ``ValueError`` naming it."""
    from benchmarks.gpu.engines import measured_engine

    def pt(n: int):
        return measured_engine(ckpt, sim=sim, draft_tokens=n, memory_fraction=memory_fraction,
                               max_batch_size=max_batch_size)

    out: dict[str, Any] = {}
    for name in names:
        if name == "turbomind":
            out[name] = pt(0) if sim else pt(0).replace(backend="turbomind")
        elif name == "pytorch-mtp-off":
            out[name] = pt(0)
        elif (drafts := name.removeprefix("pytorch-mtp")) != name and drafts.isdigit() and int(drafts) >= 1:
            out[name] = pt(int(drafts))
        else:
            raise ValueError(f"engine {name!r} unknown; known: turbomind, pytorch-mtp-off, pytorch-mtpN (N >= 1)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure_turbomind.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", default="/root/ckpt", help="checkpoint (LMDeploy); ignored with --sim")
    p.add_argument("--sim", action="store_true", help="simulated engines (a dry run of this script; no GPU figure)")
    p.add_argument("--out", type=Path, help="folder for turbomind_results.json and engine logs")
    p.add_argument("--render", type=Path, nargs="+", help="print the markdown report of a results JSON (several: "
                   "pooled per cell) and exit")
    p.add_argument("--admit-unrecorded", action="store_true", help="with --render: count waves that lost requests "
                   "without a recorded reason like those of empty text (runs before the client recorded reasons)")
    p.add_argument("--concurrency", default="64", help="comma-separated concurrencies (one cell each)")
    p.add_argument("--num-prompts", type=int, default=None, help="requests per measured cell (default: one wave, "
                   "as many as the concurrency)")
    p.add_argument("--waves", type=int, default=1, help="measured waves per cell per engine start, cycling through "
                   "the cells; wave k sends the random prompts of seed k (more prompts per cell at low concurrency, and "
                   "a round's figure is the mean of its waves: a wave costs seconds, an engine start a minute or two)")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"a subset of {','.join(ENGINES)} "
                   "(MTP's draft count from --draft-tokens)")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", default="512", help="comma-separated output lengths (one cell each)")
    p.add_argument("--temperatures", default="0,0.8")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--retries", type=int, default=1, help="runs again a wave that lost requests (it is left out "
                   "of the summary), up to this often per cell, round and wave")
    p.add_argument("--memory-fraction", type=float, default=0.1)
    p.add_argument("--deadline-s", type=float, default=480, help="no engine starts after this (from the start)")
    a = p.parse_args(argv)
    if a.render:
        results = [json.loads(f.read_text()) for f in a.render]
        print(render_markdown(pooled(results, admit_unrecorded=a.admit_unrecorded)))
        return 0
    if a.out is None:
        p.error("--out is required (or --render)")
    if a.waves < 1:
        p.error(f"--waves {a.waves}: at least 1")

    from orchestrator.engine import EngineProcess
    from orchestrator.hostinfo import measured_on
    from tuning.bench import benchmark
    from tuning.workload import Workload, load_tokenizer

    t0 = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    concs = [int(c) for c in a.concurrency.split(",")]
    olens = [int(o) for o in a.output_len.split(",")]
    try:
        configs = engine_configs(a.ckpt, a.engines.split(","), sim=a.sim, memory_fraction=a.memory_fraction,
                                 max_batch_size=max(concs))
    except ValueError as e:
        p.error(f"--engines: {e}")
    names = list(configs)
    order = [names if r % 2 == 0 else names[::-1] for r in range(a.rounds)]
    temps = [float(t) for t in a.temperatures.split(",")]
    tokenizer = load_tokenizer(None if a.sim else a.ckpt)
    res: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/gpu/measure_turbomind.py", *(argv if argv is not None else sys.argv[1:])]),
        "simulated": a.sim, "ckpt": a.ckpt, "rounds": a.rounds, "order": order,
        "workload": {"concurrency": concs, "num_prompts": a.num_prompts, "input_len": a.input_len,
                     "output_len": olens, "temperatures": temps, "waves": a.waves},
        "warmup": f"one unmeasured wave of {max(olens)}-token outputs at concurrency {min(max(concs), 64)} per temperature",
        "engines": {n: c.to_dict() for n, c in configs.items()}, "host": measured_on(),
        "versions": _versions(), "starts": [], "rows": [], "summary": {}, "notes": [],
    }
    if a.sim:
        res["notes"].append("SIMULATED: the simulator has no TurboMind backend; its 'turbomind' row is the simulated "
                            "PyTorch engine without MTP. A dry run of the script, not a measurement.")
    out_json = a.out / "turbomind_results.json"

    def save() -> None:
        res["summary"] = summarize(res["rows"])
        res["elapsed_s"] = round(time.monotonic() - t0, 1)
        out_json.write_text(json.dumps(res, indent=1))

    def workload(temp: float, conc: int, olen: int, warmup: bool = False, wave: int = 0) -> Workload:
        return Workload(dataset="random", input_len=a.input_len, output_len=olen, range_ratio=1.0,
                        num_prompts=a.num_prompts or conc, max_concurrency=conc, temperature=temp, seed=wave,
                        ignore_eos=True, name="warmup" if warmup else f"o{olen}-c{conc}-T{temp:g}-w{wave}")

    running: tuple[str, Any] | None = None
    try:
        for rnd, names_in_order in enumerate(order):
            for name in names_in_order:
                if running is None or running[0] != name:
                    if running is not None:
                        running[1].stop()
                        running = None
                    if time.monotonic() - t0 > a.deadline_s:
                        res["notes"].append(f"deadline: round {rnd} {name} not run")
                        log(res["notes"][-1])
                        continue
                    ts = time.monotonic()
                    eng = EngineProcess(configs[name], log_dir=a.out / "engine-logs", ready_timeout_s=600,
                                        sim_time_scale=50.0 if a.sim else None)
                    eng.start()
                    running = (name, eng)
                    eng.wait_until_ready()
                    res["starts"].append({"engine": name, "round": rnd, "ready_s": round(time.monotonic() - ts, 1)})
                    log(f"{name} ready in {res['starts'][-1]['ready_s']} s: {' '.join(eng.argv)}")
                    for temp in temps:  # every sampling path once at full length: kernels compile on first use
                        benchmark(eng.base_url, workload(temp, min(max(concs), 64), max(olens), warmup=True),
                                  tokenizer=tokenizer, request_timeout_s=600)
                eng = running[1]
                for wave, olen, conc, temp in [(w, o, c, t) for w in range(a.waves) for o in olens for c in concs
                                               for t in temps]:
                    for attempt in range(1 + a.retries):
                        r = benchmark(eng.base_url, workload(temp, conc, olen, wave=wave), tokenizer=tokenizer,
                                      engine_config=configs[name], request_timeout_s=600).to_dict()
                        row = {"round": rnd, "wave": wave, "prompt_seed": (r.get("workload") or {}).get("seed"),
                               "engine": name, "output_len": olen, "concurrency": conc,
                               "temperature": temp, "attempt": attempt,
                               "output_throughput": r.get("output_throughput"), "duration_s": r.get("duration_s"),
                               "completed": r.get("completed"), "failed": r.get("failed"),
                               "failure_reasons": r.get("failure_reasons") or None,
                               "accept_length": r.get("accept_length"),
                               # the counters' deltas: how many decode outputs they saw per request says
                               # how far the counted accept length is biased (tuning.bench.counters)
                               "spec_counters": r.get("spec_counters") or None,
                               "ttft_ms_median": (r.get("ttft_ms") or {}).get("median"),
                               "tpot_ms_median": (r.get("tpot_ms") or {}).get("median"),
                               "at_s": round(time.monotonic() - t0, 1)}
                        res["rows"].append(row)
                        log(f"round {rnd} wave {wave} {name} o={olen} c={conc} T={temp:g}: {row['output_throughput'] or 0:,.0f} tok/s "
                            f"in {row['duration_s'] or 0:.1f} s, accept {row['accept_length']}"
                            + (f", {row['failed']} failed: {row['failure_reasons']}" if row["failed"] else ""))
                        save()
                        if not row["failed"]:
                            break  # a wave that lost requests (other than to empty text) is left out: run it again
    finally:
        if running is not None:
            running[1].stop()
        save()
    (a.out / "turbomind_results.md").write_text(render_markdown(res))
    for key, s in res["summary"].items():
        log(f"{key}: {s['output_throughput']} mean {s['mean']:,.0f} spread {s['spread']:.1%} "
            f"{s.get('vs_pytorch_mtp_off', '')}")
    return 0


def _versions() -> dict[str, str]:
    import platform
    import subprocess

    from orchestrator.hostinfo import package_version

    out = {"python": platform.python_version()}
    for dist in ("lmdeploy", "torch", "transformers", "triton", "flash_attn_3", "nvidia-cuda-runtime-cu12"):
        out[dist] = package_version(dist) or "absent"
    try:
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["gpu"] = "none"
    return out


if __name__ == "__main__":
    sys.exit(main())
