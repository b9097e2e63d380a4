"""The MTP landscape on the MoE testbed, apart from measuring it: which engines and cells a run plans and
how they are keyed, the checkpoint builder's accept-length prediction as LMDeploy's counters would count
it, and the markdown report of a landscape file.

Why in the package: ``benchmarks/gpu/measure_landscape.py`` measures, and these pure parts are what its
tests and the analyses that read a landscape (``docs/analyses/sim_fit``, ``landscape_table_payoff``) share;
a test imports them from here, never from a benchmark script.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PRESET", "WARMUP", "accept_agreement", "cell_key", "cells_of", "cells_to_redo", "engines_planned",
           "planned_keys", "predicted_as_counted", "prediction_start_tokens", "render"]

PRESET = "qwen3.5-moe-35b-a3b-12l"
"""The ``tuning.checkpoint.build`` preset the testbed is built from."""

WARMUP = "full-length wave per temperature + short run per concurrency"
"""The warm-up a cell was measured after (kept in each cell; cells without it came before it existed)."""


def engines_planned(a: Any) -> list[dict[str, Any]]:
    """The engines in the order they run: MTP off on the first agreement level's checkpoint, then
    every agreement level's 1..4 draft tokens (one checkpoint at a time). ``a``: the run's flags
    (``agreements``, ``draft_tokens``; :func:`cells_of` reads ``output_len``, ``temperatures``, ``concurrency``)."""
    plan = [{"name": "mtp-off", "agreement": a.agreements[0], "draft_tokens": 0}]
    plan += [{"name": f"a{ag:g}-mtp{n}", "agreement": ag, "draft_tokens": n} for ag in a.agreements for n in a.draft_tokens]
    return plan


def cells_of(a: Any) -> list[tuple[int, float, int]]:
    """(output length, temperature, concurrency) in the order an engine measures them."""
    return [(o, t, c) for o in a.output_len for t in a.temperatures for c in a.concurrency]


def cell_key(engine: str, o: int, t: float, c: int) -> str:
    return f"{engine}|out{o}|T{t:g}|c{c}"


def planned_keys(a: Any) -> set[str]:
    """The keys of every cell this run's flags plan (the file may hold other runs' cells too)."""
    return {cell_key(e["name"], *c) for e in engines_planned(a) for c in cells_of(a)}


def cells_to_redo(cells: dict[str, Any], prefixes: list[str]) -> list[str]:
    """Keys of the cells ``--redo`` measures again: those starting with a prefix that were measured under an
    older warm-up (so a run cut short and started again with the same flags does not redo its own cells)."""
    return [k for k, x in cells.items() if any(k.startswith(p) for p in prefixes) and x.get("warmup") != WARMUP]


def prediction_start_tokens(ckpt: Path | None) -> int | None:
    """How many start tokens the checkpoint's prediction averaged over (``acceptance.json``'s ``start_tokens``;
    None where the build did not record it: those averaged over 256 random ones)."""
    if ckpt is None:
        return None
    from tuning.checkpoint.build import ACCEPTANCE_FILE

    try:
        return json.loads((ckpt / ACCEPTANCE_FILE).read_text()).get("start_tokens")
    except (OSError, ValueError):
        return None


def predicted_as_counted(cell: dict[str, Any]) -> float | None:
    """The builder's accept length as LMDeploy's counters would report it for this cell: they see only some of
    a request's decode steps under load, always its last (length-biased), so the measured figure reads above
    the engine's tokens per step; ``None`` without a prediction or the counters' deltas."""
    from tuning.bench.counters import chain_counted_accept_length, outputs_per_request

    pred, n = cell.get("predicted_accept_length"), cell.get("draft_tokens")
    outputs = outputs_per_request(cell.get("spec_counters") or {}, cell.get("completed") or 0)
    if not pred or not n or outputs is None:
        return None
    return chain_counted_accept_length(min(max(pred, 1.0), n + 1.0), n, max(outputs, 1.0))


def accept_agreement(cells: list[dict[str, Any]], tolerance: float = 0.15) -> str | None:
    """One line: how many measured accept lengths lie within ``tolerance`` of the builder's prediction, taken
    as it is and as counted (issue #22 item 1's bar, over the whole landscape)."""
    both = [(x["accept_length"], x["predicted_accept_length"], predicted_as_counted(x)) for x in cells
            if x.get("accept_length") and x.get("predicted_accept_length")]
    counted = [(m, c) for m, _, c in both if c is not None]
    if not both:
        return None
    raw_ok = sum(abs(m - p) <= tolerance for m, p, _ in both)
    line = (f"Accept length within ±{tolerance:g} of the builder's prediction: {raw_ok} of {len(both)} cells as "
            f"predicted (worst {max(abs(m - p) for m, p, _ in both):.2f})")
    if counted:
        line += (f", {sum(abs(m - c) <= tolerance for m, c in counted)} of {len(counted)} as LMDeploy's counters "
                 f"would count the prediction (worst {max(abs(m - c) for m, c in counted):.2f})")
    return line + "."


def render(state: dict[str, Any]) -> str:
    cells = list(state["cells"].values())
    lines = [f"# MTP landscape on the MoE testbed ({state['preset']}){' (SIMULATED)' if state['simulated'] else ''}", "",
             "Commands: " + "; ".join(f"`{c}`" for c in state["commands"]) + "  ",
             f"Host: {state['host']}  ", f"Sharpness {state['sharpness']:g}; input {state['input_len']} tokens; "
             f"{state['waves']} waves per cell (at least 4 requests); engine starts (s): {state['starts_s']}.",
             "",
             "Each cell is one closed-loop run (no rounds, no interval): a ratio to MTP off compares two runs. "
             "Accept lengths are LMDeploy's counted figures; the builder's prediction is the engine's tokens per "
             "step, and → gives it as the counters would count it (they see few of a request's steps under load, "
             "always its last).", ""]
    if (line := accept_agreement(cells)) is not None:
        lines += [line, ""]
    off = {(x["output_len"], x["temperature"], x["concurrency"]): x for x in cells if x["draft_tokens"] == 0}
    agreements = sorted({x["agreement"] for x in cells if x["agreement"] is not None})
    drafts = sorted({x["draft_tokens"] for x in cells if x["draft_tokens"]})
    for ag in agreements:
        for o in sorted({x["output_len"] for x in cells}):
            for t in sorted({x["temperature"] for x in cells}):
                rows = [x for x in cells if x["agreement"] == ag and x["output_len"] == o and x["temperature"] == t]
                if not rows:
                    continue
                lines += [f"## agreement {ag:g}, output {o}, T {t:g}", "",
                          "| concurrency | MTP off tok/s | " + " | ".join(f"MTP-{n}: x off (accept / predicted → as counted)" for n in drafts)
                          + " |", "|---|---|" + "---|" * len(drafts)]
                for c in sorted({x["concurrency"] for x in rows}):
                    base = off.get((o, t, c))
                    cols = []
                    for n in drafts:
                        x = next((r for r in rows if r["draft_tokens"] == n and r["concurrency"] == c), None)
                        if x is None:
                            cols.append("—")
                            continue
                        ratio = x["output_throughput"] / base["output_throughput"] if base and base["output_throughput"] else None
                        acc = f"{x['accept_length']:.2f}" if x.get("accept_length") else "—"
                        pred = f"{x['predicted_accept_length']:.2f}" if x.get("predicted_accept_length") else "—"
                        if (counted := predicted_as_counted(x)) is not None:
                            pred += f" → {counted:.2f}"
                        cols.append(f"{ratio:.2f}x ({acc} / {pred})" if ratio else f"{x['output_throughput']:,.0f} ({acc} / {pred})")
                    lines.append(f"| {c} | {base['output_throughput']:,.0f} |" if base else f"| {c} | — |")
                    lines[-1] += " " + " | ".join(cols) + " |"
                lines.append("")
    failed = [x for x in cells if x.get("failed")]
    if failed:
        lines.append(f"Cells with failed requests: {[(x['engine'], x['output_len'], x['temperature'], x['concurrency'], x['failed'], x.get('failure_reasons')) for x in failed]}")
    if state.get("failures"):
        lines.append(f"Engines that failed: {state['failures']}")
    redone = sorted(k for k in state.get("superseded", {}) if state["cells"].get(k, {}).get("warmup") == WARMUP)
    if redone:  # a cell moved aside whose engine then failed is not re-measured yet: not listed
        lines.append(f"Measured again after the per-concurrency warm-up (earlier figures kept under 'superseded'): "
                     f"{', '.join(redone)}")
    return "\n".join(lines) + "\n"
