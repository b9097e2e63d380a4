"""An engine grid's figures, apart from measuring them: which waves count (a wave that lost only requests of
empty text is admitted, scaled), a round as the mean of its waves, per-cell figures over rounds and runs
against the PyTorch engine without MTP, and the markdown report.

Why in the package: ``benchmarks/gpu/measure_turbomind.py`` measures TurboMind against the PyTorch engine
with and without MTP (the ``gpu_engine_grid_*`` and ``gpu_turbomind_*`` results); these pure parts are what
its tests and the fits that read those results share, and a test imports them from here, never from a
benchmark script.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["EMPTY_TEXT", "counted_rows", "per_round", "pooled", "render_markdown", "summarize"]

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
