"""Measure LMDeploy MTP speculative decoding on one GPU: acceptance vs prediction, greedy equality,
and the throughput/latency matrix (output bucket x concurrency x MTP off / 1..4 draft tokens).

    PYTHONPATH=/root/site:. PATH=/root/site/bin:$PATH \\
    python benchmarks/gpu/measure_mtp.py --ckpt /root/ckpt --out $OUT [--deadline-s 400]
    python benchmarks/gpu/measure_mtp.py --render RESULTS.json > RESULTS.md      # anywhere, no GPU

The checkpoint comes from ``python -m tuning.checkpoint.train`` and holds ``mtp_expected.json``: the
prompts, ``max_tokens`` and the accept length its PyTorch forward pass predicts for 1..4 drafts.

How it runs (all on the GPU the caller is given):

1. Starts one engine per config (MTP off, then ``qwen3_5_mtp`` with each draft count) through
   :class:`orchestrator.engine.EngineProcess`, all at once (their start-up is mostly compilation and
   CUDA-graph capture, so overlapping them saves minutes), each with a small KV share
   (``--cache-max-entry-count``) so they fit together.
2. Measures them one at a time: while one server is measured the others sit idle (an idle LMDeploy
   engine polls at ~25 % of one CPU core; the GPU is not used by them).
3. Acceptance: the predicted prompts, greedy, ``ignore_eos``; accept length from the deltas of
   LMDeploy's ``/metrics`` counters, ``1 + Δaccepted / (Δdraft_tokens / N)``; compared with the
   prediction (±0.15 is the acceptance bar). Greedy outputs of every MTP server are compared with
   the MTP-off server's, text for text.
4. The matrix, after one unmeasured full-length wave per engine (the first-run effect), cell by
   cell (every config per cell, so a deadline leaves whole comparisons): the
   project's bench client (:func:`tuning.bench.benchmark`) on the ``random`` dataset cut from
   held-out Python source (``range_ratio`` 1: every prompt ``--input-len`` tokens, every output
   exactly the bucket length), one wave of ``concurrency`` requests (2 for concurrency 1). The
   script also reads ``/metrics`` itself around each cell, so the bench client's accept length can
   be checked against LMDeploy's counters.

Everything is written to ``--out``: ``gpu_mtp_results.json`` (after every cell, so a timeout keeps
what was measured) and the engines' logs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

SPEC_COUNTERS = {
    "num_drafts": "lmdeploy:spec_decode_num_drafts_total",
    "num_draft_tokens": "lmdeploy:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "lmdeploy:spec_decode_num_accepted_tokens_total",
}
ACCEPT_TOLERANCE = 0.15


def log(msg: str) -> None:
    print(f"[measure {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----- environment ---------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("lmdeploy", "torch", "transformers", "triton", "fla", "flash_attn_interface", "tokenizers"):
        try:
            mod = __import__(name)
            out[name] = str(getattr(mod, "__version__", "present"))
        except Exception as e:
            out[name] = f"missing ({type(e).__name__})"
    try:
        import torch

        out["cuda"] = str(torch.version.cuda)
        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except Exception:
        pass
    try:
        out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        pass
    return out


def gpu_memory_used_mib() -> float | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        return float(r.stdout.strip().splitlines()[0])
    except Exception:
        return None


def gpu_memory_by_pgid() -> dict[int, float]:
    """MiB of GPU memory per process group (an engine and its workers share one)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except Exception:
        return {}
    out: dict[int, float] = {}
    for line in r.stdout.strip().splitlines():
        try:
            pid, mib = (x.strip() for x in line.split(","))
            out[os.getpgid(int(pid))] = out.get(os.getpgid(int(pid)), 0.0) + float(mib)
        except (ValueError, ProcessLookupError):
            continue
    return out


