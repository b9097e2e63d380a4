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

    python benchmarks/gpu/measure_turbomind.py --ckpt /root/ckpt --out $OUT [--concurrency 8,64,256] [--deadline-s 480]
    python benchmarks/gpu/measure_turbomind.py --sim --out /tmp/tm      # dry run, simulated engines
    python benchmarks/gpu/measure_turbomind.py --render results.json     # the markdown report
    python benchmarks/gpu/measure_turbomind.py --render a.json b.json    # several runs pooled per cell

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

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["counted_rows", "engine_configs", "per_round", "pooled", "render_markdown", "summarize"]

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


EMPTY_TEXT = "empty response"
"""The reason the bench client gave, before it counted tokens by the engine's usage, to a request whose
tokens all decoded to empty text: the engine had made them (fixed-length waves, ``ignore_eos``)."""


def counted_rows(rows: list[dict[str, Any]], *, admit_unrecorded: bool = False) -> list[dict[str, Any]]:
    """The waves a summary counts, one per (run, round, wave, engine, cell): the first that lost no request;
    failing that, the first whose only losses were requests of empty text (:data:`EMPTY_TEXT`), its
    throughput scaled by (completed + lost) / completed for the tokens the client did not count, and
    ``admitted`` says why ("empty text"). ``admit_unrecorded`` treats losses without a recorded reason
    (runs before the client recorded them) the same way (``admitted``: "unrecorded"); the report marks
    each."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        if not r.get("output_throughput"):
            continue
        key = (r.get("run", 0), r["round"], r.get("wave", 0), r["engine"], r.get("output_len", 512),
               r.get("concurrency", 64), r["temperature"])
        lost = r.get("failed") or 0
        reasons = r.get("failure_reasons")
        if lost == 0:
            if key not in best or best[key].get("admitted"):  # a clean wave replaces an admitted one
                best[key] = r
        elif key not in best and r.get("completed") and (
                (reasons and set(reasons) == {EMPTY_TEXT}) or (reasons is None and admit_unrecorded)):
            scale = (r["completed"] + lost) / r["completed"]
            best[key] = r | {"output_throughput": r["output_throughput"] * scale,
                             "admitted": "empty text" if reasons else "unrecorded"}
    return list(best.values())


def per_round(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (run, round, engine, cell) as :func:`tuning.simfit.mean_per_round` makes it (the mean of
    the round's waves, ``waves`` how many), ``admitted`` the first admitted wave's reason."""
    from tuning.simfit import ROUND_KEY, mean_per_round

    rows = [{"run": 0, "output_len": 512, "concurrency": 64, **r} for r in rows]  # runs of one length and load
    admitted: dict[tuple[Any, ...], str] = {}
    for r in rows:
        if r.get("admitted"):
            admitted.setdefault(tuple(r[k] for k in ROUND_KEY), r["admitted"])
    return [r | {"admitted": admitted.get(tuple(r[k] for k in ROUND_KEY))} for r in mean_per_round(rows)]


def pooled(results: list[dict[str, Any]], *, admit_unrecorded: bool = False) -> dict[str, Any]:
    """Several runs of this script as one result: each run's rows tagged with its index, the summary
    per cell over all of them (a run's rounds and the runs' are alike: each an engine start's
    measurement), commands and engine starts listed per run."""
    out = dict(results[0])
    out["notes"] = [n for res in results for n in res.get("notes", [])]
    engines = dict(results[0]["engines"])
    for i, res in enumerate(results[1:], start=2):
        for name, cfg in res["engines"].items():
            if name in engines and engines[name] != cfg:
                out["notes"].append(f"engine {name} differs in run {i}: "
                                    + ", ".join(f"{k} {engines[name].get(k)!r} -> {v!r}" for k, v in cfg.items()
                                                if engines[name].get(k) != v))
            engines.setdefault(name, cfg)
        if res["ckpt"] != out["ckpt"]:
            out["notes"].append(f"run {i} measured checkpoint {res['ckpt']} (run 1: {out['ckpt']})")
    out["engines"] = engines
    out["rows"] = [r | {"run": i} for i, res in enumerate(results) for r in res["rows"]]
    out["runs"] = [{"command": res["command"], "rounds": res["rounds"], "order": res["order"],
                    "starts": res["starts"], "elapsed_s": res.get("elapsed_s")} for res in results]
    concs = sorted({c for res in results for c in _as_list(res["workload"]["concurrency"])})
    olens = sorted({o for res in results for o in _as_list(res["workload"]["output_len"])})
    out["workload"] = dict(results[0]["workload"], concurrency=concs, output_len=olens)
    out["summary"] = summarize(out["rows"], admit_unrecorded=admit_unrecorded)
    out["admit_unrecorded"] = admit_unrecorded
    return out


def _as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


