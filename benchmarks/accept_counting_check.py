"""Does LMDeploy's counted accept length rise with load because of how it counts? A check on committed
H200 figures (no GPU): ``python benchmarks/accept_counting_check.py``.

The measurement (``--measurement``, default ``benchmarks/results/gpu_mtp_h200_2026-11-29.json``) ran MTP-1..4
on one checkpoint at concurrency 1, 8 and 64 with the counters' deltas per cell. Take each config's
concurrency-1 cell as the engine's true tokens per step (solved from its counted figure and its outputs
per request), assume a constant per-draft acceptance (a chain), and predict what the counters report at 8
and 64 from the outputs per request each cell's counters saw (:func:`tuning.bench.counters.counted_accept_length`).
If acceptance itself did not change with load, the prediction meets the counted figure; the write-up
says how close it comes. Writes ``--out-prefix``.json and .md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuning.bench.counters import (
    chain_accept_distribution,
    counted_accept_length,
    outputs_per_request,
)

MEASUREMENT = ROOT / "benchmarks" / "results" / "gpu_mtp_h200_2026-11-29.json"
OUT_PREFIX = ROOT / "benchmarks" / "results" / "accept_counting_check_2026-12-02"
SAME_PROMPTS = [ROOT / "benchmarks" / "results" / "gpu_accept_vs_load_h200_2026-12-02" / f"{e}_turbomind_results.json"
                for e in ("mtp4", "mtp2")]


def _rel(path: Path) -> str:
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def _bisect(f, lo: float, hi: float, target: float) -> float:
    """``x`` in [lo, hi] with ``f(x) = target`` for an increasing ``f`` (60 halvings)."""
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


def per_draft_for(tokens_per_step: float, n: int) -> float:
    """The per-draft acceptance of a chain of ``n`` drafts whose mean step emits ``tokens_per_step``."""
    def mean(p: float) -> float:
        return sum((1 + k) * q for k, q in enumerate(chain_accept_distribution(p, n)))
    return _bisect(mean, 0.0, 1.0, tokens_per_step)


def counted(tokens_per_step: float, n: int, outputs: float) -> float:
    return counted_accept_length(tokens_per_step, chain_accept_distribution(per_draft_for(tokens_per_step, n), n),
                                 outputs)


def true_tokens_per_step(counted_figure: float, n: int, outputs: float) -> float:
    """The tokens per step whose counted figure at ``outputs`` per request is ``counted_figure``."""
    return _bisect(lambda t: counted(t, n, outputs), 1.0, float(n + 1), counted_figure)


def check(measurement: dict[str, Any]) -> list[dict[str, Any]]:
    cells = [c for c in measurement["matrix"] if c.get("num_draft_tokens") and c.get("accept_length")]
    out = []
    for c in cells:
        base = next(b for b in cells if b["config"] == c["config"] and b["output_len"] == c["output_len"]
                    and b["concurrency"] == min(x["concurrency"] for x in cells))
        n = int(c["num_draft_tokens"])
        base_outputs = outputs_per_request(base["spec_counters"], base["completed"])
        truth = true_tokens_per_step(base["accept_length"], n, base_outputs)
        outputs = outputs_per_request(c["spec_counters"], c["completed"])
        steps = (c["total_output_tokens"] - c["completed"]) / truth
        out.append({"config": c["config"], "num_draft_tokens": n, "output_len": c["output_len"],
                    "concurrency": c["concurrency"], "counted": round(c["accept_length"], 3),
                    "outputs_per_request": round(outputs, 2),
                    "counted_share_of_steps": round(c["spec_counters"]["num_drafts"] / steps, 3),
                    "true_tokens_per_step": round(truth, 3),
                    "predicted_counted": round(counted(truth, n, outputs), 3),
                    "if_only_last_step": round(counted(truth, n, 1.0), 3),
                    "baseline_prompts": base.get("num_prompts")})
    return out


def last_step_limit(measurements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs without counter deltas (one prompt set at several concurrencies): the lowest concurrency's
    figure taken as the truth, the highest's against the limit where only each request's last step is
    counted."""
    out = []
    for m in measurements:
        rows = [r for r in m["rows"] if r.get("accept_length")]
        engines = m["engines"]
        for key in sorted({(r["engine"], r["output_len"], r["temperature"]) for r in rows}):
            cells = {r["concurrency"]: r["accept_length"] for r in rows if (r["engine"], r["output_len"], r["temperature"]) == key}
            low, high = min(cells), max(cells)
            n = int(engines[key[0]]["num_draft_tokens"])
            out.append({"engine": key[0], "output_len": key[1], "temperature": key[2], "low_concurrency": low,
                        "high_concurrency": high, "counted_low": round(cells[low], 3), "counted_high": round(cells[high], 3),
                        "if_only_last_step": round(counted(cells[low], n, 1.0), 3)})
    return out


