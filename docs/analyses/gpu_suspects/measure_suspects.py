"""Where the spread of a GPU measurement comes from (issue #22 item 2): each suspect checked against a
quiet engine in interleaved rounds, with the GPU's clocks logged through every measurement.

One engine under test (LMDeploy's PyTorch engine, MTP off, the test shape's oracle checkpoint, so
acceptance cannot move) measures the same workload — input 512, output 512, concurrency 64, two waves
— under four conditions, every round, in rotating order (round r starts at condition r mod 4), so a
drift of the engine touches all alike:

- ``quiet``: nothing else runs (two TurboMind neighbours are resident and idle throughout: an idle
  co-resident engine showed no detectable effect in an earlier ABAB probe, and keeping them resident
  avoids an engine start per round);
- ``cpu``: one busy-looping process per host CPU (the host's other trials, clients and Ray);
- ``busy1`` / ``busy2``: one / both neighbours serving a closed loop of 32 requests of 512 tokens
  while the engine is measured (co-resident trials of a shared-GPU sweep).

Before the rounds, the engine's first full-length wave is measured on its own (the first-run effect)
and a second one right after. Per condition: mean and 95 % CI over rounds, and the per-round ratio to
``quiet`` of the same round with its CI; a suspect "matters" only when that CI excludes 1. The SM clock,
memory clock, power, temperature and NVML's clock-event reasons are sampled every 0.25 s.

    python -m docs.analyses.gpu_suspects.measure_suspects --ckpt /root/oracle --out $OUT [--rounds 6] [--deadline-s 420]
    python -m docs.analyses.gpu_suspects.measure_suspects --sim --out /tmp/suspects     # dry run, simulated engines
    python -m docs.analyses.gpu_suspects.measure_suspects --render a/suspects.json [b/suspects.json ...]   # the report
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.config import EngineConfig
from orchestrator.engine import EngineProcess
from tuning.stats import mean_confidence_interval

ROOT = Path(__file__).resolve().parents[3]

CONDITIONS = ("quiet", "cpu", "busy1", "busy2")
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[suspects {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ----- conditions -------------------------------------------------------------------------------------
def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass


class CpuHog:
    """One busy-looping process per CPU of the host while active."""

    def __init__(self, n: int) -> None:
        self.n, self.stop, self.procs = n, mp.Event(), []

    def __enter__(self) -> CpuHog:
        self.procs = [mp.Process(target=_spin, args=(self.stop,), daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=10)


class BusyNeighbours:
    """A closed loop of ``concurrency`` requests of ``max_tokens`` tokens on each neighbour engine."""

    def __init__(self, urls: list[str], *, concurrency: int = 32, max_tokens: int = 512) -> None:
        self.urls, self.concurrency, self.max_tokens = urls, concurrency, max_tokens
        self.stop, self.threads, self.done = threading.Event(), [], 0

    def _loop(self, url: str, model: str) -> None:
        import httpx

        body = {"model": model, "prompt": "def fibonacci(n):" * 40, "max_tokens": self.max_tokens,
                "temperature": 0.0, "ignore_eos": True}
        with httpx.Client(timeout=300) as c:
            while not self.stop.is_set():
                c.post(url + "/v1/completions", json=body).raise_for_status()
                self.done += 1

    def __enter__(self) -> BusyNeighbours:
        import httpx

        for url in self.urls:
            model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
            for _ in range(self.concurrency):
                t = threading.Thread(target=self._loop, args=(url, model), daemon=True)
                t.start()
                self.threads.append(t)
        time.sleep(2.0)  # the neighbours' batches fill before the measurement starts
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)


class ClockLog:
    """GPU 0's clocks, power, temperature and clock-event reasons every ``period_s`` (NVML), while active."""

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s, self.samples, self.stop = period_s, [], threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self.nvml = self.handle = None

    def _run(self) -> None:
        n = self.nvml
        while not self.stop.is_set():
            self.samples.append({
                "sm_mhz": n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                "mem_mhz": n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM),
                "power_w": n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
                "temp_c": n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU),
                "reasons": int(n.nvmlDeviceGetCurrentClocksEventReasons(self.handle)),
            })
            self.stop.wait(self.period_s)

    def __enter__(self) -> ClockLog:
        if self.nvml is not None:
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.nvml is not None:
            self.thread.join(timeout=5)

    def summary(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        reasons = 0
        for s in self.samples:
            reasons |= s["reasons"]
        return {"samples": len(self.samples),
                **{f"{k}_mean": round(statistics.fmean(s[k] for s in self.samples), 1)
                   for k in ("sm_mhz", "mem_mhz", "power_w", "temp_c")},
                "sm_mhz_min": min(s["sm_mhz"] for s in self.samples), "reasons_or": hex(reasons)}


# ----- measuring --------------------------------------------------------------------------------------
def measure(url: str, tokenizer: Any, *, seed: int, num_prompts: int, concurrency: int, sim: bool) -> dict[str, Any]:
    from tuning.bench import benchmark
    from tuning.workload import Workload

    w = Workload(input_len=512, output_len=512, range_ratio=1.0, num_prompts=num_prompts, max_concurrency=concurrency,
                 request_rate=float("inf"), temperature=0.0, ignore_eos=True, warmup_requests=0, seed=seed)
    with ClockLog() as clocks:
        r = benchmark(url, w, tokenizer=tokenizer, request_timeout_s=600).to_dict()
    return {"output_throughput": r.get("output_throughput"), "completed": r.get("completed"), "failed": r.get("failed"),
            "duration_s": r.get("duration_s"), "simulated": sim, "clocks": clocks.summary()}


def order_of(round_no: int, conditions: tuple[str, ...] = CONDITIONS) -> list[str]:
    """Round r starts at condition r mod n (a Latin square: every condition takes every slot once in
    n rounds, so a drift within a round favours none)."""
    k = round_no % len(conditions)
    return list(conditions[k:] + conditions[:k])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per condition: mean (95 % CI) over rounds; the per-round ratio to quiet with its CI. A run's
    round is identified by (``engine_start``, ``round``): pooled runs of several engine starts pair each
    condition with the quiet measurement of its own round on its own engine."""
    by_round: dict[tuple[int, int], dict[str, float]] = {}
    for r in runs:
        if r.get("round") is not None and r.get("output_throughput"):
            by_round.setdefault((r.get("engine_start", 0), r["round"]), {})[r["condition"]] = r["output_throughput"]
    out: dict[str, Any] = {}
    for cond in CONDITIONS:
        vals = [v[cond] for v in by_round.values() if cond in v]
        entry: dict[str, Any] = {"n": len(vals), "values": [round(x) for x in vals]}
        if len(vals) >= 2:
            m, lo, hi = mean_confidence_interval(vals)
            entry.update(mean=round(m), ci=[round(lo), round(hi)], cv=round(statistics.stdev(vals) / m, 4))
        ratios = [v[cond] / v["quiet"] for v in by_round.values() if cond in v and "quiet" in v]
        if cond != "quiet" and len(ratios) >= 2:
            m, lo, hi = mean_confidence_interval(ratios)
            entry.update(ratio_to_quiet=round(m, 3), ratio_ci=[round(lo, 3), round(hi, 3)],
                         matters=not (lo <= 1.0 <= hi))
        out[cond] = entry
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    from tuning.workload import load_tokenizer

    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.sim:
        base = EngineConfig(backend="sim", model="qwen35-test-83m-1xh200", memory_fraction=0.1, max_batch_size=128,
                            extra_flags=("--startup-delay", "0"))
        tm = base.replace(simulated_backend="turbomind")
    else:
        base = EngineConfig(backend="pytorch", model=a.ckpt, memory_fraction=0.1, max_batch_size=128, session_len=4096,
                            extra_flags=("--language-model-only",))
        tm = base.replace(backend="turbomind")
    conditions = tuple(a.conditions.split(","))
    busy = max((int(c[-1]) for c in conditions if c.startswith("busy")), default=0)
    result: dict[str, Any] = {
        "command": " ".join(["python", "docs/analyses/gpu_suspects/measure_suspects.py", *sys.argv[1:]]),
        "engine": base.key(), "neighbours": [tm.key()] * busy, "conditions": list(conditions), "simulated": a.sim,
        "rounds_planned": a.rounds,
        "workload": {"input_len": 512, "output_len": 512, "concurrency": a.concurrency, "num_prompts": a.num_prompts},
        "runs": [], "starts_s": {},
    }
    from orchestrator.hostinfo import measured_on, package_versions

    result["host"] = measured_on() | package_versions(("torch", "triton", "ray"))
    tokenizer = load_tokenizer(None if a.sim else a.ckpt)
    logs = out_dir / "engine-logs"
    engines = {"test": EngineProcess(base, log_dir=logs, ready_timeout_s=900)}
    engines |= {f"neighbour{i}": EngineProcess(tm, log_dir=logs, ready_timeout_s=600) for i in range(1, busy + 1)}

    def save() -> None:
        result["summary"] = summarize(result["runs"])
        (out_dir / "suspects.json").write_text(json.dumps(result, indent=1))

    try:
        for name, eng in engines.items():
            t = time.monotonic()
            eng.start()
            eng.wait_until_ready()
            result["starts_s"][name] = round(time.monotonic() - t, 1)
            log(f"{name} ready in {result['starts_s'][name]} s")
        url = engines["test"].base_url
        neighbours = [engines[f"neighbour{i}"].base_url for i in range(1, busy + 1)]
        for label in ("first", "second"):  # the first-run effect, as the sweep's warm-up sees it
            r = measure(url, tokenizer, seed=100, num_prompts=a.concurrency, concurrency=a.concurrency, sim=a.sim)
            result["runs"].append({"condition": f"{label}-wave", "round": None, **r})
            log(f"{label} wave: {r['output_throughput']:.0f} tok/s")
        save()
        for rnd in range(a.rounds):
            if time.monotonic() - T0 > a.deadline_s:
                log(f"deadline: {rnd} of {a.rounds} rounds")
                break
            for cond in order_of(rnd, conditions):
                if cond == "cpu":
                    ctx: Any = CpuHog(mp.cpu_count())
                elif cond.startswith("busy"):
                    ctx = BusyNeighbours(neighbours[: int(cond[-1])])
                else:
                    ctx = None
                if ctx is None:
                    r = measure(url, tokenizer, seed=rnd, num_prompts=a.num_prompts, concurrency=a.concurrency, sim=a.sim)
                else:
                    with ctx:
                        r = measure(url, tokenizer, seed=rnd, num_prompts=a.num_prompts, concurrency=a.concurrency,
                                    sim=a.sim)
                    if isinstance(ctx, BusyNeighbours):
                        r["neighbour_requests_done"] = ctx.done
                result["runs"].append({"condition": cond, "round": rnd, **r})
                clk = r["clocks"] or {}
                log(f"round {rnd} {cond}: {r['output_throughput']:.0f} tok/s, SM {clk.get('sm_mhz_mean')} MHz, "
                    f"reasons {clk.get('reasons_or')}")
                save()
    finally:
        for eng in engines.values():
            eng.stop()
        save()
    return result


# ----- report -----------------------------------------------------------------------------------------
def pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of this script (each its own engine start) as one result: runs tagged with their
    start, the summary over all rounds, the starts' times and commands listed."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    out["runs"] = [r | {"engine_start": i} for i, res in enumerate(results) for r in res["runs"]]
    out["command"] = " ; ".join(res["command"] for res in results)
    out["starts_s"] = [res["starts_s"] for res in results]
    out["neighbours"] = max((res.get("neighbours", []) for res in results), key=len)
    present = {c for res in results for c in res.get("conditions", CONDITIONS)}
    out["conditions"] = [c for c in CONDITIONS if c in present]
    out["summary"] = summarize(out["runs"])
    return out


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    w = result["workload"]
    lines = [
        f"# Where the spread comes from: suspects checked in interleaved rounds{' (SIMULATED)' if result['simulated'] else ''}",
        "",
        f"Command: `{result['command']}`  ",
        f"Engine under test: `{result['engine']}`; neighbours on the same GPU: "
        + (f"{len(result['neighbours'])} `{result['neighbours'][0]}`" if result["neighbours"] else "none") + ".  ",
        f"Workload: input {w['input_len']}, output {w['output_len']}, concurrency {w['concurrency']}, "
        f"{w['num_prompts']} requests per measurement; engine starts (s): {result['starts_s']}.  ",
        f"Host: {result.get('host')}",
        "",
        "| condition | rounds | output tok/s per round | mean (95 % CI) | CV | ratio to quiet (95 % CI) | matters |",
        "|---|---|---|---|---|---|---|",
    ]
    for cond in result.get("conditions", CONDITIONS):
        e = s.get(cond, {})
        ci = f"{e['mean']:,} ({e['ci'][0]:,}–{e['ci'][1]:,})" if "mean" in e else "—"
        ratio = f"{e['ratio_to_quiet']:.3f} ({e['ratio_ci'][0]:.3f}–{e['ratio_ci'][1]:.3f})" if "ratio_to_quiet" in e else "—"
        lines.append(f"| {cond} | {e.get('n', 0)} | {', '.join(f'{v:,}' for v in e.get('values', []))} | {ci} | "
                     f"{e.get('cv', '—')} | {ratio} | {'yes' if e.get('matters') else 'no' if 'matters' in e else '—'} |")
    lines += ["", "| run | start | round | tok/s | SM MHz mean (min) | mem MHz | power W | temp °C | clock-event reasons |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        c = r.get("clocks") or {}
        lines.append(f"| {r['condition']} | {r.get('engine_start', 0)} | {'' if r['round'] is None else r['round']} | "
                     f"{r['output_throughput']:,.0f} | "
                     f"{c.get('sm_mhz_mean', '—')} ({c.get('sm_mhz_min', '—')}) | {c.get('mem_mhz_mean', '—')} | "
                     f"{c.get('power_w_mean', '—')} | {c.get('temp_c_mean', '—')} | {c.get('reasons_or', '—')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure_suspects.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", default="/root/oracle")
    p.add_argument("--out", help="folder for suspects.json and engine logs")
    p.add_argument("--sim", action="store_true", help="simulated engines (a dry run; no GPU figure)")
    p.add_argument("--render", type=Path, nargs="+", help="print the markdown report of one suspects.json, or of "
                   "several (separate engine starts) pooled, and exit")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"a subset of {','.join(CONDITIONS)} with quiet among them (neighbours start only for busy ones)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=128, help="requests per measurement (two waves at 64)")
    p.add_argument("--deadline-s", type=float, default=420, help="no round starts after this (from the start)")
    a = p.parse_args(argv)
    if a.render:
        print(render(pooled([json.loads(f.read_text()) for f in a.render])), end="")
        return 0
    if not a.out:
        p.error("--out is required unless --render")
    conds = a.conditions.split(",")
    if "quiet" not in conds or not set(conds) <= set(CONDITIONS) or len(set(conds)) != len(conds):
        p.error(f"--conditions {a.conditions!r}: distinct names from {','.join(CONDITIONS)}, quiet among them "
                "(every ratio is to quiet)")
    result = run(a)
    print(render(result), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
