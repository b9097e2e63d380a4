"""Soak: many concurrent streaming clients through the Serve router for a fixed time; count errors and
watch the router replica's memory.

    python -m benchmarks.soak_router [--streams 256] [--seconds 60] [--warmup-seconds 15]
        [--max-tokens 512] [--input-tokens 256] [--time-scale 1]
        [--engine-transport grpc|object_ref] [--proxy-grpc] [--throughput-optimized] [--direct-ingress]
        [--malloc-arena-max N]
        [--out-dir DIR | --out benchmarks/results/soak_router]

One simulated engine (MTP, 3 draft tokens) behind the router (API key on, like production), on a local
Ray. ``--streams`` clients each send one streaming ``/v1/completions`` after another (closed loop):
first for ``--warmup-seconds`` (not counted: imports, connection pools and allocator arenas fill up),
then for ``--seconds`` (measured). The resident memory (``VmRSS`` from ``/proc``) of the router
replica, the HTTP proxy and the engine replica is sampled every second from the end of the warm-up;
the router's growth is (RSS at the end) - (RSS at the start of the measured window), with a
least-squares slope over the window so one allocator spike isn't read as a leak, and the slope of the
first and the second half of the window compared: a leak keeps its slope (so much per request), a
warm-up plateau flattens.

A request counts as failed when the status isn't 200, the stream carries an ``error`` event, the
connection breaks, or no usage chunk arrives. Every time is wall-clock at the client. Writes
``<out>.json`` and ``<out>.md`` (``--out-dir DIR``: ``DIR/soak_router.json`` and ``.md``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.sim_serve import (
    MODEL,
    SIM_MTP3,
    add_serve_arguments,
    apply_serve_env,
    serve_settings,
    served_sim_table,
)
from benchmarks.sim_serve import prompts as sample_prompts
from orchestrator.fsutil import utc_now_iso

ROOT = Path(__file__).resolve().parents[1]

API_KEY = "sk-soak"
APP = "soak"


# ----- load ------------------------------------------------------------------------------------------
async def _one(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    t0 = time.perf_counter()
    first = last = None
    chunks = 0
    tokens = 0
    try:
        async with session.post(url, json=body, headers={"authorization": f"Bearer {API_KEY}"}) as resp:
            if resp.status != 200:
                return {"ok": False, "error": f"HTTP {resp.status}: {(await resp.text())[:160]}", "start": t0}
            async for line in resp.content:
                if line.startswith(b"event: error") or b'"error"' in line:
                    return {"ok": False, "error": f"stream error: {line[:160].decode(errors='replace')}", "start": t0}
                if not line.startswith(b"data: {"):
                    continue
                now = time.perf_counter()
                if b'"usage": {' in line or b'"usage":{' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
                    continue
                chunks += 1
                if first is None:
                    first = now
                last = now
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:120]}", "start": t0}
    end = time.perf_counter()
    if tokens <= 0:
        return {"ok": False, "error": "no usage chunk", "start": t0}
    itl = ((last - first) / (chunks - 1)) if first is not None and last is not None and chunks > 1 else None
    return {"ok": True, "start": t0, "end": end, "ttft_s": (first or end) - t0, "e2e_s": end - t0,
            "itl_s": itl, "tokens": tokens}


async def closed_loop(url: str, *, streams: int, seconds: float, max_tokens: int, prompts: list[str],
                      results: list[dict[str, Any]] | None = None) -> tuple[list, float]:
    results = [] if results is None else results
    deadline = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    rng = random.Random(0)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        async def worker() -> None:
            while time.perf_counter() < deadline:
                results.append(await _one(session, url, rng.choice(prompts), max_tokens))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - started
    return results, wall


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [r for r in results if r["ok"]]
    errors: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            errors[r["error"][:100]] = errors.get(r["error"][:100], 0) + 1
    ms = lambda key: [r[key] * 1000 for r in ok if r.get(key) is not None]
    stats = {}
    for key in ("ttft_s", "itl_s", "e2e_s"):
        v = ms(key)
        name = key[:-2] + "_ms"
        stats[name] = {"median": round(statistics.median(v), 2) if v else None,
                       "p99": round(_pct(v, 0.99), 2) if v else None, "max": round(max(v), 2) if v else None}
    tokens = sum(r["tokens"] for r in ok)
    return {"requests": len(results), "completed": len(ok), "failed": len(results) - len(ok), "errors": errors,
            "wall_s": round(wall, 2), "output_tokens": tokens, "output_throughput": round(tokens / wall, 1),
            "request_throughput": round(len(ok) / wall, 2), **stats}


# ----- memory ----------------------------------------------------------------------------------------
def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is among ``pid``'s ancestors (by ``PPid`` in ``/proc``)."""
    seen = 0
    while pid > 1 and seen < 64:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")))
        if pid == ancestor:
            return True
        seen += 1
    return False