# ----- HTTP ------------------------------------------------------------------------------------------------
def parse_counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for key, name in SPEC_COUNTERS.items():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scrape(base_url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        return parse_counters(r.read().decode())


def accept_length(before: dict[str, float], after: dict[str, float], n: int) -> float | None:
    draft = after.get("num_draft_tokens", 0.0) - before.get("num_draft_tokens", 0.0)
    acc = after.get("num_accepted_tokens", 0.0) - before.get("num_accepted_tokens", 0.0)
    return 1 + acc / (draft / n) if draft > 0 else None


async def _complete(session, base_url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed greedy completion: text, TTFT and end-to-end time."""
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
               "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    parts: list[str] = []
    usage = None
    async with session.post(f"{base_url}/v1/completions", json=payload) as resp:
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {(await resp.text())[:300]}"}
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices") or []:
                if ch.get("text"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    parts.append(ch["text"])
    return {"text": "".join(parts), "ttft_s": ttft, "e2e_s": time.perf_counter() - t0, "usage": usage}


async def run_prompts(base_url: str, model: str, prompts: Sequence[str], max_tokens: int,
                      concurrency: int) -> list[dict[str, Any]]:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(p: str) -> dict[str, Any]:
            async with sem:
                return await _complete(session, base_url, model, p, max_tokens)

        return await asyncio.gather(*(one(p) for p in prompts))


def served_model(base_url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


# ----- engines ---------------------------------------------------------------------------------------------
def engine_configs(ckpt: str, drafts: Sequence[int], mem: float, max_batch_size: int, sim_profile: str | None = None):
    """MTP off plus one config per draft count. ``sim_profile``: the simulated engine instead (a dry
    run of this script without a GPU)."""
    from orchestrator.config import EngineConfig

    if sim_profile:
        off = EngineConfig(backend="sim", model=sim_profile, memory_fraction=mem, max_batch_size=max_batch_size)
    else:
        off = EngineConfig(backend="pytorch", model=ckpt, memory_fraction=mem, max_batch_size=max_batch_size,
                           extra_flags=("--language-model-only",))
    out = {"off": off}
    for n in drafts:
        out[f"mtp{n}"] = out["off"].replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=n)
    return out


def start_engines(configs: dict[str, Any], log_dir: Path, ready_timeout_s: float,
                  sim_time_scale: float | None = None) -> tuple[dict[str, Any], dict]:
    """Start every engine at once, wait for all; returns (engines, info per label)."""
    from orchestrator.engine import EngineProcess
    from orchestrator.errors import OrchestratorError, PreflightError

    engines: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    for label, cfg in configs.items():
        eng = EngineProcess(cfg, log_dir=log_dir, ready_timeout_s=ready_timeout_s, sim_time_scale=sim_time_scale)
        try:
            eng.start()
        except PreflightError as e:  # record, then start without the check so the measurement still runs
            info[label] = {"preflight_error": str(e)}
            log(f"{label}: preflight failed ({e}); starting without it")
            eng = EngineProcess(cfg, log_dir=log_dir, ready_timeout_s=ready_timeout_s, preflight=False,
                                sim_time_scale=sim_time_scale)
            eng.start()
        engines[label] = eng
        info.setdefault(label, {})["argv"] = " ".join(eng.argv)
    for label, eng in engines.items():
        try:
            eng.wait_until_ready()
            info[label]["ready_s"] = round(time.monotonic() - t0, 1)
            log(f"{label} ready after {info[label]['ready_s']} s ({eng.base_url})")
        except OrchestratorError as e:
            info[label]["error"] = str(e)[-3000:]
            log(f"{label} failed: {str(e)[-1500:]}")
    return engines, info


# ----- acceptance --------------------------------------------------------------------------------------------
def acceptance_check(engines: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    prompts, max_tokens = expected["prompts"], expected["max_tokens"]
    out: dict[str, Any] = {"prompts": len(prompts), "max_tokens": max_tokens, "by_config": {}}
    texts: dict[str, list[str]] = {}
    for label, eng in engines.items():
        if not eng.is_alive():
            continue
        model = served_model(eng.base_url)
        before = scrape(eng.base_url)
        t0 = time.monotonic()
        res = asyncio.run(run_prompts(eng.base_url, model, prompts, max_tokens, concurrency=len(prompts)))
        wall = time.monotonic() - t0
        after = scrape(eng.base_url)
        errors = [r["error"] for r in res if "error" in r]
        texts[label] = [r.get("text", "") for r in res]
        row: dict[str, Any] = {"wall_s": round(wall, 2), "errors": errors[:3], "failed": len(errors),
                               "counters_delta": {k: after.get(k, 0) - before.get(k, 0) for k in SPEC_COUNTERS}}
        if label != "off":
            n = eng.config.num_draft_tokens
            measured = accept_length(before, after, n)
            predicted = expected["per_draft_tokens"].get(str(n), {}).get("accept_length")
            row.update(measured_accept_length=measured, predicted_accept_length=predicted,
                       within_tolerance=(measured is not None and predicted is not None
                                         and abs(measured - predicted) <= ACCEPT_TOLERANCE))
            log(f"{label}: accept length measured {measured} predicted {predicted}")
        out["by_config"][label] = row
    if "off" in texts:
        base = texts["off"]
        for label, t in texts.items():
            if label == "off":
                continue
            same = sum(a == b for a, b in zip(base, t))
            prefix = [_common_prefix(a, b) / max(1, len(a)) for a, b in zip(base, t)]
            out["by_config"][label]["greedy_identical_to_off"] = f"{same}/{len(base)}"
            out["by_config"][label]["greedy_mean_common_prefix_fraction"] = round(sum(prefix) / len(prefix), 4)
    out["example_output_off"] = (texts.get("off") or [""])[0][:400]
    return out


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ----- matrix ----------------------------------------------------------------------------------------------
def _bench_cell(eng, workload, counter) -> dict[str, Any]:
    from tuning.bench import benchmark

    r = benchmark(eng.base_url, workload, tokenizer=counter, engine_config=eng.config, request_timeout_s=900)
    d = r.to_dict()
    return {"client": "tuning.bench", "completed": d["completed"], "failed": d["failed"],
            "failure_reasons": d["failure_reasons"], "duration_s": d["duration_s"],
            "output_throughput": d["output_throughput"], "total_output_tokens": d["total_output_tokens"],
            "ttft_ms": d["ttft_ms"], "tpot_ms": d["tpot_ms"], "itl_ms": d["itl_ms"], "e2e_ms": d["e2e_ms"],
            "accept_length": d["accept_length"], "spec_counters": d["spec_counters"]}


def _own_cell(eng, prompts: Sequence[str], output_len: int, concurrency: int) -> dict[str, Any]:
    """Fallback client (used only if the project's bench client fails)."""
    model = served_model(eng.base_url)
    t0 = time.perf_counter()
    res = asyncio.run(run_prompts(eng.base_url, model, prompts, output_len, concurrency))
    dur = time.perf_counter() - t0
    ok = [r for r in res if "error" not in r]
    toks = sum((r.get("usage") or {}).get("completion_tokens", output_len) for r in ok)
    ttft = [r["ttft_s"] * 1e3 for r in ok if r["ttft_s"] is not None]
    tpot = [(r["e2e_s"] - r["ttft_s"]) * 1e3 / max(1, output_len - 1) for r in ok if r["ttft_s"] is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    return {"client": "measure_mtp fallback", "completed": len(ok), "failed": len(res) - len(ok),
            "duration_s": dur, "output_throughput": toks / dur, "total_output_tokens": toks,
            "ttft_ms": {"mean": mean(ttft)}, "tpot_ms": {"mean": mean(tpot)}}


def run_matrix(engines, expected, args, results, save) -> None:
    from tokenizers import Tokenizer

    counter = None
    use_bench = True
    try:
        from tuning.workload import HFTokenCounter, Workload

        tok = Tokenizer.from_file(str(Path(args.ckpt) / "tokenizer.json"))
        counter = HFTokenCounter(tok, name="ckpt-bpe", corpus_text="\n".join(expected["bench_prompts"]))
    except Exception as e:
        use_bench = False
        results["notes"].append(f"project bench client unavailable ({type(e).__name__}: {e}); fallback client used")
    cells = results["matrix"]
    durations: dict[tuple[int, int], float] = {}
    order = [(b, c) for b in args.buckets for c in args.concurrency]
    if use_bench:
        # One unmeasured full-length wave per engine first: a fresh engine's first full-length run is
        # 15-45 % slower than the next (docs/analyses/gpu_suspects/gpu_suspects_h200_2026-12-01), which would
        # bias whichever cell came first.
        conc = min(64, max(args.concurrency))
        wl = Workload(dataset="random", input_len=args.input_len, output_len=max(args.buckets), range_ratio=1.0,
                      num_prompts=conc, max_concurrency=conc, temperature=0.0, ignore_eos=True, seed=1, name="burn-in")
        for label, eng in engines.items():
            if eng.is_alive() and args.deadline_s - (time.monotonic() - results["_t0"]) > 60:
                _bench_cell(eng, wl, counter)
                log(f"burn-in wave on {label} done")
    for bucket, conc in order:
        n_prompts = 2 if conc == 1 else conc
        for label, eng in engines.items():
            key = (bucket, conc)
            est = durations.get(key, bucket * 0.012 * (2 if conc == 1 else 1) + 3)
            remaining = args.deadline_s - (time.monotonic() - results["_t0"])
            if remaining < est * 1.2:
                results["skipped"].append({"output_len": bucket, "concurrency": conc, "config": label,
                                           "reason": f"deadline ({remaining:.0f} s left, ~{est:.0f} s needed)"})
                continue
            if not eng.is_alive():
                results["skipped"].append({"output_len": bucket, "concurrency": conc, "config": label,
                                           "reason": "engine not running"})
                continue
            n = eng.config.num_draft_tokens
            before = scrape(eng.base_url)
            t0 = time.monotonic()
            row: dict[str, Any] = {"output_len": bucket, "concurrency": conc, "config": label, "num_draft_tokens": n,
                                   "input_len": args.input_len, "num_prompts": n_prompts}
            try:
                if not use_bench:
                    raise RuntimeError("bench client unavailable")
                wl = Workload(dataset="random", input_len=args.input_len, output_len=bucket, range_ratio=1.0,
                              num_prompts=n_prompts, max_concurrency=conc, temperature=0.0, ignore_eos=True,
                              seed=bucket + conc, name=f"out{bucket}")
                row.update(_bench_cell(eng, wl, counter))
            except Exception as e:
                if use_bench:
                    results["notes"].append(f"bench client failed at {label}/{bucket}/{conc}: "
                                            f"{type(e).__name__}: {str(e)[:300]}; fallback client from here on")
                    use_bench = False
                prompts = (expected["bench_prompts"] * 4)[:n_prompts]
                row.update(_own_cell(eng, prompts, bucket, conc))
            after = scrape(eng.base_url)
            row["accept_length_from_metrics"] = accept_length(before, after, n) if n else None
            durations[key] = max(durations.get(key, 0.0), time.monotonic() - t0)
            cells.append(row)
            log(f"out {bucket} conc {conc} {label}: {row.get('output_throughput', 0):.0f} tok/s, "
                f"tpot {(row.get('tpot_ms') or {}).get('mean')}, accept {row.get('accept_length')} "
                f"(metrics {row['accept_length_from_metrics']}) in {time.monotonic() - t0:.1f} s")
            save()


# ----- report ------------------------------------------------------------------------------------------------
def render_markdown(res: dict[str, Any]) -> str:
    v = res.get("versions", {})
    lines = [f"# LMDeploy MTP on {v.get('gpu', '?')}: trained tiny Qwen3.5 checkpoint", "",
             f"Measured {res.get('started_at', '?')} with `{res.get('command', '')}`.", "",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()), ""]
    tr = res.get("train_report") or {}
    if tr:
        lines += [f"Checkpoint: {tr.get('parameters', 0) / 1e6:.1f}M parameters, trained "
                  f"{(tr.get('training') or {}).get('seconds', '?')} s "
                  f"({(tr.get('training') or {}).get('tokens', 0) / 1e6:.1f}M tokens).", ""]
    acc = res.get("acceptance") or {}
    if acc:
        lines += [f"## Accept length: LMDeploy vs the trainer's PyTorch prediction "
                  f"({acc.get('prompts')} held-out prompts, {acc.get('max_tokens')} tokens, greedy)", "",
                  "| config | predicted | measured | within ±0.15 | greedy identical to MTP off |",
                  "|---|---|---|---|---|"]
        for label, row in acc.get("by_config", {}).items():
            if label == "off":
                continue
            lines.append(f"| {label} | {_f(row.get('predicted_accept_length'))} | "
                         f"{_f(row.get('measured_accept_length'))} | {row.get('within_tolerance')} | "
                         f"{row.get('greedy_identical_to_off')} |")
        lines.append("")
    eng = res.get("engines") or {}
    if eng:
        lines += ["## Engines", "", "| config | ready after (s, all started together) | GPU MiB | command |",
                  "|---|---|---|---|"]
        for label, e in eng.items():
            lines.append(f"| {label} | {e.get('ready_s', e.get('error', '')[:60])} | {e.get('gpu_mib', '')} | "
                         f"`{e.get('argv', '')}` |")
        lines.append("")
    if res.get("matrix"):
        lines += ["## Matrix (one wave of `concurrency` requests; 2 requests at concurrency 1)", "",
                  "| output len | conc | config | out tok/s | vs off | TPOT mean ms | TTFT mean ms | accept len "
                  "(bench) | accept len (/metrics) | ok/failed |", "|---|---|---|---|---|---|---|---|---|---|"]
        base = {(r["output_len"], r["concurrency"]): r.get("output_throughput") for r in res["matrix"]
                if r["config"] == "off"}
        for r in res["matrix"]:
            b = base.get((r["output_len"], r["concurrency"]))
            ratio = f"{r['output_throughput'] / b:.2f}x" if b and r.get("output_throughput") else ""
            lines.append(f"| {r['output_len']} | {r['concurrency']} | {r['config']} | "
                         f"{_f(r.get('output_throughput'), 0)} | {ratio} | {_f((r.get('tpot_ms') or {}).get('mean'), 2)} | "
                         f"{_f((r.get('ttft_ms') or {}).get('mean'), 1)} | {_f(r.get('accept_length'))} | "
                         f"{_f(r.get('accept_length_from_metrics'))} | {r.get('completed')}/{r.get('failed')} |")
        lines.append("")
    if res.get("skipped"):
        lines += ["## Not measured", ""] + [f"- out {s['output_len']} conc {s['concurrency']} {s['config']}: "
                                            f"{s['reason']}" for s in res["skipped"]] + [""]
    if res.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    return "\n".join(lines)


def _f(x: Any, nd: int = 3) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", default="/root/ckpt")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--draft-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4])
    ap.add_argument("--buckets", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024, 2048])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64])
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--mem", type=float, default=0.1, help="--cache-max-entry-count per engine")
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--deadline-s", type=float, default=420, help="stop starting new cells after this")
    ap.add_argument("--ready-timeout-s", type=float, default=300)
    ap.add_argument("--skip-matrix", action="store_true")
    ap.add_argument("--sim-profile", help="dry run against the simulated engine with this profile (no GPU)")
    ap.add_argument("--sim-time-scale", type=float, default=None)
    ap.add_argument("--versions", action="store_true", help="print the environment's versions and exit")
    ap.add_argument("--render", type=Path, help="print the markdown report of a results JSON and exit")
    a = ap.parse_args(argv)
    if a.render:
        print(render_markdown(json.loads(a.render.read_text())))
        return 0
    if a.versions:
        print(json.dumps(versions(), indent=1))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    ckpt = Path(a.ckpt)
    expected = json.loads((ckpt / "mtp_expected.json").read_text())
    results: dict[str, Any] = {"_t0": time.monotonic(), "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                               "versions": versions(), "notes": [], "skipped": [], "matrix": []}
    tr = ckpt / "train_report.json"
    if tr.exists():
        results["train_report"] = json.loads(tr.read_text())
    out_json = a.out / "gpu_mtp_results.json"

    def save() -> None:
        out_json.write_text(json.dumps({k: v for k, v in results.items() if not k.startswith("_")}, indent=1))

    results["gpu_mib_before"] = gpu_memory_used_mib()
    configs = engine_configs(str(ckpt), a.draft_tokens, a.mem, a.max_batch_size, a.sim_profile)
    engines, info = start_engines(configs, a.out / "engine_logs", a.ready_timeout_s, a.sim_time_scale)
    by_pgid = gpu_memory_by_pgid()
    for label, eng in engines.items():
        if eng.pid is not None:
            info[label]["gpu_mib"] = by_pgid.get(eng.pid)
    results["engines"] = info
    results["gpu_mib_all_running"] = gpu_memory_used_mib()
    save()
    try:
        live = {k: e for k, e in engines.items() if e.is_alive() and "ready_s" in info[k]}
        results["acceptance"] = acceptance_check(live, expected)
        save()
        if not a.skip_matrix:
            run_matrix(live, expected, a, results, save)
    finally:
        for eng in engines.values():
            eng.stop()
        time.sleep(3)
        results["gpu_mib_after_stop"] = gpu_memory_used_mib()
        results["total_s"] = round(time.monotonic() - results["_t0"], 1)
        save()
    print(render_markdown(json.loads(out_json.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