def summarize(rows: list[dict[str, Any]], *, admit_unrecorded: bool = False) -> dict[str, Any]:
    """Per (engine, output length, concurrency, temperature): throughputs per round (of every run; a
    round's figure is the mean of its waves, see ``--waves``), mean, 95 % interval over the rounds, spread;
    and each engine's mean over the PyTorch engine without MTP in the same cell, with the range the
    per-round extremes allow. Waves as :func:`counted_rows` picks them."""
    from tuning.stats import mean_confidence_interval

    groups: dict[tuple[str, int, int, float], list[dict[str, Any]]] = {}
    for r in per_round(counted_rows(rows, admit_unrecorded=admit_unrecorded)):
        groups.setdefault((r["engine"], r.get("output_len", 512), r.get("concurrency", 64), r["temperature"]),
                          []).append(r)
    out: dict[str, Any] = {}
    for (engine, olen, conc, temp), rs in sorted(groups.items()):
        vals = [r["output_throughput"] for r in rs]
        mean, low, high = mean_confidence_interval(vals)
        accept = [r["accept_length"] for r in rs if r.get("accept_length")]
        out[_key(engine, olen, conc, temp)] = {
            "engine": engine, "output_len": olen, "concurrency": conc, "temperature": temp, "rounds": len(vals),
            "output_throughput": [round(v, 1) for v in vals], "mean": round(mean, 1),
            "ci95": [round(low, 1), round(high, 1)],
            "min": round(min(vals), 1), "max": round(max(vals), 1),
            "spread": round((max(vals) - min(vals)) / mean, 4),
            "accept_length": [round(a, 3) for a in accept] or None,
            "admitted": [r.get("admitted") for r in rs],
            "waves": [r.get("waves", 1) for r in rs],
        }
    for s in out.values():
        base = out.get(_key("pytorch-mtp-off", s["output_len"], s["concurrency"], s["temperature"]))
        if base and s["engine"] != "pytorch-mtp-off":
            s["vs_pytorch_mtp_off"] = {"ratio_of_means": round(s["mean"] / base["mean"], 3),
                                       "low": round(s["min"] / base["max"], 3),
                                       "high": round(s["max"] / base["min"], 3)}
    return out


def _key(engine: str, output_len: int, concurrency: int, temperature: float) -> str:
    return f"{engine}@o{output_len}@c{concurrency}@T{temperature:g}"


def render_markdown(res: dict[str, Any]) -> str:
    """The report of one run, or of several :func:`pooled` ones (each run's command, order and engine
    starts listed; a value from a wave admitted by :func:`counted_rows` carries a *)."""
    sim = res.get("simulated")
    w = res["workload"]
    concs = _as_list(w["concurrency"])
    engines = ", ".join(res["engines"])
    runs = res.get("runs") or [{"command": res["command"], "rounds": res["rounds"], "order": res["order"],
                                "starts": res["starts"]}]
    lines = [f"# TurboMind vs LMDeploy's PyTorch engine ({engines}){' — SIMULATED' if sim else ''}", ""]
    for i, run in enumerate(runs):
        lines.append(f"{f'Run {i + 1}: ' if len(runs) > 1 else ''}Command: `{run['command']}`; {run['rounds']} rounds, "
                     f"order per round: {' | '.join(', '.join(o) for o in run['order'])}; engine starts (s to ready): "
                     + ", ".join(f"{e['engine']} {e['ready_s']}" for e in run["starts"]) + ".  ")
    lines += [f"Versions: {json.dumps(res.get('versions', {}))}  ",
              f"Host: {json.dumps(res.get('host', {}))}  ",
              f"Checkpoint: `{res['ckpt']}`; workload: concurrency {', '.join(map(str, concs))}, one wave of as many "
              f"requests as the concurrency (`num_prompts` {w.get('num_prompts') or 'per concurrency'}), input "
              f"{w['input_len']} / output {w['output_len']} tokens (fixed, ignore_eos), "
              + (f"{w['waves']} measured waves per cell per round (wave k with the prompts of seed k; a round's figure "
                 "is the mean of its waves)" if w.get("waves", 1) > 1 else "one measured wave per cell per round")
              + f", after {res.get('warmup', 'one unmeasured full-length wave per temperature')} per engine start.",
              "", "| engine | output | concurrency | T | output tok/s per round | mean (95 % CI) | spread "
              "| vs PyTorch MTP off (mean; range) | accept length |",
              "|---|---|---|---|---|---|---|---|---|"]
    admitted: set[str] = set()
    mark = {"empty text": "*", "unrecorded": "†"}
    for s in res["summary"].values():
        v = s.get("vs_pytorch_mtp_off")
        vs = f"{v['ratio_of_means']:.2f}x ({v['low']:.2f}–{v['high']:.2f})" if v else "—"
        acc = ", ".join(f"{a:.2f}" for a in s["accept_length"]) if s.get("accept_length") else "—"
        ci = s.get("ci95")
        ci_text = f" ({ci[0]:,.0f}–{ci[1]:,.0f})" if ci and s["rounds"] > 1 else ""
        marks = s.get("admitted") or [None] * len(s["output_throughput"])
        admitted |= {m for m in marks if m}
        waves = s.get("waves") or [1] * len(marks)
        short = [n < w.get("waves", 1) for n in waves]
        admitted |= {"short"} if any(short) else set()
        values = ", ".join(f"{x:,.0f}{mark.get(m, '')}{'‡' if few else ''}"
                           for x, m, few in zip(s["output_throughput"], marks, short))
        lines.append(f"| {s['engine']} | {s.get('output_len', w['output_len'])} | {s.get('concurrency', concs[0])} | "
                     f"{s['temperature']:g} | {values} | {s['mean']:,.0f}{ci_text} | {s['spread']:.1%} "
                     f"| {vs} | {acc} |")
    lines.append("")
    if "empty text" in admitted:
        lines += [f"\\* a wave that lost requests whose tokens all decoded to empty text (`{EMPTY_TEXT}`: the stream "
                  "ended normally, no text in it): counted, its throughput scaled by (completed + lost) / completed. "
                  "The bench client counts such tokens by the engine's usage since.", ""]
    if "unrecorded" in admitted:
        lines += ["† a wave that lost requests without a recorded reason (a run before reasons were recorded), "
                  "admitted the same way (`--admit-unrecorded`).", ""]
    if "short" in admitted:
        lines += ["‡ a round with fewer measured waves than asked for (a wave that lost requests in every attempt is "
                  "left out): the mean of the waves it has, other prompts than the full rounds'.", ""]
    lines += [f"- {n}" for n in res.get("notes", [])]
    return "\n".join(lines) + "\n"


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
