"""Would a routing table pay on the MoE testbed? A prediction from the measured landscape (issue #18
item 6, desk part): no engine runs here, every figure comes from ``measure_landscape.py``'s cells.

Why: the project has never shown a table beating the best single config. The testbed's landscape says
the best config moves with temperature (MTP-3 well above MTP off greedy at agreement 0.9, every MTP
config below it sampled), which is what a table needs; this says how much that would be worth on a
mix of traffic before any GPU time is spent serving one.

For each agreement level and each concurrency the parts of the traffic are (output length bucket,
sampling band: ``greedy`` = T 0, ``sampled`` = T 0.8) and each config's rate on a part is its measured
output tok/s there at that concurrency (MTP off's cells are shared by every level). For each mix (the
share of the output tokens on each part) it gives:

- the best single config and its rate on the mix (one engine, every part);
- the best table with the engines' time split at will (:func:`tuning.choose.cap.pooled_rate`: every part on
  its fastest config; what one GPU shared by co-resident engines approximates), over the best single;
- the best table on 2 whole replicas (:func:`tuning.choose.cap.best_routing` with ``replicas=2``) over the best
  single config on both.

Each cell is ONE run, so each ratio carries the noise of a handful of single runs. One run's noise is
estimated from the landscape's own repeats (cells measured again, the older figure under
``superseded``; only the prefixes ``--noise-pairs`` names: the defaults' reason is in its help), pooled
as :class:`tuning.stats.PooledNoise`. Each prediction then gets (a) whether it exceeds the 95 % band of a
ratio of two single-run figures, (b) a parametric-bootstrap band: every cell's rate times exp(N(0, s^2))
with s drawn per replicate from its chi-square spread (``--draws`` replicates), the whole choice redone
on each, the 2.5-97.5 % percentiles of the ratio; (c) a p-value against "no table pays": the same
perturbation of rates refitted without any config x part interaction (log rate = config effect + part
effect, where the best single config is best on every part), as often as the table's ratio there reaches
the observed one. A table's ratio is >= 1 by construction (the singles are tables too), so (c), not
(b)'s lower end, says whether a gain is more than noise picked by a max.

    python -m docs.analyses.landscape_table_payoff.landscape_table_payoff                                  # the a0.9 landscape, default mixes
    python -m docs.analyses.landscape_table_payoff.landscape_table_payoff --mix my_mixes.yaml --name my_run
    python -m docs.analyses.landscape_table_payoff.landscape_table_payoff --render docs/analyses/landscape_table_payoff/landscape_table_payoff_2026-12-04.json

``--mix`` file (YAML or JSON): mix name -> part -> share of output tokens, parts as ``out512/greedy``;
shares >= 0 summing to 1, parts left out get 0. Results: ``benchmarks/results/<name>.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from orchestrator.fsutil import utc_now_iso
from orchestrator.hostinfo import cpu_model, git_commit
from tuning.choose.cap import best_routing, pooled_rate
from tuning.choose.replicas import mix_rate, work_per_config
from tuning.simfit import WARM_REPEAT_PREFIXES, RepeatPair, repeat_noise, repeat_pairs
from tuning.stats import PooledNoise, sd_interval, t_quantile

ROOT = Path(__file__).resolve().parents[3]

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_LANDSCAPE = RESULTS / "gpu_landscape_h200_2026-12-04_a0.5" / "landscape.json"
DEFAULT_NOISE_PAIRS = WARM_REPEAT_PREFIXES
DEFAULT_GREEDY_SHARES = (0.25, 0.5, 0.75)
BANDS = {0.0: "greedy", 0.8: "sampled"}
"""Temperature -> sampling band; a landscape with other temperatures is refused, not guessed at."""
REPLICAS = 2
LEVEL = 0.95

Part = tuple[str, str]
Rates = dict[tuple[str, str, str], float]


# ----------------------------------------------------------------------------------------------- landscape

def part_of(cell: Mapping[str, Any]) -> Part:
    """(bucket, band) of a landscape cell: ``out512``, ``greedy``."""
    t = float(cell["temperature"])
    if t not in BANDS:
        raise ValueError(f"temperature {t} has no sampling band (known: {sorted(BANDS)})")
    return f"out{int(cell['output_len'])}", BANDS[t]


def agreement_levels(cells: Mapping[str, Mapping[str, Any]]) -> list[float]:
    return sorted({c["agreement"] for c in cells.values() if c.get("agreement") is not None})


def concurrencies(cells: Mapping[str, Mapping[str, Any]]) -> list[int]:
    return sorted({int(c["concurrency"]) for c in cells.values()})


def rates_at(cells: Mapping[str, Mapping[str, Any]], agreement: float, concurrency: int,
             field: str = "output_throughput") -> Rates:
    """(engine, bucket, band) -> the cell's ``field`` (output tok/s by default) at ``concurrency`` for MTP
    off (no agreement: its cells are every level's) and the engines built at ``agreement``; cells that
    failed requests or made no tokens are left out."""
    out: Rates = {}
    for c in cells.values():
        if int(c["concurrency"]) != concurrency or c.get("agreement") not in (None, agreement):
            continue
        if c.get("output_throughput", 0) > 0 and not c.get("failed"):
            out[(c["engine"], *part_of(c))] = float(c[field])
    return out


def engine_labels(cells: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {c["engine"]: (f"MTP-{c['draft_tokens']}" if c.get("draft_tokens") else "MTP off") for c in cells.values()}


# ----------------------------------------------------------------------------------------------- mixes

def part_name(part: Part) -> str:
    return f"{part[0]}/{part[1]}"


def default_mixes(buckets: Sequence[str], greedy_shares: Sequence[float] = DEFAULT_GREEDY_SHARES) -> dict[str, dict[Part, float]]:
    """Greedy share ``g`` of the output tokens, the rest sampled; within each band the buckets in equal
    token shares."""
    n = len(buckets)
    return {f"greedy {g:g}": {(b, band): (g if band == "greedy" else 1 - g) / n for b in buckets for band in ("greedy", "sampled")}
            for g in greedy_shares}


def parse_mixes(data: Any, parts: Sequence[Part]) -> dict[str, dict[Part, float]]:
    """``{mix name: {"out512/greedy": share, ...}}`` checked against the landscape's ``parts``. Raises
    ``ValueError`` saying what is wrong: not a mapping, an unknown part, a share that is not a number
    >= 0, shares not summing to 1 (within 1e-6)."""
    known = {part_name(p): p for p in parts}
    if not isinstance(data, Mapping) or not data:
        raise ValueError("a mix file is a mapping of mix name -> {part: share}, e.g. "
                         "{\"half\": {\"out512/greedy\": 0.5, \"out512/sampled\": 0.5}}")
    mixes = {}
    for name, shares in data.items():
        if not isinstance(shares, Mapping) or not shares:
            raise ValueError(f"mix {name!r}: expected a mapping of part -> share, got {shares!r}")
        unknown = sorted(str(p) for p in shares if p not in known)
        if unknown:
            raise ValueError(f"mix {name!r}: unknown part(s) {unknown}; the landscape's parts: {sorted(known)}")
        bad = {p: s for p, s in shares.items() if isinstance(s, bool) or not isinstance(s, (int, float))
               or not math.isfinite(s) or s < 0}
        if bad:
            raise ValueError(f"mix {name!r}: shares must be numbers >= 0, got {bad}")
        total = sum(shares.values())
        if abs(total - 1) > 1e-6:
            raise ValueError(f"mix {name!r}: shares of output tokens sum to {total:g}, not 1")
        mixes[str(name)] = {known[p]: float(s) for p, s in shares.items() if s > 0}
    return mixes


def load_mixes(path: Path, parts: Sequence[Part]) -> dict[str, dict[Part, float]]:
    try:
        data = yaml.safe_load(path.read_text())  # JSON is YAML
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"--mix {path}: cannot read it ({e})") from e
    try:
        return parse_mixes(data, parts)
    except ValueError as e:
        raise ValueError(f"--mix {path}: {e}") from e


# ----------------------------------------------------------------------------------------------- noise

def noise_of(pairs: Sequence[RepeatPair]) -> PooledNoise:
    """One run's log sd from repeat pairs (:func:`tuning.simfit.repeat_noise`); refuses to go on without one."""
    noise = repeat_noise(pairs)
    if noise is None:
        raise ValueError("no repeat pair to estimate one run's noise from (see --noise-pairs)")
    return noise


def single_ratio_band(noise: PooledNoise, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` band of a ratio of two single-run figures of the same thing."""
    _, low, high = noise.ratio_interval([1.0], [1.0], level)
    return low, high


# ----------------------------------------------------------------------------------------------- payoff

def single_rates(rates: Mapping[tuple[str, str, str], float], shares: Mapping[Part, float]) -> dict[str, float]:
    """Each config measured on every part of the mix -> its rate on the mix on one replica."""
    out = {}
    for key in sorted({k for k, *_ in rates}):
        work = work_per_config({p: key for p in shares}, shares, rates)
        if work is not None:
            out[key] = mix_rate(work, {key: 1})
    return out


@dataclass(frozen=True)
class Payoff:
    single: str
    single_rate: float
    pooled_rate: float
    fastest: Mapping[Part, str]
    whole_routes: Mapping[Part, str]
    whole_replicas: Mapping[str, int]
    whole_rate: float

    @property
    def pooled_ratio(self) -> float:
        return self.pooled_rate / self.single_rate

    @property
    def whole_ratio(self) -> float:
        return self.whole_rate / (REPLICAS * self.single_rate)


def payoff(rates: Mapping[tuple[str, str, str], float], shares: Mapping[Part, float]) -> Payoff:
    """Best single config, the table with time split at will, and the table on :data:`REPLICAS` whole
    replicas, for one mix. Raises ``ValueError`` when no config was measured on every part."""
    singles = single_rates(rates, shares)
    if not singles:
        raise ValueError("no config was measured on every part of the mix")
    single = max(singles, key=lambda k: (singles[k], k))
    fastest = {p: max((k for k, *q in rates if tuple(q) == p), key=lambda k: (rates[(k, *p)], k)) for p in shares}
    plan = best_routing(rates, shares, replicas=REPLICAS)
    return Payoff(single=single, single_rate=singles[single], pooled_rate=pooled_rate(rates, shares, 1),
                  fastest=fastest, whole_routes=dict(plan.routes), whole_replicas=dict(plan.replicas), whole_rate=plan.rate)


def without_interaction(rates: Mapping[tuple[str, str, str], float]) -> Rates:
    """``rates`` refitted as log rate = config effect + part effect (row and column means of the logs on
    the full grid): each config's advantage is the same on every part, so the best single config is the
    fastest everywhere and no table beats it. Raises ``ValueError`` on an incomplete grid."""
    keys = sorted({k for k, *_ in rates})
    parts = sorted({(b, band) for _, b, band in rates})
    if len(rates) != len(keys) * len(parts):
        raise ValueError("the no-interaction fit needs every config measured on every part")
    logs = np.array([[math.log(rates[(k, *p)]) for p in parts] for k in keys])
    fit = logs.mean(axis=1, keepdims=True) + logs.mean(axis=0, keepdims=True) - logs.mean()
    return {(k, *p): float(math.exp(fit[i, j])) for i, k in enumerate(keys) for j, p in enumerate(parts)}


def perturbed(rates: Mapping[tuple[str, str, str], float], noise: PooledNoise, rng: np.random.Generator) -> Rates:
    """Every rate times exp(N(0, s^2)), with s one draw of the run noise given its degrees of freedom
    (s_hat * sqrt(df / chi2(df)): five pairs leave s itself uncertain by a factor of ~2)."""
    s = noise.sd * math.sqrt(noise.df / rng.chisquare(noise.df))
    keys = list(rates)
    z = rng.standard_normal(len(keys))
    return {k: rates[k] * math.exp(s * zi) for k, zi in zip(keys, z)}


def bands(rates: Mapping[tuple[str, str, str], float], mixes: Mapping[str, Mapping[Part, float]],
          observed: Mapping[str, Payoff], noise: PooledNoise, draws: int, rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    """Per mix and ratio kind (``pooled``, ``whole``): the bootstrap band of the ratio and the p-value of
    the observed ratio under no interaction (see the module doc). The same draws serve every mix."""
    null = without_interaction(rates)
    boot: dict[str, dict[str, list[float]]] = {m: {"pooled": [], "whole": []} for m in mixes}
    tail: dict[str, dict[str, int]] = {m: {"pooled": 0, "whole": 0} for m in mixes}
    for _ in range(draws):
        r_boot, r_null = perturbed(rates, noise, rng), perturbed(null, noise, rng)
        for m, shares in mixes.items():
            b, n = payoff(r_boot, shares), payoff(r_null, shares)
            boot[m]["pooled"].append(b.pooled_ratio)
            boot[m]["whole"].append(b.whole_ratio)
            tail[m]["pooled"] += n.pooled_ratio >= observed[m].pooled_ratio * (1 - 1e-12)
            tail[m]["whole"] += n.whole_ratio >= observed[m].whole_ratio * (1 - 1e-12)
    q = [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2]
    return {m: {kind: {"band": [float(x) for x in np.percentile(boot[m][kind], q)],
                       "p_no_interaction": (1 + tail[m][kind]) / (1 + draws)} for kind in ("pooled", "whole")}
            for m in mixes}


def drivers(rates: Mapping[tuple[str, str, str], float], shares: Mapping[Part, float], single: str,
            routes: Mapping[Part, str], durations: Mapping[tuple[str, str, str], float] | None = None) -> list[dict[str, Any]]:
    """The parts a table sends away from the best single config: the cells whose gap makes the gain, with
    how long each of the two runs lasted (short runs move more than the repeat pairs did)."""
    out = []
    for p, key in sorted(routes.items()):
        if key != single:
            d = {"part": part_name(p), "share": shares[p], "config": key, "rate": rates[(key, *p)],
                 "single_rate": rates[(single, *p)], "gain": rates[(key, *p)] / rates[(single, *p)]}
            if durations:
                d["run_s"] = [durations.get((key, *p)), durations.get((single, *p))]
            out.append(d)
    return out


# ----------------------------------------------------------------------------------------------- analysis

def analyse(landscape: Mapping[str, Any], mixes: Mapping[str, Mapping[Part, float]], noise: PooledNoise, *,
            draws: int, seed: int) -> list[dict[str, Any]]:
    """One row per (agreement level, concurrency, mix)."""
    cells = landscape["cells"]
    band_high = single_ratio_band(noise)[1]
    rng = np.random.default_rng(seed)
    rows = []
    for level in agreement_levels(cells):
        for c in concurrencies(cells):
            rates, durations = rates_at(cells, level, c), rates_at(cells, level, c, "duration_s")
            observed = {m: payoff(rates, shares) for m, shares in mixes.items()}
            spread = bands(rates, mixes, observed, noise, draws, rng) if draws else {}
            for m, pay in observed.items():
                kinds = {"pooled": (pay.pooled_rate, pay.pooled_ratio, pay.fastest),
                         "whole": (pay.whole_rate, pay.whole_ratio, pay.whole_routes)}
                row: dict[str, Any] = {"agreement": level, "concurrency": c, "mix": m,
                                       "single": {"config": pay.single, "rate": pay.single_rate}}
                for kind, (rate, ratio, routes) in kinds.items():
                    row[kind] = {"rate": rate, "ratio": ratio, "routes": {part_name(p): k for p, k in sorted(routes.items())},
                                 "exceeds_single_run_band": ratio > band_high,
                                 "drivers": drivers(rates, mixes[m], pay.single, routes, durations), **spread.get(m, {}).get(kind, {})}
                row["whole"]["replicas"] = dict(pay.whole_replicas)
                rows.append(row)
    return rows


def provenance(landscape_path: Path, landscape: Mapping[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    commit, cpu = git_commit(ROOT), cpu_model() or platform.processor()
    try:
        shown = str(landscape_path.resolve().relative_to(ROOT))
    except ValueError:
        shown = str(landscape_path)
    return {"command": "python -m docs.analyses.landscape_table_payoff.landscape_table_payoff " + " ".join(argv),
            "created_at": utc_now_iso(), "git_commit": commit,
            "landscape": shown, "landscape_sha256": hashlib.sha256(landscape_path.read_bytes()).hexdigest(),
            "landscape_host": landscape.get("host"), "landscape_commands": landscape.get("commands"),
            "python": platform.python_version(), "numpy": np.__version__, "cpu": cpu,
            "what": "a prediction from single GPU runs (one closed-loop run per cell), not a served measurement"}


# ----------------------------------------------------------------------------------------------- report

def _band(x: Mapping[str, Any]) -> str:
    if "band" not in x:
        return f"{x['ratio']:.3f}x"
    lo, hi = x["band"]
    mark = " **beyond noise**" if x["p_no_interaction"] < 1 - LEVEL else ""
    return f"{x['ratio']:.3f}x [{lo:.2f}-{hi:.2f}] p {x['p_no_interaction']:.3f}{'†' if x['exceeds_single_run_band'] else ''}{mark}"


def render(result: Mapping[str, Any]) -> str:
    prov, noise, rows = result["provenance"], result["noise"], result["rows"]
    labels = result["labels"]
    lines = [
        "# Would a routing table pay on the MoE testbed? A prediction from the measured landscape",
        "",
        "**A prediction from single GPU runs, not a served measurement.** Every rate is one closed-loop run of "
        "`measure_landscape.py` (one engine alone on the GPU); the mix rates, routings and ratios are computed from "
        "them here, on a CPU.",
        "",
        f"- Command: `{prov['command']}`",
        f"- Landscape: `{prov['landscape']}` (sha256 {prov['landscape_sha256'][:16]}…), measured on "
        + ", ".join(f"{k} {v}" for k, v in (prov.get("landscape_host") or {}).items()),
        f"- Computed: {prov['created_at']}, commit {prov['git_commit']}, Python {prov['python']}, NumPy {prov['numpy']}, {prov['cpu']}; "
        f"{result['draws']} bootstrap draws, seed {result['seed']}",
        "",
        "## Summary",
        "",
        *summary_lines(result, cells=False),
        f"- One run's noise: log sd {noise['sd']:.3f} ({noise['df']} repeat pairs); a ratio of two single-run figures of "
        f"the same thing falls within {noise['single_ratio_band'][0]:.2f}-{noise['single_ratio_band'][1]:.2f}x (95 %).",
        "",
        "## What is measured and what is predicted",
        "",
        "Measured: each config's output tok/s on each part (output 128 / 512 tokens x greedy T 0 / sampled T 0.8) at "
        "each concurrency, one run each, input 512 tokens. Predicted, per mix (share of output tokens per part):",
        "",
        "- *single*: the best single config's rate on the mix on one engine, 1 / sum(share / rate);",
        "- *time split*: every part on its fastest config with the engines' time split at will (`tuning.choose.cap.pooled_rate`, "
        "what co-resident engines on one GPU approximate if each ran as fast as alone at that concurrency), over *single*;",
        f"- *{REPLICAS} replicas*: the best routing on {REPLICAS} whole replicas (`tuning.choose.cap.best_routing`), over the best single "
        f"config on {REPLICAS} replicas.",
        "",
        "Mixes: " + "; ".join(f"*{m}* = " + ", ".join(f"{p} {s:.3g}" for p, s in shares.items()) for m, shares in result["mixes"].items()),
        "",
        "## One run's noise",
        "",
        f"From the landscape's repeat pairs (`{'`, `'.join(noise['prefixes'])}`: measured again in a later lease, the "
        f"older figure under `superseded`): later / earlier = " + ", ".join(
            f"{math.exp(p['log_ratio']):.3f} ({p['key'].rsplit('|', 1)[-1]}, runs of {_secs(p['run_s'])})" for p in noise["used"])
        + f". One run's log sd **{noise['sd']:.3f}** ({noise['df']} df; each pair about its own mean, so a shift between the "
        f"two leases counts as noise); mean log ratio {noise['mean_log_ratio']:+.3f}. A ratio of two single-run figures of "
        f"the same thing falls within **{noise['single_ratio_band'][0]:.2f}-{noise['single_ratio_band'][1]:.2f}x** 95 % of the "
        f"time (t with {noise['df']} df x sqrt 2 x sd). With {noise['df']} pairs the sd itself is known only to within "
        f"{noise['sd_band'][0]:.3f}-{noise['sd_band'][1]:.3f} (95 %, chi-square).",
        "",
        "Not used: " + (", ".join(f"`{p['key']}` {math.exp(p['log_ratio']):.2f}" for p in noise["not_used"]) or "none") + ". "
        + noise["not_used_reason"],
        "",
        "## The predictions",
        "",
        "Each entry: ratio [95 % bootstrap band] p. *Band*: every cell perturbed by the run noise (sd drawn per replicate "
        "from its chi-square spread), the whole choice redone, 2.5-97.5 percentiles. *p*: how often the same perturbation of "
        "the rates refitted without config x part interaction (where no table can beat the best single) gives a ratio at "
        "least the observed one; **beyond noise** when p < 0.05. † marks a ratio above the single-run ratio band's upper "
        f"end ({noise['single_ratio_band'][1]:.2f}x). A ratio is >= 1 by construction, so the band's lower end says little.",
        "",
    ]
    for level in sorted({r["agreement"] for r in rows}):
        mine = [r for r in rows if r["agreement"] == level]
        lines += [f"### agreement {level:g}", "",
                  "| concurrency | mix | best single (tok/s) | time split: table / single | "
                  f"{REPLICAS} replicas: table / single | {REPLICAS}-replica table |",
                  "|---|---|---|---|---|---|"]
        for r in mine:
            routes = ", ".join(f"{p} {labels.get(k, k)}" for p, k in r["whole"]["routes"].items()) \
                if len(set(r["whole"]["routes"].values())) > 1 else f"one config ({labels.get(r['single']['config'])})"
            lines.append(f"| {r['concurrency']} | {r['mix']} | {labels.get(r['single']['config'], r['single']['config'])} "
                         f"({r['single']['rate']:,.0f}) | {_band(r['pooled'])} | {_band(r['whole'])} | {routes} |")
        lines.append("")
    lines += ["## Which cells drive the gains", ""]
    lines += summary_lines(result)
    n = len(rows)
    lines += ["", "## What this does not say", "",
              f"- The {n} predictions of each kind share cells (the {len(result['mixes'])} mixes at one agreement and "
              f"concurrency are computed from the same cells), and at p < 0.05 about {n * (1 - LEVEL):.1f} of {n} would pass by chance "
              "if no table paid anywhere: a few marks at one concurrency are weak evidence; the same cells behind them "
              "are what to measure again.",
              "- The run noise comes from MTP off, greedy, output 512 (runs of 4-20 s). Output-128 cells at low "
              "concurrency are runs of 1-2 s (the driver lines give each run's length); the project's noise study "
              "(`gpu_noise_h200_2026-11-30.md`) found short runs move more, so their bands are likely too narrow. "
              "MTP engines' sampled runs may move differently again.",
              "- Every engine's rate is taken at the concurrency it was measured at, whatever share of the traffic a "
              "table gives it (as `tuning.choose.replicas` does); an engine that gets a quarter of the traffic runs at a "
              "lower load, where it makes fewer tok/s. The time split assumes co-resident engines each run as fast "
              "as alone for their share of the time; on one GPU they contend for memory and kernels.",
              "- The agreement-0.7 MTP engines and MTP off's output-512 T 0.8 cells were measured in the first lease "
              "without the per-concurrency warm-up (every other cell after it); an engine's first pass over its "
              "concurrencies (output 128, T 0) can read slow, as MTP off's did.",
              "- Nothing here was served: a table's gain on the testbed is for `benchmarks/mixed_payoff.py`-style "
              "rounds beside the best single config to measure."]
    return "\n".join(lines) + "\n"


def summary_lines(result: Mapping[str, Any], *, cells: bool = True) -> list[str]:
    """The headline: how many predictions are beyond noise, the largest, and (``cells``) the cells behind
    each that is."""
    rows, labels = result["rows"], result["labels"]
    out = []
    for kind, name in (("pooled", "time split"), ("whole", f"{REPLICAS} replicas")):
        beyond = [r for r in rows if r[kind].get("p_no_interaction", 1.0) < 1 - LEVEL]
        above = [r for r in rows if r[kind]["exceeds_single_run_band"]]
        top = max(rows, key=lambda r: r[kind]["ratio"])
        where = sorted({(r["agreement"], r["concurrency"]) for r in beyond})
        out.append(f"- **{name}**: {len(beyond)} of {len(rows)} predictions beyond noise (p < 0.05)"
                   + (f", at {', '.join(f'a{a:g} c{c}' for a, c in where)}" if where else "")
                   + f"; {len(above)} above the single-run ratio band; largest {top[kind]['ratio']:.3f}x (agreement "
                   f"{top['agreement']:g}, concurrency {top['concurrency']}, {top['mix']}).")
        for r in beyond if cells else ():
            cells = "; ".join(f"{d['part']} on {labels.get(d['config'], d['config'])} {d['rate']:,.0f} vs "
                              f"{labels.get(r['single']['config'], r['single']['config'])} {d['single_rate']:,.0f} tok/s "
                              f"({d['gain']:.2f}x, share {d['share']:.3g}, runs of {_secs(d.get('run_s', []))})" for d in r[kind]["drivers"])
            out.append(f"  - a{r['agreement']:g} c{r['concurrency']} {r['mix']}: {r[kind]['ratio']:.3f}x from {cells}")
    return out


def next_command(result: Mapping[str, Any], out_md: Path) -> str:
    beyond = [r for r in result["rows"] if r["pooled"].get("p_no_interaction", 1.0) < 1 - LEVEL]
    if not beyond:
        return (f"next: no predicted gain is beyond one run's noise; read {out_md} and measure the cells of the largest "
                f"ratio again in rounds before serving any table")
    keys = sorted({f"a{r['agreement']:g} c{r['concurrency']} {d['part']}" for r in beyond for d in r["pooled"]["drivers"]})
    return (f"next: measure the driving cells again in rounds (each is one run), then serve the table beside the best "
            f"single on the testbed; driving cells: {', '.join(keys[:12])}{' …' if len(keys) > 12 else ''}")


# ----------------------------------------------------------------------------------------------- main

NOT_USED_REASON = (
    "These are MTP off's output-128 cells of the first lease, re-measured in a later one after the per-concurrency "
    "warm-up: the output-128 greedy cells were the first a fresh engine served (lease-1 log: engine ready, then out128 "
    "T0 c1..c256), the T 0.8 ones its second pass, both before that warm-up existed. They read up to half the "
    "re-measured figure (greedy c4, c256): a start-up cost paid once, not run-to-run noise. The `out512|T0` pairs' "
    "earlier runs came after the same engine had served two passes over every concurrency (warm by order), the later "
    "ones after the explicit warm-up.")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="landscape_table_payoff.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--landscape", type=Path, default=DEFAULT_LANDSCAPE, help="measure_landscape.py's landscape.json")
    p.add_argument("--mix", type=Path, default=None,
                   help="YAML/JSON: mix name -> {part: share of output tokens}, parts as out512/greedy; shares >= 0 summing "
                        "to 1 (default: greedy share 0.25 / 0.5 / 0.75, the buckets in equal shares within each band)")
    p.add_argument("--noise-pairs", action="append", default=None, metavar="PREFIX",
                   help="superseded cells (key prefix) whose repeat estimates one run's noise; repeatable (default: "
                        f"{DEFAULT_NOISE_PAIRS[0]!r}: the other superseded cells of the a0.9 landscape are a fresh engine's "
                        "slow first pass, a start-up cost, not noise)")
    p.add_argument("--draws", type=int, default=1000, help="bootstrap draws per (agreement, concurrency); 0: no bands")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="landscape_table_payoff_2026-12-04", help="results/<name>.json and .md")
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    p.add_argument("--render", type=Path, default=None, metavar="JSON", help="only write the markdown of a results JSON")
    a = p.parse_args(argv)

    if a.render:
        result = json.loads(a.render.read_text())
        md = a.render.with_suffix(".md")
        md.write_text(render(result))
        print(f"wrote {md}")
        return 0
    if a.draws < 0:
        p.error("--draws must be >= 0")
    landscape = json.loads(a.landscape.read_text())
    parts = sorted({part_of(c) for c in landscape["cells"].values()})
    try:
        mixes = load_mixes(a.mix, parts) if a.mix else default_mixes(sorted({b for b, _ in parts}, key=lambda b: int(b[3:])))
    except ValueError as e:
        p.error(str(e))
    prefixes = tuple(a.noise_pairs or DEFAULT_NOISE_PAIRS)
    used, other = repeat_pairs(landscape, prefixes)
    noise = noise_of(used)
    rows = analyse(landscape, mixes, noise, draws=a.draws, seed=a.seed)
    logs = [q.log_ratio for q in used]
    result = {
        "provenance": provenance(a.landscape, landscape, argv), "draws": a.draws, "seed": a.seed,
        "labels": engine_labels(landscape["cells"]),
        "mixes": {m: {part_name(p): s for p, s in sorted(shares.items())} for m, shares in mixes.items()},
        "noise": {"prefixes": list(prefixes), "sd": noise.sd, "df": noise.df, "mean_log_ratio": sum(logs) / len(logs),
                  "t_quantile": t_quantile(0.5 + LEVEL / 2, noise.df),
                  "sd_band": list(sd_interval(noise.sd, noise.df)),
                  "single_ratio_band": list(single_ratio_band(noise)),
                  "used": [_pair_json(q) for q in used], "not_used": [_pair_json(q) for q in other],
                  "not_used_reason": NOT_USED_REASON if other and prefixes == DEFAULT_NOISE_PAIRS else ""},
        "rows": rows,
    }
    a.out_dir.mkdir(parents=True, exist_ok=True)
    out_json, out_md = a.out_dir / f"{a.name}.json", a.out_dir / f"{a.name}.md"
    out_json.write_text(json.dumps(result, indent=1) + "\n")
    out_md.write_text(render(result))
    print(f"one run's log sd {noise.sd:.3f} ({noise.df} df); a ratio of two single runs: "
          f"{result['noise']['single_ratio_band'][0]:.2f}-{result['noise']['single_ratio_band'][1]:.2f}x (95 %)")
    print("\n".join(summary_lines(result)))
    print(f"wrote {out_json} and {out_md}")
    print(next_command(result, out_md))
    return 0


def _pair_json(q: RepeatPair) -> dict[str, Any]:
    return {"key": q.key, "earlier": q.earlier, "later": q.later, "log_ratio": q.log_ratio, "run_s": list(q.run_s)}


def _secs(run_s: Sequence[float | None]) -> str:
    return " / ".join("?" if x is None else f"{x:.1f}" for x in run_s) + " s"


if __name__ == "__main__":
    sys.exit(main())