def find_pids(app: str = APP) -> dict[str, int]:
    """Router replica, HTTP proxy and engine replica processes of *this* script's Ray (by Ray's
    process titles, among the descendants of this process: another Ray on the same host, or one
    still shutting down, must not be sampled instead)."""
    wanted = {"router": f"ServeReplica:{app}:router", "proxy": "ProxyActor", "engine_replica": f"ServeReplica:{app}:"}
    found: dict[str, int] = {}
    me = os.getpid()
    for entry in sorted((e for e in Path("/proc").iterdir() if e.name.isdigit()), key=lambda e: int(e.name)):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for name, needle in wanted.items():
            if needle in cmd and name not in found and _descends_from(int(entry.name), me):
                if name == "engine_replica" and "router" in cmd:
                    continue
                found[name] = int(entry.name)
    return found


def _slope(pts: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (0 when x does not vary)."""
    if len(pts) < 2:
        return 0.0
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else 0.0


class MemorySampler:
    """Samples each process's RSS (and, through ``done``, how many requests had finished) every
    ``period_s``."""

    def __init__(self, pids: dict[str, int], period_s: float = 1.0, done: Any = None) -> None:
        self.pids, self.period_s, self.done = pids, period_s, done
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.perf_counter()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append({"t_s": round(time.perf_counter() - self._t0, 2),
                                 "requests_done": self.done() if self.done else None,
                                 **{k: _rss_kib(p) for k, p in self.pids.items()}})
            self._stop.wait(self.period_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def report(self, name: str) -> dict[str, Any]:
        pts = [(s["t_s"], s[name], s.get("requests_done")) for s in self.samples if s.get(name)]
        if len(pts) < 4:
            return {}
        vs = [p[1] for p in pts]
        half = len(pts) // 2
        halves = {}
        for label, part in (("first_half", pts[:half + 1]), ("second_half", pts[half:])):
            d = {"slope_mib_per_min": round(_slope([(t, v) for t, v, _ in part]) * 60 / 1024, 3),
                 "growth_mib": round((part[-1][1] - part[0][1]) / 1024, 2)}
            if part[0][2] is not None and part[-1][2] is not None and part[-1][2] > part[0][2]:
                # Per finished request: growth against requests done, least squares (KiB/request).
                d["kib_per_request"] = round(_slope([(r, v) for _, v, r in part]), 2)
                d["requests"] = part[-1][2] - part[0][2]
            halves[label] = d
        return {"start_mib": round(vs[0] / 1024, 1), "end_mib": round(vs[-1] / 1024, 1),
                "max_mib": round(max(vs) / 1024, 1), "growth_mib": round((vs[-1] - vs[0]) / 1024, 2),
                "growth_pct": round(100 * (vs[-1] - vs[0]) / vs[0], 2),
                "slope_mib_per_min": round(_slope([(t, v) for t, v, _ in pts]) * 60 / 1024, 3),
                "samples": len(pts), **halves}


# ----- main ------------------------------------------------------------------------------------------
def memory_verdict(router: dict[str, Any], seconds: float) -> str:
    """What the router's memory curve says, in one sentence (judged, not just printed).

    ``flat``: grew <= 2 % over the window. ``plateau``: the second half's slope is below a quarter of
    the first half's (the growth is settling). ``steady growth``: the second half grows at least 3/4 as
    fast as the first (what a per-request leak looks like). Otherwise ``slowing``.
    """
    if not router:
        return "- Router memory was not sampled (its process was not found)."
    first, second = router.get("first_half", {}), router.get("second_half", {})
    s1, s2 = first.get("slope_mib_per_min", 0.0), second.get("slope_mib_per_min", 0.0)
    halves = (f"first half {s1} MiB/min ({first.get('kib_per_request', '?')} KiB/request), second half {s2} MiB/min "
              f"({second.get('kib_per_request', '?')} KiB/request)")
    if router["growth_pct"] <= 2.0:
        return f"- Verdict: **flat** — no sign of a leak within {seconds:g} s (growth <= 2 %; {halves})."
    if s1 > 0 and s2 < 0.25 * s1:
        return f"- Verdict: **plateau** — growth settles: {halves}."
    if s1 > 0 and s2 >= 0.75 * s1:
        return (f"- Verdict: **steady growth** (leak-like) — {halves}. A longer run decides whether it ever "
                "levels off.")
    return f"- Verdict: **slowing** — {halves}; not settled within {seconds:g} s."


def markdown(r: dict[str, Any]) -> str:
    s, w, m = r["soak"], r["settings"], r["memory"]
    router = m.get("router", {})
    lines = [
        "# Router soak (simulated engine)", "",
        f"Command: `{r['command']}`", "",
        f"Versions: {', '.join(f'{k} {v}' for k, v in r['versions'].items())}. Machine: {r['machine']['cpus']} CPU "
        f"cores, no GPU ({r['machine']['platform']}); load average before / after: "
        f"{' / '.join(f'{x:.1f}' for x in r['load_average_before'])} -> {' / '.join(f'{x:.1f}' for x in r['load_average_after'])}.", "",
        f"Workload: {w['streams']} concurrent streaming `/v1/completions` clients in a closed loop for {w['seconds']:g} s "
        f"(after {w['warmup_seconds']:g} s of warm-up, not counted), {w['input_tokens']}-token prompts, max_tokens="
        f"{w['max_tokens']} with ignore_eos, API key on; one simulated engine (profile `{MODEL}`, MTP 3 draft tokens, "
        f"time scale {w['time_scale']:g}) behind the router. Times are wall-clock at the client.", "",
        "| | |", "| --- | --- |",
        f"| requests (completed / **failed**) | {s['requests']} ({s['completed']} / **{s['failed']}**) |",
        f"| output tokens | {s['output_tokens']} ({s['output_throughput']:.0f} tok/s, {s['request_throughput']:.1f} req/s) |",
        f"| TTFT median / p99 / max, ms | {s['ttft_ms']['median']} / {s['ttft_ms']['p99']} / {s['ttft_ms']['max']} |",
        f"| inter-token latency median / p99, ms | {s['itl_ms']['median']} / {s['itl_ms']['p99']} |",
        f"| end-to-end median / p99, ms | {s['e2e_ms']['median']} / {s['e2e_ms']['p99']} |",
        f"| **router replica RSS** start -> end (max) | {router.get('start_mib')} -> {router.get('end_mib')} MiB "
        f"({router.get('max_mib')}); **growth {router.get('growth_mib')} MiB ({router.get('growth_pct')} %)**, "
        f"slope {router.get('slope_mib_per_min')} MiB/min |",
        f"| router RSS slope, first / second half of the window | {router.get('first_half', {}).get('slope_mib_per_min')} / "
        f"{router.get('second_half', {}).get('slope_mib_per_min')} MiB/min ({router.get('first_half', {}).get('kib_per_request')} / "
        f"{router.get('second_half', {}).get('kib_per_request')} KiB per request) |",
        f"| Serve path | engine stream over {r['serve']['engine_transport']}"
        f"{', proxy over gRPC' if r['serve']['proxy_grpc'] else ''}"
        f"{', direct ingress (no proxy)' if r['serve'].get('direct_ingress') else ''}"
        f"{', RAY_SERVE_THROUGHPUT_OPTIMIZED=1' if r['serve']['throughput_optimized'] else ''}"
        f"{', MALLOC_ARENA_MAX=' + str(w['malloc_arena_max']) if w.get('malloc_arena_max') else ''} |",
    ]
    for name in ("proxy", "engine_replica"):
        x = m.get(name, {})
        if x:
            lines.append(f"| {name.replace('_', ' ')} RSS start -> end | {x['start_mib']} -> {x['end_mib']} MiB "
                         f"(growth {x['growth_mib']} MiB; slope first / second half "
                         f"{x.get('first_half', {}).get('slope_mib_per_min')} / {x.get('second_half', {}).get('slope_mib_per_min')} MiB/min) |")
    if s["errors"]:
        lines.append(f"| errors | {json.dumps(s['errors'])} |")
    lines += ["", "## Reading these figures honestly", "", *r["notes"], ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--warmup-seconds", type=float, default=15.0)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--input-tokens", type=int, default=256)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--malloc-arena-max", type=int, default=None,
                   help="start Ray with MALLOC_ARENA_MAX=N (glibc arenas per process; tells allocator growth from a leak)")
    add_serve_arguments(p)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak_router"))
    a = p.parse_args()
    apply_serve_env(a)
    if a.malloc_arena_max:
        os.environ["MALLOC_ARENA_MAX"] = str(a.malloc_arena_max)

    import ray

    load_before = os.getloadavg()
    config = SIM_MTP3
    prompts = sample_prompts(64, a.input_tokens)
    tmp = Path(tempfile.mkdtemp(prefix="soak-router-"))
    with served_sim_table(config, work_dir=tmp, api_key=API_KEY, time_scale=a.time_scale,
                          num_cpus=a.num_cpus, app_name=APP, engine_transport=a.engine_transport, direct_ingress=a.direct_ingress) as url:
        pids = find_pids()
        print("processes:", pids, flush=True)
        warm, warm_wall = asyncio.run(closed_loop(url, streams=a.streams, seconds=a.warmup_seconds,
                                                  max_tokens=a.max_tokens, prompts=prompts))
        print("warm-up:", json.dumps(summarize(warm, warm_wall)), flush=True)
        results: list[dict[str, Any]] = []
        sampler = MemorySampler(pids, done=lambda: len(results))
        sampler.start()
        results, wall = asyncio.run(closed_loop(url, streams=a.streams, seconds=a.seconds,
                                                max_tokens=a.max_tokens, prompts=prompts, results=results))
        sampler.stop()
        soak = summarize(results, wall)
        print("soak:", json.dumps(soak), flush=True)

    memory = {name: sampler.report(name) for name in pids}
    import fastapi
    import pydantic

    router = memory.get("router", {})
    growth_kib = (router.get("growth_mib") or 0.0) * 1024
    per_request_kib = round(max(0.0, growth_kib) / max(1, soak["requests"]), 2)
    notes = [
        f"- **Errors: {soak['failed']}** of {soak['requests']} requests"
        + (" — every request completed with its usage chunk." if soak["failed"] == 0 else f": {soak['errors']}."),
        f"- **Router memory: {router.get('growth_mib')} MiB ({router.get('growth_pct')} %) over the measured "
        f"{a.seconds:g} s** (least-squares slope {router.get('slope_mib_per_min')} MiB/min), i.e. at most "
        f"{per_request_kib} KiB per request even if all of it were a leak. One run of {a.seconds:g} s bounds a leak "
        "only coarsely (allocator arenas and Ray's metric buffers settle over minutes); a slow leak would need a "
        "longer soak (`--seconds 3600`).",
        memory_verdict(router, a.seconds),
        f"- **CPU-bound**: the host has 2 cores shared by the load generator ({a.streams} streams in one Python process), the "
        "simulated engine, Ray (GCS, raylet, Serve controller, HTTP proxy, router and engine replicas) and, during this "
        "run, other jobs of this project (see the load averages). Latencies here are queueing for CPU, not the router's "
        "logic; throughput is what 2 contended cores sustain, not a capacity figure for a GPU server's CPUs.",
        "- The simulated engine's figures are in simulated time; nothing here is a GPU measurement.",
    ]
    result = {
        "command": " ".join(["python", "benchmarks/soak_router.py", *sys.argv[1:]]),
        "settings": vars(a) | {"engine_config": config.to_dict()},
        "versions": {"python": platform.python_version(), "ray": ray.__version__, "fastapi": fastapi.__version__,
                     "pydantic": pydantic.__version__, "aiohttp": aiohttp.__version__},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor(),
                    "gpu": "none"},
        "simulated": True,
        "serve": serve_settings(a),
        "warmup": summarize(warm, warm_wall),
        "soak": soak,
        "memory": memory,
        "memory_samples": sampler.samples,
        "met": {"zero_errors": soak["failed"] == 0 and soak["completed"] > 0},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "finished_at": utc_now_iso(),
        "notes": notes,
    }
    out = Path(a.out_dir) / "soak_router" if a.out_dir else Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["met"]["zero_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