def render_md(rows: list[dict[str, Any]], command: str, source: str,
              limits: list[dict[str, Any]] | None = None, limit_sources: list[str] | None = None) -> str:
    loaded = [r for r in rows if r["concurrency"] > min(x["concurrency"] for x in rows)]
    errors = [r["predicted_counted"] - r["counted"] for r in loaded]
    rise = [r["counted"] - r["true_tokens_per_step"] for r in loaded]
    lines = [
        "# LMDeploy's counted accept length under load: a counting effect (issue #18 item 5)",
        "",
        f"Command: `{command}` (no GPU). Measurement: `{source}` (LMDeploy 0.18, PyTorch engine, MTP-1..4, "
        "trained test checkpoint, one H200; per cell the speculative-decoding counters' deltas).",
        "",
        "Method: each config's lowest-concurrency cell gives its true tokens per step (solved from its counted "
        "figure and outputs per request); a chain of constant per-draft acceptance gives the last step's "
        "distribution; each other cell's counted figure is predicted from the outputs per request its counters "
        "saw (`tuning.bench.counters.counted_accept_length`: the finishing step, length-biased and "
        "untruncated, plus evenly taken others). If acceptance itself followed load, the prediction would miss "
        "by the load effect.",
        "",
        f"**Result**: the counted figure at higher concurrency exceeds the true tokens per step by "
        f"{min(rise):+.2f} to {max(rise):+.2f}; the counting model predicts it within {min(errors):+.2f} to "
        f"{max(errors):+.2f} (mean absolute {sum(map(abs, errors)) / len(errors):.2f}) from the outputs per "
        f"request alone. The counters saw {min(r['counted_share_of_steps'] for r in loaded):.0%}-"
        f"{max(r['counted_share_of_steps'] for r in loaded):.0%} of the decode steps in those cells. The "
        f"baseline cells sent {', '.join(sorted({str(r['baseline_prompts']) for r in rows}))} prompts each: their "
        "prompt sample's error carries into every prediction of their series (other prompts accept differently "
        "at any load).",
        "",
        "| config | output | concurrency | counted | outputs / request | share of steps counted | true tokens / step "
        "| predicted counted | if only the last step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['config']} | {r['output_len']} | {r['concurrency']} | {r['counted']:.2f} | "
                     f"{r['outputs_per_request']:.1f} | {r['counted_share_of_steps']:.0%} | "
                     f"{r['true_tokens_per_step']:.2f} | {r['predicted_counted']:.2f} | {r['if_only_last_step']:.2f} |")
    if limits:
        gaps = [r["if_only_last_step"] - r["counted_high"] for r in limits]
        lines += ["", "## One prompt set at every concurrency (no counter deltas recorded)", "",
                  f"{', '.join(f'`{x}`' for x in limit_sources or [])}: the lowest concurrency's counted figure taken "
                  "as the truth, the highest's against the limit where the counters see only each request's last "
                  f"step: the limit lies {min(gaps):+.2f} to {max(gaps):+.2f} from the measured figure.", "",
                  "| engine | output | T | counted at low c | counted at high c | if only the last step |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['engine']} | {r['output_len']} | {r['temperature']:g} | {r['counted_low']:.2f} (c{r['low_concurrency']}) "
                  f"| {r['counted_high']:.2f} (c{r['high_concurrency']}) | {r['if_only_last_step']:.2f} |" for r in limits]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--measurement", type=Path, default=MEASUREMENT, help="measure_mtp.py JSON with spec_counters")
    ap.add_argument("--same-prompts", type=Path, nargs="*", default=SAME_PROMPTS,
                    help="measure_turbomind.py JSONs of one prompt set at several concurrencies (no counter deltas)")
    ap.add_argument("--out-prefix", type=Path, default=OUT_PREFIX, help="writes PREFIX.json and PREFIX.md")
    args = ap.parse_args(argv)
    rows = check(json.loads(args.measurement.read_text()))
    source, limit_sources = _rel(args.measurement), [_rel(p) for p in args.same_prompts]
    limits = last_step_limit([json.loads(p.read_text()) for p in args.same_prompts])
    command = "python benchmarks/accept_counting_check.py" + (" " + " ".join(argv or sys.argv[1:])).rstrip()
    args.out_prefix.with_suffix(".json").write_text(json.dumps(
        {"measurement": source, "rows": rows, "same_prompts": limit_sources, "last_step_limit": limits}, indent=1) + "\n")
    md = render_md(rows, command.strip(), source, limits, limit_sources)
    args.out_prefix.with_suffix(".md").write_text(md)
    print(md.split("\n\n")[3])
    print(f"wrote {args.out_prefix}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
