"""Does a routing table pay when its engines share one GPU? (issue #41 item 2, and item 3's evidence)

On the MoE testbed greedy traffic wants MTP-4 and sampled traffic wants MTP off, at every load. On one GPU
whole replicas cannot split, so the table's plan puts both engines on the same GPU and lets them share its
time. This driver serves, side by side on one GPU, in alternating rounds:

- ``plan``: the table's plan: T 0 requests to the MTP-4 engine, T 0.8 requests to the MTP-off engine, both
  engines resident on the GPU at once (each with ``--memory-fraction`` of its free memory for KV);
- ``mtp4``: every request to the MTP-4 engine (the published recipe, (d); also a candidate for (b));
- ``off``: every request to the MTP-off engine (the other candidate for (b));
- ``turbomind``: every request to TurboMind at LMDeploy's default memory (0.8), (c).

The best single config (b) is, per cell, whichever of ``mtp4`` and ``off`` has the higher mean: a choice made
after the fact, which favours (b). The workload of every arm is the same: half greedy (T 0), half sampled
(T 0.8), ``concurrency / 2`` in flight of each, ``--waves`` waves each, input ``--input-len``, ``ignore_eos``;
both halves start together, and a cell's throughput is all output tokens over the time until the last request
ended (so when one half ends first, the GPU's time goes to the other: what sharing a GPU buys). Goodput counts
the tokens of requests that met MLPerf's server SLO (TTFT 2 s, TPOT 200 ms). Item 3's evidence rides along at
the bar's load: each plan engine's rate on its half alone (``greedy-alone``, ``sampled-alone``), and every
engine's running batch sampled from ``lmdeploy:num_requests_running`` during each cell.

Engines measured: the idle ones stay resident (their memory) but do no work while another arm runs. Engine
start-ups never overlap a measurement. Warm-up: one full-length wave of every arm, and one short pass of every
arm at every load (every batch shape once), unmeasured. Results go to ``--out``/``shared_gpu.json`` after
every cell; ``--deadline-s``: no round starts after it.

    python benchmarks/gpu/measure_shared_gpu.py --build /root/sg/ckpt --out $OUT/sg      # on the GPU machine
    python benchmarks/gpu/measure_shared_gpu.py --sim --out /tmp/sg --rounds 1          # flow rehearsal, SIMULATED
    python benchmarks/gpu/measure_shared_gpu.py --render shared_gpu.json                 # the markdown report
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.config import EngineConfig
from tuning.bench.counters import parse_gauge
from tuning.bench.progress import NullProgress
from tuning.drive.report import MLPERF_SERVER_SLO

PRESET = "qwen3.5-moe-35b-a3b-12l"
SIM_PROFILE = "qwen35-moe-testbed-1xh200"
SIM_TURBOMIND_PROFILE = "qwen35-test-83m-1xh200"
"""The testbed's profile has no TurboMind section: the rehearsal's TurboMind is the 83M model's (flow only)."""
GREEDY, SAMPLED = 0.0, 0.8
ARMS = ("plan", "mtp4", "off", "turbomind")
ALONE_ARMS = ("greedy-alone", "sampled-alone")
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[shared-gpu {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def routes(arm: str) -> dict[float, str]:
    """Which engine serves each temperature in an arm; a temperature left out is not sent."""
    return {"plan": {GREEDY: "mtp4", SAMPLED: "off"}, "mtp4": {GREEDY: "mtp4", SAMPLED: "mtp4"},
            "off": {GREEDY: "off", SAMPLED: "off"}, "turbomind": {GREEDY: "turbomind", SAMPLED: "turbomind"},
            "greedy-alone": {GREEDY: "mtp4"}, "sampled-alone": {SAMPLED: "off"}}[arm]


def engine_configs(a: argparse.Namespace, ckpt: str | None) -> dict[str, EngineConfig]:
    """The three engines; simulated ones share one simulated GPU (``--shared-gpu``: time-sliced, as the plan's
    engines are on the real one)."""
    common = dict(max_batch_size=max(a.loads), session_len=a.input_len + max(a.outputs) + 64)
    mtp = dict(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=4)
    if a.sim:
        gpu = Path(a.out) / "sim-gpu0"
        sim = dict(backend="sim", model=SIM_PROFILE, extra_flags=("--startup-delay", "0", "--shared-gpu", str(gpu)),
                   **common)
        return {"mtp4": EngineConfig(memory_fraction=a.memory_fraction, **mtp, **sim),
                "off": EngineConfig(memory_fraction=a.memory_fraction, **sim),
                "turbomind": EngineConfig(simulated_backend="turbomind", **(sim | {"model": SIM_TURBOMIND_PROFILE}))}
    real = dict(model=str(ckpt), extra_flags=("--language-model-only",), **common)
    return {"mtp4": EngineConfig(backend="pytorch", memory_fraction=a.memory_fraction, **mtp, **real),
            "off": EngineConfig(backend="pytorch", memory_fraction=a.memory_fraction, **real),
            "turbomind": EngineConfig(backend="turbomind", **real)}  # LMDeploy's default memory (0.8)


def build(path: Path, a: argparse.Namespace) -> str:
    """The testbed checkpoint, built on the GPU (written last: a build cut short is built again)."""
    done = path / ".built"
    if not done.exists():
        cmd = [sys.executable, "-m", "tuning.checkpoint.build", str(path), "--preset", PRESET, "--agreement",
               str(a.agreement), "--sharpness", str(a.sharpness), "--device", "cuda", "--no-digest"]
        log(f"building {path}: {' '.join(cmd[2:])}")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        done.write_text(" ".join(cmd))
    return str(path)


class _Collect(NullProgress):
    """A progress sink that keeps every request's record (for goodput)."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []

    def on_request_done(self, output: Any) -> None:
        self.outputs.append(output)


def good(o: Any) -> bool:
    """MLPerf's server SLO (:data:`~tuning.drive.report.MLPERF_SERVER_SLO`) on one request's record."""
    slo = MLPERF_SERVER_SLO
    if not o.success or o.ttft is None or o.ttft > slo.ttft_s:
        return False
    return o.output_len <= 1 or (o.latency - o.ttft) / (o.output_len - 1) <= slo.tpot_s


class BatchSampler:
    """Samples every engine's running batch (its backend's ``running`` gauge) every ``period_s``."""

    def __init__(self, urls: dict[str, str], gauges: dict[str, str], period_s: float = 0.5) -> None:
        self.urls, self.gauges, self.period_s = urls, gauges, period_s
        self.samples: dict[str, list[float]] = {k: [] for k in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BatchSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=2.0) as client:
            while not self._stop.wait(self.period_s):
                for name, url in self.urls.items():
                    try:
                        text = client.get(f"{url}/metrics").text
                    except httpx.HTTPError:
                        continue
                    running = parse_gauge(text, self.gauges[name])
                    if running is not None:
                        self.samples[name].append(running)

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for name, xs in self.samples.items():
            busy = [x for x in xs if x > 0]
            if busy:
                out[name] = {"mean_busy": round(statistics.fmean(busy), 1), "max": max(busy), "samples": len(xs)}
        return out


def measure(arm: str, urls: dict[str, str], cfgs: dict[str, EngineConfig], tokenizer: Any, *, o: int, c: int,
            waves: int, a: argparse.Namespace) -> dict[str, Any]:
    """One cell: each temperature's half at ``c / 2`` in flight, both started together."""
    from tuning.bench import benchmark
    from tuning.workload import Workload

    half = max(1, c // 2)
    results: dict[float, Any] = {}
    sinks: dict[float, _Collect] = {}

    def run(t: float, engine: str) -> None:
        w = Workload(input_len=a.input_len, output_len=o, range_ratio=1.0, num_prompts=max(2, waves * half),
                     max_concurrency=half, request_rate=float("inf"), temperature=t, ignore_eos=True,
                     warmup_requests=0, seed=c + int(t * 10))
        sinks[t] = _Collect()
        results[t] = benchmark(urls[engine], w, tokenizer=tokenizer, engine_config=cfgs[engine],
                               progress=sinks[t], request_timeout_s=1800)

    engines = set(routes(arm).values())
    gauges = {k: cfgs[k].engine.metrics_for(cfgs[k]).running for k in engines}
    with BatchSampler({k: urls[k] for k in engines}, gauges) as batches:
        threads = [threading.Thread(target=run, args=(t, e)) for t, e in routes(arm).items()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    makespan = max(r.duration_s for r in results.values())
    outputs = [x for s in sinks.values() for x in s.outputs]
    tokens = sum(x.output_len for x in outputs if x.success)
    out = {"throughput": tokens / makespan, "goodput": sum(x.output_len for x in outputs if good(x)) / makespan,
           "makespan_s": round(makespan, 3), "failed": sum(r.failed for r in results.values()),
           "simulated": any(r.simulated for r in results.values()), "batches": batches.summary(), "halves": {}}
    for t, r in results.items():
        out["halves"][f"T{t:g}"] = {"engine": routes(arm)[t], "throughput": round(r.output_throughput, 1),
                                    "duration_s": round(r.duration_s, 3), "accept_length": r.accept_length,
                                    "ttft_ms_median": r.ttft_ms.median, "tpot_ms_median": r.tpot_ms.median}
    return out


def rotated(arms: Sequence[str], k: int) -> list[str]:
    k %= len(arms)
    return [*arms[k:], *arms[:k]]


def plan_cells(a: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(output, load, rounds) in the order measured: the bar's load first, at both outputs."""
    bar = [(o, a.bar_load, a.rounds) for o in a.outputs] if a.bar_load in a.loads else []
    rest = [(o, c, a.other_rounds) for o in a.outputs for c in a.loads if c != a.bar_load]
    return bar + rest


def run(a: argparse.Namespace) -> dict[str, Any]:
    from orchestrator.engine import EngineProcess
    from orchestrator.hostinfo import measured_on, package_versions
    from tuning.workload import load_tokenizer

    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "shared_gpu.json"
    state: dict[str, Any] = {
        "simulated": a.sim, "preset": PRESET, "agreement": a.agreement, "sharpness": a.sharpness,
        "input_len": a.input_len, "waves": a.waves, "memory_fraction": a.memory_fraction,
        "host": measured_on() | package_versions(("torch", "lmdeploy", "flash_attn_3")),
        "command": " ".join(["python", "benchmarks/gpu/measure_shared_gpu.py", *a.argv]),
        "warm_up": "one full-length wave of every arm at the bar's load, then one short pass of every arm at every load",
        "starts_s": {}, "cells": []}

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(path)

    ckpt = None if a.sim else build(Path(a.build), a)
    tokenizer = load_tokenizer(None if a.sim else ckpt)
    cfgs = engine_configs(a, ckpt)
    for k, cfg in cfgs.items():
        if k not in a.arms:
            continue
        state.setdefault("engines", {})[k] = {"label": cfg.label(), "argv": cfg.command(host="H", port=0)}
    procs = {k: EngineProcess(cfg, log_dir=out_dir / "engine-logs", ready_timeout_s=900,
                              sim_time_scale=a.sim_time_scale if a.sim else None) for k, cfg in cfgs.items() if k in a.arms}
    try:
        # The PyTorch engines side by side, then TurboMind (its default 0.8 of the free memory must come last).
        for group in (("mtp4", "off"), ("turbomind",) if "turbomind" in a.arms else ()):
            t_start = time.monotonic()
            for k in group:
                procs[k].start()
            for k in group:
                procs[k].wait_until_ready()
                state["starts_s"][k] = round(time.monotonic() - t_start, 1)
                log(f"{k} ready in {state['starts_s'][k]} s ({cfgs[k].label()})")
        save()
        urls = {k: p.base_url for k, p in procs.items()}
        cell = lambda arm, o, c, waves: measure(arm, urls, cfgs, tokenizer, o=o, c=c, waves=waves, a=a)  # noqa: E731
        for arm in a.arms:  # warm-up, unmeasured
            cell(arm, max(a.outputs), a.bar_load, 1)
            for c in a.loads:
                cell(arm, a.warmup_output_len, c, 1)
        log("warmed up")
        for o, c, rounds in plan_cells(a):
            for rnd in range(rounds):
                if time.monotonic() - T0 > a.deadline_s:
                    log(f"deadline: out {o} c {c} stops after {rnd} rounds")
                    break
                arms = rotated(a.arms + (ALONE_ARMS if c == a.bar_load else ()), rnd)
                for arm in arms:
                    r = cell(arm, o, c, a.waves)
                    state["cells"].append({"arm": arm, "output_len": o, "concurrency": c, "round": rnd, **r})
                    save()
                    log(f"out {o} c {c} round {rnd} {arm}: {r['throughput']:.0f} tok/s (goodput {r['goodput']:.0f}),"
                        f" batches {r['batches']}")
    finally:
        for p in procs.values():
            p.stop()
        save()
    return state


# ----- report ------------------------------------------------------------------------------------------------

def log_ratio_interval(ratios: Sequence[float], level: float = 0.95) -> dict[str, Any] | None:
    """Geometric mean of paired ratios and its t interval (on the log scale)."""
    from tuning.stats import mean_confidence_interval

    xs = [math.log(r) for r in ratios if r > 0]
    if len(xs) < 2:
        return {"mean": round(math.exp(xs[0]), 4), "ci95": None, "n": 1} if xs else None
    m, lo, hi = mean_confidence_interval(xs, level)
    return {"mean": round(math.exp(m), 4), "ci95": [round(math.exp(lo), 4), round(math.exp(hi), 4)], "n": len(xs)}


def summarize(state: dict[str, Any], metric: str = "throughput") -> list[dict[str, Any]]:
    """Per (output, load): each arm's mean, the best single (the better of mtp4 and off by mean), and the
    paired per-round ratios plan / best single, plan / turbomind, plan / mtp4."""
    rows = []
    keys = sorted({(x["output_len"], x["concurrency"]) for x in state["cells"]})
    for o, c in keys:
        here = [x for x in state["cells"] if (x["output_len"], x["concurrency"]) == (o, c)]
        by_round: dict[int, dict[str, float]] = {}
        for x in here:
            by_round.setdefault(x["round"], {})[x["arm"]] = x[metric]
        means = {arm: statistics.fmean(r[arm] for r in by_round.values() if arm in r)
                 for arm in {x["arm"] for x in here}}
        best = max(("mtp4", "off"), key=lambda k: means.get(k, 0.0))
        row: dict[str, Any] = {"output_len": o, "concurrency": c, "rounds": len(by_round), "means": means,
                               "best_single": best}
        for ref in (best, "turbomind", "mtp4"):
            pairs = [r["plan"] / r[ref] for r in by_round.values() if "plan" in r and ref in r and r[ref] > 0]
            row[f"plan/{ref}"] = log_ratio_interval(pairs)
        if all(k in means for k in ("greedy-alone", "sampled-alone", "plan")):
            # Sharing's efficiency: the plan's makespan against its two halves run one after the other.
            span = {arm: statistics.fmean(x["makespan_s"] for x in here if x["arm"] == arm)
                    for arm in ("plan", "greedy-alone", "sampled-alone")}
            row["plan_makespan_vs_halves_in_turn"] = round(
                span["plan"] / (span["greedy-alone"] + span["sampled-alone"]), 3)
        rows.append(row)
    return rows


def _fmt(ci: dict[str, Any] | None) -> str:
    if not ci:
        return "-"
    return f"{ci['mean']:.3f}" + (f" [{ci['ci95'][0]:.3f}, {ci['ci95'][1]:.3f}]" if ci.get("ci95") else "")


def render_markdown(state: dict[str, Any]) -> str:
    sim = " (SIMULATED)" if state.get("simulated") else ""
    lines = [f"# A routing table's engines sharing one GPU{sim}", "",
             f"Command: `{state['command']}`", "", f"Host: `{json.dumps(state['host'])}`", "",
             f"Engine starts (s): {state['starts_s']}. Warm-up: {state['warm_up']}.", ""]
    for metric in ("throughput", "goodput"):
        lines += [f"## Output {metric} (tok/s), mean over rounds; ratios are geometric means of per-round pairs with 95 % intervals", "",
                  "| out | in flight | rounds | plan | MTP-4 | MTP off | TurboMind | best single | plan / best single | plan / TurboMind | plan / MTP-4 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in summarize(state, metric):
            m = r["means"]
            lines.append(f"| {r['output_len']} | {r['concurrency']} | {r['rounds']} | "
                         + " | ".join(f"{m[k]:,.0f}" if k in m else "-" for k in ARMS)
                         + f" | {r['best_single']} | {_fmt(r['plan/' + r['best_single']])} | {_fmt(r['plan/turbomind'])}"
                           f" | {_fmt(r['plan/mtp4'])} |")
        lines.append("")
    lines += ["## Each engine's half: alone and beside the other (the bar's load)", "",
              "| out | arm | half | engine | tok/s (mean) | accept length (mean) | running batch (mean busy) |", "|---|---|---|---|---|---|---|"]
    for x in sorted({(x["output_len"], x["arm"]) for x in state["cells"] if x["arm"] in ("plan", *ALONE_ARMS)}):
        here = [y for y in state["cells"] if (y["output_len"], y["arm"]) == x]
        for half in sorted({h for y in here for h in y["halves"]}):
            hs = [y["halves"][half] for y in here if half in y["halves"]]
            eng = hs[0]["engine"]
            acc = [h["accept_length"] for h in hs if h["accept_length"]]
            bs = [y["batches"][eng]["mean_busy"] for y in here if eng in y["batches"]]
            lines.append(f"| {x[0]} | {x[1]} | {half} | {eng} | {statistics.fmean(h['throughput'] for h in hs):,.0f} | "
                         f"{statistics.fmean(acc):.2f} | {statistics.fmean(bs) if bs else float('nan'):.1f} |"
                         if acc else
                         f"| {x[0]} | {x[1]} | {half} | {eng} | {statistics.fmean(h['throughput'] for h in hs):,.0f} | - | "
                         f"{statistics.fmean(bs) if bs else float('nan'):.1f} |")
    eff = [(r["output_len"], r["concurrency"], r.get("plan_makespan_vs_halves_in_turn")) for r in summarize(state)]
    lines += ["", "Plan's makespan over its two halves run one after the other (below 1: sharing overlaps them): "
              + ", ".join(f"out {o} c {c}: {v}" for o, c, v in eff if v is not None), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="/root/sg/ckpt", help="where the testbed checkpoint is built on the GPU")
    p.add_argument("--agreement", type=float, default=0.9)
    p.add_argument("--sharpness", type=float, default=8.0)
    p.add_argument("--out", default="/tmp/shared_gpu")
    p.add_argument("--sim", action="store_true", help="simulated engines (flow rehearsal, labelled SIMULATED)")
    p.add_argument("--sim-time-scale", type=float, default=1.0, help="simulated engines: wall seconds per simulated second")
    p.add_argument("--outputs", default="512,128")
    p.add_argument("--loads", default="64,16,256")
    p.add_argument("--bar-load", type=int, default=64, help="the load the bar is read at: measured first, with --rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--other-rounds", type=int, default=3, help="rounds at the other loads")
    p.add_argument("--waves", type=int, default=2)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--warmup-output-len", type=int, default=32)
    p.add_argument("--memory-fraction", type=float, default=0.25, help="the PyTorch engines' --cache-max-entry-count")
    p.add_argument("--arms", default=",".join(ARMS), help="the arms served (TurboMind at its default memory needs "
                   "room beside the two PyTorch engines: ~140 GB for the testbed)")
    p.add_argument("--deadline-s", type=float, default=1e9, help="no round starts after this many seconds")
    p.add_argument("--render", metavar="JSON", help="print the markdown report of a results file and exit")
    a = p.parse_args(argv)
    if a.render:
        print(render_markdown(json.loads(Path(a.render).read_text())))
        return 0
    a.argv = argv
    a.arms = tuple(x for x in a.arms.split(",") if x)
    if not {"plan", "mtp4", "off"} <= set(a.arms) or not set(a.arms) <= set(ARMS):
        p.error(f"--arms must hold plan, mtp4 and off, and only {ARMS}")
    a.outputs = [int(x) for x in a.outputs.split(",") if x]
    a.loads = [int(x) for x in a.loads.split(",") if x]
    if any(c < 2 for c in a.loads) or not a.outputs:
        p.error("--loads must be >= 2 (half greedy, half sampled) and --outputs non-empty")
    state = run(a)
    (Path(a.out) / "shared_gpu.md").write_text(render_markdown(state))
    log(f"done: {len(state['cells'])} cells; report {Path(a.out) / 'shared_gpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
