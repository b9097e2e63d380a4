"""Hold the published Intern-S2 simulator profile (``intern-s2-preview-8xh200``) against what the MoE testbed
taught (issue #22 item 4, second part). SIMULATED figures against the published table; no GPU is used.

The published profile was calibrated to one table (MTP-3 on/off, concurrency 64, input 1024 range 0.5, T 0,
outputs 1024/4096/8192/16000; its ``published`` section). The testbed (``docs/analyses/sim_fit/sim_fit_testbed.py``)
measured LMDeploy's PyTorch engine on one H200 across draft counts and loads, and its fitted profile
(``qwen35-moe-testbed-1xh200``) has a multi-millisecond host part per decode step hidden behind the GPU
(``host_overlap`` 1). This script:

(a) sets what an MTP-N step costs against a plain decode step in the published profile's model (N 1-4,
    concurrency 1/16/64/256, the published workload's context) beside the testbed's measured costs (read
    from its committed landscape) and the costs the published table itself implies;
(b) refits the published profile's fitted step constants against the published table (MTP on/off ratios
    and the two TPOTs at 16000: the squared log errors, as ``tuning.simfit`` fits) under the additive step
    (the control: same constants, no new structure) and under the host/GPU-overlap step (``host_overlap``
    fixed at the testbed's 1, the host constants started at the testbed's; and fitted in 0..1 from 0.5);
(c) reruns every candidate on the full 256-prompt workload and reports per-bucket ratio and accept-length
    errors, TPOT at 16000 off/on, and whether each passes the reproduction bar (±10 % / ±0.15).

Expert coverage (``routing_spread``, ``verify_route_novelty``) is held: the testbed's router is random by
construction, so it says nothing about a trained router's correlation. Acceptance is held: the step constants
do not move an accept length (each request's acceptance is drawn from its own seed).

    python -m docs.analyses.sim_fit.sim_fit_published                 # fit and check (~15 min on 2 cores), writes the results
    python -m docs.analyses.sim_fit.sim_fit_published --render R.json # re-derive what needs no simulation, re-write R.json and .md
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from docs.analyses.sim_fit import sim_fit_testbed as testbed
from orchestrator.fsutil import atomic_write_text, utc_now_iso
from orchestrator.hostinfo import (
    cpu_model,
    cpus_available,
    git_commit,
    package_versions,
)
from orchestrator.sim.model import (
    PROFILES_DIR,
    EngineParams,
    PerformanceModel,
    Profile,
    load_profile,
)
from orchestrator.sim.scheduler import SimSummary, simulate_workload
from tuning.simfit import ACCEPT_TOLERANCE, THROUGHPUT_TOLERANCE, coordinate_search

ROOT = Path(__file__).resolve().parents[3]

PROFILE_NAME = "intern-s2-preview-8xh200"
PROFILE_PATH = PROFILES_DIR / f"{PROFILE_NAME}.json"
OUT_PREFIX = Path(__file__).resolve().parent / "sim_fit_published_2026-12-02"

WORKLOAD = {"input_len": 1024, "range_ratio": 0.5, "concurrency": 64, "temperature": 0.0, "seed": 0}
"""The published benchmark's workload (as ``tests/unit/test_sim_model.py`` runs it), MTP-3 against MTP off."""
PUBLISHED_DRAFTS = 3
CHECK_PROMPTS = 256
"""Prompts of the final check: the published benchmark's and the reproduction test's."""
SEARCH_PROMPTS = 128
"""Prompts of each search evaluation (two waves at concurrency 64, half the cost); the check reruns 256."""

DRAFT_COUNTS = (1, 2, 3, 4)
CONCURRENCIES = (1, 16, 64, 256)

FITTED = ("eff_bandwidth", "eff_decode_flops", "decode_overhead_ms", "prefill_overhead_ms", "draft_overhead_ms",
          "mtp_verify_overhead_ms", "mtp_prefill_overhead_ms")
"""The published profile's step constants refitted, with the testbed fit's bounds (:data:`SEARCH_BOUNDS`).
Held: ``eff_prefill_flops`` (with one prompt-length range it moves prefill time as ``prefill_overhead_ms``
does), ``decode_overhead_per_seq_ms`` and ``prefill_overhead_per_token_us`` (0 in the profile: one load and
one prompt range cannot tell them from the fixed terms), expert coverage and acceptance (module docstring)."""
SEARCH_BOUNDS = {k: testbed.STEP_BOUNDS[k] for k in FITTED}
"""Bounds shared with the testbed fit (one copy: ``docs/analyses/sim_fit/sim_fit_testbed.py``)."""
TESTBED_HOST = ("decode_overhead_ms", "draft_overhead_ms", "mtp_verify_overhead_ms")
"""The host constants the overlap search starts from at the testbed profile's fitted values: what the testbed
measured of a step's host part (LMDeploy 0.18 on one H200), the published profile's assumption to hold."""

OVERLAP_CHOICE = (
    "host_overlap is fixed at the testbed's value for the main overlap candidate: the testbed chose the overlap "
    "structure on its FIT half (BIC) with host_overlap at 1, and LMDeploy's engine loop does prefetch the next "
    "forward while the GPU runs (docs/analyses/sim_fit/sim_fit_testbed.py); the published table (one load, a GPU-bound step at "
    "concurrency 64) cannot identify it beside seven other constants, since a host part hidden behind a larger GPU "
    "part shows in no figure. The free fit (0..1) is run beside it to show that.")
"""Why ``host_overlap`` is fixed rather than fitted in the main overlap candidate (quoted by the write-up)."""

TESTBED_STEP_COST_SOURCE = {"output_len": 512, "temperature": 0.0, "agreement": 0.7}
"""The testbed cells the landscape README's point 4 reads an MTP-N step's cost from (output 512, greedy,
every concurrency, agreement 0.7: the level whose MTP rarely pays, as the published table's MTP-3 accepts less
than agreement 0.9's): its ranges are recomputed here from ``landscape.json``, not typed."""


# ----- (a) what an MTP step costs -------------------------------------------------------------------------------

def mean_decode_context(input_len: int, output_len: int, range_ratio: float) -> float:
    """KV tokens a sequence holds on an average decode step of the random dataset: the mean prompt plus half
    the mean output (lengths uniform in ``[int(L * ratio), L]``). An approximation (steps weight long outputs
    more), stated as one."""
    def mean_len(length: int) -> float:
        return (max(int(length * range_ratio), 1) + length) / 2
    return mean_len(input_len) + mean_len(output_len) / 2


def step_cost_ratio(profile: Profile, params: EngineParams, num_draft_tokens: int, num_seqs: int,
                    context_per_seq: float) -> float:
    """One MTP-N decode step (draft passes and verification, overlap applied) over one plain decode step of the
    same sequences and context, in the model: what the testbed's 'accept / (MTP / MTP off)' measures."""
    context = int(num_seqs * context_per_seq)
    plain = PerformanceModel(profile, _with_drafts(params, 0)).decode_time(num_seqs, context)
    mtp = PerformanceModel(profile, _with_drafts(params, num_draft_tokens)).decode_time(num_seqs, context)
    return mtp / plain


def _with_drafts(params: EngineParams, n: int) -> EngineParams:
    return EngineParams(**{**params.__dict__, "num_draft_tokens": n})


def step_cost_table(profile: Profile, params: EngineParams, context_per_seq: float) -> dict[str, dict[str, float]]:
    """``{N: {c: ratio}}`` over :data:`DRAFT_COUNTS` x :data:`CONCURRENCIES`, rounded to 3 digits."""
    return {str(n): {str(c): round(step_cost_ratio(profile, params, n, c, context_per_seq), 3) for c in CONCURRENCIES}
            for n in DRAFT_COUNTS}


def testbed_step_costs(landscape: Mapping[str, Any], output_len: int, temperature: float,
                       agreement: float | None = None) -> dict[str, dict[str, float]]:
    """``{N: {c: cost}}``: an MTP-N step's cost in plain steps as the testbed measured it, the builder's predicted
    tokens per step over the throughput ratio to MTP off (same output, temperature, concurrency; one run each).
    ``agreement`` picks one level's MTP cells (MTP off's serve every level); without it a landscape of several
    levels is refused, since their costs would overwrite each other."""
    cells = [c for c in landscape["cells"].values() if not c.get("failed")
             and int(c["output_len"]) == output_len and float(c["temperature"]) == temperature
             and (not c["draft_tokens"] or agreement is None or c.get("agreement") == agreement)]
    levels = {c.get("agreement") for c in cells if c["draft_tokens"]}
    if len(levels) > 1:
        raise ValueError(f"the landscape holds agreement levels {sorted(levels)}: name one")
    off = {int(c["concurrency"]): float(c["output_throughput"]) for c in cells if not c["draft_tokens"]}
    out: dict[str, dict[str, float]] = {}
    for c in sorted(cells, key=lambda c: (c["draft_tokens"], c["concurrency"])):
        n, conc = int(c["draft_tokens"]), int(c["concurrency"])
        if n and conc in off and c.get("predicted_accept_length"):
            ratio = float(c["output_throughput"]) / off[conc]
            out.setdefault(str(n), {})[str(conc)] = round(float(c["predicted_accept_length"]) / ratio, 3)
    return out


def mtp_layer_share(profile: Profile) -> dict[str, float]:
    """The MTP layer's parameters over the target's, all and active: how dear a draft pass is next to a target
    forward before any overhead (the testbed's one MTP layer beside 12 target layers is dearer than a 60-layer
    target's)."""
    return {"total": round((profile.mtp_dense_params_b + profile.mtp_expert_params_b) / profile.total_params_b, 4),
            "active": round(profile.mtp_active_params_b / profile.active_params_b, 4)}


def cost_range(table: Mapping[str, Mapping[str, float]]) -> dict[str, list[float]]:
    """``{N: [least, most]}`` over the concurrencies of a step-cost table."""
    return {n: [min(row.values()), max(row.values())] for n, row in table.items()}


# ----- (b), (c) the published table ---------------------------------------------------------------------------

def published_table(profile: Profile) -> dict[str, Any]:
    """The profile's ``published`` section: buckets (output length -> off/on tok/s, accept) and TPOTs."""
    return profile.extra["published"]


def buckets(published: Mapping[str, Any]) -> list[int]:
    return sorted(int(b) for b in published if b.isdigit())


def simulate_table(profile: Profile, published: Mapping[str, Any], num_prompts: int) -> dict[str, Any]:
    """The published workload run by the simulator for every bucket, MTP off and MTP-3: per bucket off/on tok/s,
    accept length, median TPOT (ms) off/on."""
    out: dict[str, Any] = {}
    for o in buckets(published):
        off, on = (simulate_workload(profile, n, output_len=o, num_prompts=num_prompts, **WORKLOAD)
                   for n in (0, PUBLISHED_DRAFTS))
        out[str(o)] = _figures(off, on)
    return out


def _figures(off: SimSummary, on: SimSummary) -> dict[str, float]:
    return {"off": round(off.output_throughput, 1), "on": round(on.output_throughput, 1),
            "accept_length": round(on.accept_length, 4), "tpot_off_ms": round(off.tpot_ms_median, 3),
            "tpot_on_ms": round(on.tpot_ms_median, 3)}


def table_errors(sim: Mapping[str, Any], published: Mapping[str, Any]) -> dict[str, Any]:
    """Per bucket: simulated ratio over published minus 1, accept error, off-throughput error; the TPOT errors
    at the longest bucket (where the table gives TPOTs); whether the reproduction bar is passed."""
    rows = {}
    for b in map(str, buckets(published)):
        s, p = sim[b], published[b]
        rows[b] = {"ratio": round(s["on"] / s["off"], 4), "published_ratio": round(p["on"] / p["off"], 4),
                   "ratio_error": round((s["on"] / s["off"]) / (p["on"] / p["off"]) - 1, 4),
                   "accept_error": round(s["accept_length"] - p["accept_length"], 4),
                   "off_error": round(s["off"] / p["off"] - 1, 4), "on_error": round(s["on"] / p["on"] - 1, 4)}
    tpot_bucket = str(buckets(published)[-1])
    pub_tpot = published[f"tpot_ms_{tpot_bucket}"]
    tpot = {"bucket": tpot_bucket, "off_ms": sim[tpot_bucket]["tpot_off_ms"], "on_ms": sim[tpot_bucket]["tpot_on_ms"],
            "off_error": round(sim[tpot_bucket]["tpot_off_ms"] / pub_tpot["off"] - 1, 4),
            "on_error": round(sim[tpot_bucket]["tpot_on_ms"] / pub_tpot["on"] - 1, 4)}
    passes = all(abs(r["ratio_error"]) <= THROUGHPUT_TOLERANCE and abs(r["accept_error"]) <= ACCEPT_TOLERANCE
                 for r in rows.values())
    worst_tput = max(max(abs(r["off_error"]), abs(r["on_error"])) for r in rows.values())
    return {"buckets": rows, "tpot": tpot, "passes_bar": passes, "worst_abs_throughput_error": worst_tput,
            "tpot_within_10pct": abs(tpot["off_error"]) <= THROUGHPUT_TOLERANCE
            and abs(tpot["on_error"]) <= THROUGHPUT_TOLERANCE,
            "log_rms": round(log_rms(sim, published), 4)}


def log_errors(sim: Mapping[str, Any], published: Mapping[str, Any]) -> list[float]:
    """The fit's residuals: the log error of each bucket's on/off ratio and of the two TPOTs (the accept lengths
    do not depend on the step constants, so they are checked, not fitted)."""
    errs = [math.log((sim[b]["on"] / sim[b]["off"]) / (published[b]["on"] / published[b]["off"]))
            for b in map(str, buckets(published))]
    last = str(buckets(published)[-1])
    pub_tpot = published[f"tpot_ms_{last}"]
    return [*errs, math.log(sim[last]["tpot_off_ms"] / pub_tpot["off"]), math.log(sim[last]["tpot_on_ms"] / pub_tpot["on"])]


def log_rms(sim: Mapping[str, Any], published: Mapping[str, Any]) -> float:
    errs = log_errors(sim, published)
    return math.sqrt(sum(e * e for e in errs) / len(errs))


def decode_share(sim_bucket: Mapping[str, float], concurrency: int) -> dict[str, float]:
    """Output tok/s x median TPOT / concurrency, off and on: the share of the run in which every client decodes
    at the median TPOT. Where throughput and TPOT move together (the model's scheduler) it stays near 1."""
    return {side: round(sim_bucket[side] * sim_bucket[f"tpot_{side}_ms"] / 1e3 / concurrency, 3) for side in ("off", "on")}


def implied_step_costs(sim: Mapping[str, Any], published: Mapping[str, Any]) -> dict[str, float]:
    """What a figure implies an MTP-3 step costs in plain steps, per bucket: accept / (on / off) throughput
    (the testbed's measure), and at the TPOT bucket accept x TPOT on / TPOT off."""
    out = {b: round(sim[b]["accept_length"] / (sim[b]["on"] / sim[b]["off"]), 3) for b in map(str, buckets(published))}
    last = str(buckets(published)[-1])
    out[f"tpot_{last}"] = round(sim[last]["accept_length"] * sim[last]["tpot_on_ms"] / sim[last]["tpot_off_ms"], 3)
    return out


def published_as_sim(published: Mapping[str, Any]) -> dict[str, Any]:
    """The published table in :func:`simulate_table`'s shape (TPOTs only at the bucket that has them)."""
    out = {}
    for b in buckets(published):
        p = published[str(b)]
        tp = published.get(f"tpot_ms_{b}")
        out[str(b)] = {"off": p["off"], "on": p["on"], "accept_length": p["accept_length"],
                       **({"tpot_off_ms": tp["off"], "tpot_on_ms": tp["on"]} if tp else {})}
    return out


def fit_candidate(profile: Profile, published: Mapping[str, Any], bounds: Mapping[str, tuple[float, float]],
                  start: Mapping[str, float], *, num_prompts: int, max_evals: int, min_rel_step: float,
                  progress: Callable[[str], None]) -> tuple[dict[str, float], float, int]:
    """The constants in ``bounds`` minimising the squared log errors (:func:`log_errors`) of the simulated
    published workload at ``num_prompts``; returns them (4 significant digits, as a profile stores), the
    search's log-RMS and its evaluations."""
    evals, best_seen = [0], [math.inf]
    t0 = time.time()

    def objective(point: Mapping[str, float]) -> float:
        evals[0] += 1
        sim = simulate_table(profile.replace(**point), published, num_prompts)
        errs = log_errors(sim, published)
        value = sum(e * e for e in errs)
        best_seen[0] = min(best_seen[0], value)
        if evals[0] % 25 == 0:
            progress(f"    {evals[0]} evaluations, {time.time() - t0:.0f} s, best log-RMS so far "
                     f"{math.sqrt(best_seen[0] / len(errs)):.4f}")
        return value

    point, best = coordinate_search(objective, start, bounds, max_evals=max_evals, min_rel_step=min_rel_step)
    return {k: float(f"{v:.4g}") for k, v in point.items()}, math.sqrt(best / (len(buckets(published)) + 2)), evals[0]


def candidates_to_fit(profile: Profile, testbed_profile: Profile) -> dict[str, dict[str, Any]]:
    """The refits: name -> bounds, start, and the constants held apart from the profile's (why in the write-up)."""
    stored = {k: getattr(profile, k) for k in FITTED}
    testbed_overlap = testbed_profile.host_overlap
    return {
        "additive": {"bounds": SEARCH_BOUNDS, "start": stored, "held": {"host_overlap": 0.0},
                     "why": "the control: the same constants refitted under the profile's own additive step"},
        "overlap_testbed": {"bounds": SEARCH_BOUNDS, "held": {"host_overlap": testbed_overlap},
                            "start": {**stored, **{k: getattr(testbed_profile, k) for k in TESTBED_HOST}},
                            "why": f"host_overlap fixed at the testbed's {testbed_overlap:g}, the host constants "
                                   "started at the testbed's"},
        "overlap_free": {"bounds": {**SEARCH_BOUNDS, **testbed.OVERLAP_BOUNDS},
                         "start": {**stored, "host_overlap": testbed.OVERLAP_START}, "held": {},
                         "why": f"host_overlap fitted in 0..1 from {testbed.OVERLAP_START:g}, the other constants "
                                "from the profile's"},
    }


EFFICIENCIES = ("eff_bandwidth", "eff_decode_flops")
"""Shares of the GPU's peak: at 1 a refit has run out of physics."""


def decide(current: Mapping[str, Any], candidates: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Whether the evidence justifies changing the profile's step structure, from the full checks: an overlap
    candidate is proposed only if it passes the reproduction bar, is no worse than the stored profile on the
    fit's log-RMS, beats the additive control (the same freedom without the structure), and brings both TPOTs at
    16000 within ±10 % (the known misfit), and its absolute tok/s are off by no more than the stored profile's
    (the objective leaves them out, so a refit can move them; the table holds them too), and no efficiency at 1
    (the GPU's peak bandwidth or FLOP/s: a fit that needs it is asking the structure for something else). An
    additive refit alone changes constants, not an assumption, and no testbed figure calls for it; it is never
    proposed here."""
    additive = candidates.get("additive")
    reasons: dict[str, list[str]] = {}
    chosen = None
    for name, c in candidates.items():
        if name == "additive":
            continue
        why = []
        if not c["check"]["passes_bar"]:
            why.append("fails the reproduction bar")
        if c["check"]["log_rms"] > current["log_rms"]:
            why.append(f"log-RMS {c['check']['log_rms']:.4f} > stored {current['log_rms']:.4f}")
        if additive is not None and c["check"]["log_rms"] >= additive["check"]["log_rms"]:
            why.append(f"log-RMS {c['check']['log_rms']:.4f} not below the additive control's "
                       f"{additive['check']['log_rms']:.4f}")
        if c["check"]["worst_abs_throughput_error"] > current["worst_abs_throughput_error"]:
            why.append(f"absolute tok/s off by up to {c['check']['worst_abs_throughput_error']:.1%} (stored "
                       f"{current['worst_abs_throughput_error']:.1%})")
        at_peak = [k for k in EFFICIENCIES if c.get("constants", {}).get(k, 0.0) >= 1.0]
        if at_peak:
            why.append(f"{', '.join(at_peak)} at 1 (the GPU's peak: not a physical fit)")
        if not c["check"]["tpot_within_10pct"]:
            why.append("TPOT at 16000 not within ±10 % (off {off_error:+.1%}, on {on_error:+.1%})".format(**c["check"]["tpot"]))
        reasons[name] = why
        if not why and (chosen is None or c["check"]["log_rms"] < candidates[chosen]["check"]["log_rms"]):
            chosen = name
    return {"change_profile": chosen is not None, "proposed_candidate": chosen, "reasons_not": reasons}


# ----- I/O --------------------------------------------------------------------------------------------------------

def _git_commit() -> str | None:
    return git_commit(ROOT)


def step_cost_section(profile: Profile, testbed_profile: Profile, landscape: Mapping[str, Any],
                      published: Mapping[str, Any]) -> dict[str, Any]:
    """Part (a): the published model's MTP-N step costs per bucket context, the testbed's measured costs and
    its fitted model's at its own workload."""
    params = EngineParams(tp=profile.num_gpus)
    contexts = {str(o): mean_decode_context(WORKLOAD["input_len"], o, WORKLOAD["range_ratio"]) for o in buckets(published)}
    setup = testbed.setup_of([landscape])
    src = TESTBED_STEP_COST_SOURCE
    measured = testbed_step_costs(landscape, src["output_len"], src["temperature"], src["agreement"])
    tb_context = setup.input_len + src["output_len"] / 2
    return {
        "published_model": {b: {"context_per_seq": ctx, "ratios": step_cost_table(profile, params, ctx)}
                            for b, ctx in contexts.items()},
        "testbed_measured": measured, "testbed_measured_range": cost_range(measured),
        "testbed_source": {**src, "landscape": str(testbed.MEASUREMENT.relative_to(ROOT)),
                           "measure": "builder's predicted accept length / (MTP tok/s / MTP-off tok/s), one run each"},
        "testbed_model": {"profile": testbed.PROFILE_NAME, "context_per_seq": tb_context,
                          "ratios": step_cost_table(testbed_profile, setup.params(0), tb_context)},
    }


def candidate_step_costs(profile: Profile, costs: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """A refit's MTP-N step costs at each bucket's context, as part (a) gives the stored profile's."""
    return {b: step_cost_table(profile, EngineParams(tp=profile.num_gpus), v["context_per_seq"])
            for b, v in costs["published_model"].items()}


PARTS_CONCURRENCIES = (16, 64)
"""Where a candidate's step parts are shown: the published load and a thinned batch (the run's end)."""


def step_parts(profile: Profile, context_per_seq: float) -> dict[str, dict[str, list[float]]]:
    """``{N: {c: [GPU ms, host ms]}}`` of a decode step, MTP off and MTP-3, at :data:`PARTS_CONCURRENCIES`: where a
    step is host-bound under the overlap (the host part is the larger) it does not get cheaper as the batch thins."""
    out: dict[str, dict[str, list[float]]] = {}
    for n in (0, PUBLISHED_DRAFTS):
        model = PerformanceModel(profile, EngineParams(tp=profile.num_gpus, num_draft_tokens=n))
        out[str(n)] = {str(c): [round(x * 1e3, 3) for x in model.decode_parts(c, int(c * context_per_seq))]
                       for c in PARTS_CONCURRENCIES}
    return out


def derived(profile: Profile, sim: Mapping[str, Any], published: Mapping[str, Any],
            costs: Mapping[str, Any]) -> dict[str, Any]:
    """Every figure of a candidate (or the stored profile) that follows from its simulated table and its
    constants without simulating again: the check, implied step costs, decode share, the model's step costs
    and step parts."""
    last = str(buckets(published)[-1])
    return {"check": table_errors(sim, published), "implied_step_costs": implied_step_costs(sim, published),
            "decode_share": decode_share(sim[last], WORKLOAD["concurrency"]),
            "step_costs": candidate_step_costs(profile, costs),
            "step_parts_ms": step_parts(profile, costs["published_model"][last]["context_per_seq"])}


def mtp_layer_shares() -> dict[str, dict[str, float]]:
    return {PROFILE_NAME: mtp_layer_share(load_profile(str(PROFILE_PATH))),
            testbed.PROFILE_NAME: mtp_layer_share(load_profile(str(testbed.PROFILE)))}


def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    t0 = time.time()

    def say(message: str) -> None:
        print(message, flush=True)

    profile = load_profile(str(PROFILE_PATH))
    testbed_profile = load_profile(str(testbed.PROFILE))
    landscape = json.loads(testbed.MEASUREMENT.read_text())
    published = published_table(profile)
    say("(a) MTP-N step cost against a plain step: published model, testbed measured, testbed model ...")
    costs = step_cost_section(profile, testbed_profile, landscape, published)
    for n, (lo, hi) in costs["testbed_measured_range"].items():
        row = costs["published_model"]["1024"]["ratios"][n]
        say(f"  MTP-{n}: testbed measured {lo:.2f}-{hi:.2f}x; published model at 1024 context "
            + ", ".join(f"c{c} {v:.2f}x" for c, v in row.items()))
    say(f"(c) stored profile, {CHECK_PROMPTS} prompts ...")
    current_sim = simulate_table(profile, published, CHECK_PROMPTS)
    current = derived(profile, current_sim, published, costs)["check"]
    say(f"  log-RMS {current['log_rms']:.4f}, bar {'passed' if current['passes_bar'] else 'FAILED'}, TPOT 16000 "
        f"{current['tpot']['off_ms']:.2f} -> {current['tpot']['on_ms']:.2f} ms")
    candidates: dict[str, dict[str, Any]] = {}
    for name, spec in candidates_to_fit(profile, testbed_profile).items():
        if args.only and name not in args.only:
            continue
        say(f"(b) refit {name!r} ({spec['why']}): {len(spec['bounds'])} constants, {args.search_prompts} prompts "
            "per evaluation ...")
        base = profile.replace(**spec["held"])
        fitted, search_rms, evals = fit_candidate(base, published, spec["bounds"], spec["start"],
                                                  num_prompts=args.search_prompts, max_evals=args.max_evals,
                                                  min_rel_step=args.min_rel_step, progress=say)
        constants = {**spec["held"], **fitted}
        sim = simulate_table(profile.replace(**constants), published, CHECK_PROMPTS)
        candidates[name] = {"why": spec["why"], "start": spec["start"], "held": spec["held"],
                            "bounds": {k: list(v) for k, v in spec["bounds"].items()}, "constants": constants,
                            "search_log_rms": round(search_rms, 4), "evaluations": evals, "sim": sim,
                            **derived(profile.replace(**constants), sim, published, costs)}
        check = candidates[name]["check"]
        say(f"  {constants}\n  check at {CHECK_PROMPTS} prompts: log-RMS {check['log_rms']:.4f}, bar "
            f"{'passed' if check['passes_bar'] else 'FAILED'}, TPOT 16000 {check['tpot']['off_ms']:.2f} -> "
            f"{check['tpot']['on_ms']:.2f} ms ({evals} evaluations, {time.time() - t0:.0f} s so far)")
    decision = decide(current, candidates)
    last = str(buckets(published)[-1])
    proposed = None
    if decision["change_profile"]:
        c = candidates[decision["proposed_candidate"]]
        proposed = {"fitted": {k: v for k, v in c["constants"].items() if v != getattr(profile, k)}}
        if "decode_overhead_ms" in proposed["fitted"] and "turbomind" in profile.extra:
            ratio = profile.extra["turbomind"]["decode_overhead_ms"] / profile.decode_overhead_ms
            proposed["turbomind"] = {"decode_overhead_ms": float(f"{c['constants']['decode_overhead_ms'] * ratio:.4g}"),
                                     "note": "the stated TurboMind assumption kept: the same ratio to the PyTorch "
                                             "engine's fixed decode overhead"}
    return {
        "simulated": True,
        "command": " ".join(["python -m docs.analyses.sim_fit.sim_fit_published", *argv]),
        "date": utc_now_iso(), "git_commit": _git_commit(),
        "versions": {"python": platform.python_version(), **package_versions(["numpy"])},
        "hardware": {"cpu_model": cpu_model(), "cpus": cpus_available(),
                     "note": "CPU only; the simulator runs in simulated time"},
        "profile": str(PROFILE_PATH.relative_to(ROOT)), "testbed_profile": str(testbed.PROFILE.relative_to(ROOT)),
        "workload": {**WORKLOAD, "num_draft_tokens": PUBLISHED_DRAFTS, "check_prompts": CHECK_PROMPTS,
                     "search_prompts": args.search_prompts},
        "search": {"max_evals": args.max_evals, "min_rel_step": args.min_rel_step, "fitted": list(FITTED),
                   "overlap_choice": OVERLAP_CHOICE,
                   "objective": "sum of squared log errors: 4 on/off ratios + TPOT off + TPOT on at "
                                f"{last} (accept lengths do not depend on the step constants)"},
        "tolerances": {"ratio": THROUGHPUT_TOLERANCE, "accept_length": ACCEPT_TOLERANCE},
        "held": {"routing_spread": profile.routing_spread, "verify_route_novelty": profile.verify_route_novelty,
                 "why": "the testbed's router is random by construction (every routed token picks its experts "
                        "independently), so it cannot inform a trained router's correlated routing"},
        "published": published,
        "published_implied_step_costs": implied_step_costs(published_as_sim(published), published),
        "published_decode_share": decode_share(published_as_sim(published)[last], WORKLOAD["concurrency"]),
        "step_costs": costs, "mtp_layer_share": mtp_layer_shares(),
        "current": {"constants": {k: getattr(profile, k) for k in (*FITTED, "host_overlap")}, "sim": current_sim,
                    **derived(profile, current_sim, published, costs)},
        "candidates": candidates, "decision": decision, "proposed_profile_changes": proposed,
        "wall_s": round(time.time() - t0, 1),
    }


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _check_rows(r: Mapping[str, Any]) -> list[str]:
    """One row per (candidate, bucket) of the full check."""
    lines = ["| candidate | bucket | off tok/s (pub.) | on tok/s (pub.) | ratio vs published | error | accept (pub.) | "
             "error | bar |", "|---|---|---|---|---|---|---|---|---|"]
    pub = r["published"]
    for name, c in [("stored", r["current"]), *r["candidates"].items()]:
        for b, e in c["check"]["buckets"].items():
            s = c["sim"][b]
            ok = abs(e["ratio_error"]) <= r["tolerances"]["ratio"] and abs(e["accept_error"]) <= r["tolerances"]["accept_length"]
            lines.append(f"| {name} | {b} | {s['off']:,.0f} ({pub[b]['off']:,.0f}) | {s['on']:,.0f} ({pub[b]['on']:,.0f}) | "
                         f"{e['ratio']:.3f} vs {e['published_ratio']:.3f} | {_pct(e['ratio_error'])} | "
                         f"{s['accept_length']:.2f} ({pub[b]['accept_length']:.2f}) | {e['accept_error']:+.2f} | "
                         f"{'pass' if ok else '**fail**'} |")
    return lines


def _summary_rows(r: Mapping[str, Any]) -> list[str]:
    last = r["current"]["check"]["tpot"]["bucket"]
    pub_t = r["published"][f"tpot_ms_{last}"]
    lines = [f"| candidate | `host_overlap` | fit log-RMS (6 figures, {r['workload']['check_prompts']} prompts) | "
             f"worst ratio error | worst tok/s error | TPOT {last} off / on ms (published {pub_t['off']} / "
             f"{pub_t['on']}) | decode share off / on | MTP-3 step / plain step, c64, {last} context | "
             "bar ±10 % / ±0.15 |", "|---|---|---|---|---|---|---|---|---|"]
    for name, c in [("stored", r["current"]), *r["candidates"].items()]:
        ch = c["check"]
        worst = max(ch["buckets"].values(), key=lambda e: abs(e["ratio_error"]))["ratio_error"]
        step = c["step_costs"][last]["3"]["64"]
        lines.append(f"| {name} | {c['constants'].get('host_overlap', 0.0):g} | {ch['log_rms']:.4f} | {_pct(worst)} | "
                     f"{ch['worst_abs_throughput_error']:.1%} | "
                     f"{ch['tpot']['off_ms']:.2f} ({_pct(ch['tpot']['off_error'])}) / {ch['tpot']['on_ms']:.2f} "
                     f"({_pct(ch['tpot']['on_error'])}) | {c['decode_share']['off']:.2f} / {c['decode_share']['on']:.2f} | "
                     f"{step:.2f}x | {'pass' if ch['passes_bar'] else '**fail**'} |")
    return lines


DECODE_SHARE_GAP = 0.1
"""A candidate whose MTP-on decode share lies further than this above the published one cannot give the
published TPOT and throughput at once (the check's figures show which one it gives)."""


def _models(r: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {"stored": r["current"], **r["candidates"]}


def _host_bound_thinned(c: Mapping[str, Any]) -> bool:
    """Whether a model's MTP-3 step is host-bound at the thinned batch but not at the published load: under the
    overlap its step then stops getting cheaper as the batch thins, which costs the run (the end of a closed
    loop) more than its median TPOT."""
    gpu, host = c["step_parts_ms"][str(PUBLISHED_DRAFTS)][str(PARTS_CONCURRENCIES[0])]
    return c["constants"].get("host_overlap", 0.0) > 0 and host > gpu


def _step_ms(c: Mapping[str, Any], n: int, conc: int) -> float:
    """A model's decode step (ms) from its stored parts, combined as ``orchestrator.sim.model`` combines them."""
    gpu, host = c["step_parts_ms"][str(n)][str(conc)]
    return gpu + host - c["constants"].get("host_overlap", 0.0) * min(gpu, host)


def _decode_share_lines(r: Mapping[str, Any]) -> list[str]:
    last = r["current"]["check"]["tpot"]["bucket"]
    pub = r["published_decode_share"]
    models = _models(r)
    gap = all(c["decode_share"]["on"] - pub["on"] > DECODE_SHARE_GAP for c in models.values())
    line = (f"- **Decode share** (output tok/s x median TPOT / concurrency, at {last}): published off {pub['off']:.2f}, "
            f"on {pub['on']:.2f}; " + "; ".join(f"{n} {c['decode_share']['off']:.2f} / {c['decode_share']['on']:.2f}"
                                              for n, c in models.items()) + ". "
            f"In the published MTP-3 run about {1 - pub['on']:.0%} of the time is not spent with every client decoding "
            f"at the median TPOT (MTP off: {1 - pub['off']:.0%}). In the simulator's scheduler a prefill stalls every "
            "running sequence (it lengthens TPOT and the run alike) and a request waits about one iteration for its "
            "first token, so the share stays near 1 unless the run's end, where the batch thins, costs MTP more than "
            "MTP off.")
    thinned = [n for n, c in models.items() if _host_bound_thinned(c)]
    lo, hi = PARTS_CONCURRENCIES
    for n in thinned:
        c = models[n]
        parts = c["step_parts_ms"][str(PUBLISHED_DRAFTS)]
        line += (f" `{n}` does that: its MTP-3 step is host-bound once the batch thins (GPU / host "
                 f"{parts[str(hi)][0]:.1f} / {parts[str(hi)][1]:.1f} ms at c{hi}, {parts[str(lo)][0]:.1f} / "
                 f"{parts[str(lo)][1]:.1f} ms at c{lo}), so it goes from {_step_ms(c, PUBLISHED_DRAFTS, hi):.1f} to "
                 f"{_step_ms(c, PUBLISHED_DRAFTS, lo):.1f} ms while MTP off's goes from {_step_ms(c, 0, hi):.1f} to "
                 f"{_step_ms(c, 0, lo):.1f} ms: its share falls to {c['decode_share']['on']:.2f}.")
    if gap:
        line += (" No model here comes within " + f"{DECODE_SHARE_GAP:g}" + " of the published MTP-on share, so none "
                 "gives the published TPOT pair and the published throughput ratio at once. The real MTP run spends time "
                 "outside its decode steps that the model has no term for (on what, the table does not say); without "
                 "that term the model meets the throughput ratios only with an MTP step dearer than the real one (the "
                 "draft-pass point below), which is the TPOT misfit.")
    return [line]


def _draft_cost_lines(r: Mapping[str, Any]) -> list[str]:
    last = r["current"]["check"]["tpot"]["bucket"]
    implied, costs, share = r["published_implied_step_costs"], r["step_costs"], r.get("mtp_layer_share") or {}
    tb_lo, tb_hi = costs["testbed_measured_range"]["3"]
    tb_model = costs["testbed_model"]["ratios"]["3"]
    line = (f"- **Draft-pass cost:** the published TPOTs imply an MTP-3 step of {implied[f'tpot_{last}']:.2f}x a plain "
            f"step at {last}, its throughput ratios " + ", ".join(f"{v:.2f}x" for b, v in implied.items() if b.isdigit())
            + f" (outputs {', '.join(b for b in implied if b.isdigit())}); the testbed measured MTP-3 at "
            f"{tb_lo:.2f}–{tb_hi:.2f}x by the throughput measure (output 512, input 512, one H200), while its own fitted "
            f"model's MTP-3 step is {min(tb_model.values()):.2f}–{max(tb_model.values()):.2f}x: the throughput measure "
            "holds more than the step (MTP's prefill and one run's noise among it), so it overstates the step itself.")
    if share:
        pub, tb = share.get(PROFILE_NAME), share.get(testbed.PROFILE_NAME)
        line += (f" The testbed's MTP layer holds {tb['total']:.1%} of its target's parameters ({tb['active']:.1%} of "
                 f"the active), the published profile's {pub['total']:.1%} ({pub['active']:.1%}): a draft pass is "
                 "relatively dearer on the testbed by construction, and a one-GPU 12-layer step is not an 8-GPU "
                 "60-layer one, so the testbed's range does not transfer as a number; the published table's own "
                 "throughput-implied cost at 1024 lies " + ("inside" if tb_lo <= implied["1024"] <= tb_hi else "outside")
                 + " it (the landscape README's point 4).")
    steps = {n: c["step_costs"][last]["3"]["64"] for n, c in _models(r).items()}
    below = all(implied[f"tpot_{last}"] < v for v in steps.values())
    line += (f" The models' MTP-3 step at concurrency 64 and the {last} bucket's context: "
             + ", ".join(f"{n} {v:.2f}x" for n, v in steps.items()) + f"; the published TPOTs' {implied[f'tpot_{last}']:.2f}x "
             + ("lies below every one." if below else "is reached by at least one."))
    peak = [n for n, c in r["candidates"].items() if any(c["constants"].get(k, 0.0) >= 1.0 for k in EFFICIENCIES)]
    if peak:
        line += (f" To cheapen the MTP-3 step, {', '.join(f'`{n}`' for n in peak)} push an efficiency to the GPU's peak "
                 "(" + "; ".join(f"{n}: " + ", ".join(f"`{k}` {r['candidates'][n]['constants'][k]:g}" for k in EFFICIENCIES)
                                 for n in peak) + "). The other lever on that step is the expert coverage its verified "
                 "positions add (`verify_route_novelty`, held): only the real model's routing can set it.")
    return [line]


def _host_lines(r: Mapping[str, Any]) -> list[str]:
    cands = r["candidates"]
    stored = r["current"]["constants"]
    line = (f"- **Per-step overhead:** the stored profile's host part is additive, `decode_overhead_ms` "
            f"{stored['decode_overhead_ms']:g} + `mtp_verify_overhead_ms` {stored['mtp_verify_overhead_ms']:g} + "
            f"{r['workload']['num_draft_tokens']} x `draft_overhead_ms` {stored['draft_overhead_ms']:g}.")
    tb = cands.get("overlap_testbed")
    if tb:
        line += (" Started from the testbed's host constants (" + ", ".join(
            f"`{k}` {tb['start'][k]:g}" for k in TESTBED_HOST) + f") with `host_overlap` {tb['held']['host_overlap']:g}, "
            "the refit keeps a host part of the testbed's order: " + ", ".join(f"`{k}` {tb['constants'][k]:g}"
                                                                              for k in TESTBED_HOST)
            + f" (log-RMS {tb['check']['log_rms']:.4f}, worst tok/s error {tb['check']['worst_abs_throughput_error']:.1%}).")
    free = cands.get("overlap_free")
    if free:
        line += (f" Fitted freely from {testbed.OVERLAP_START:g} and the stored constants, `host_overlap` ends at "
                 f"{free['constants']['host_overlap']:g} with a host part of " + ", ".join(
                     f"`{k}` {free['constants'][k]:g}" for k in TESTBED_HOST)
                 + f" (log-RMS {free['check']['log_rms']:.4f}): a local search does not find the testbed's basin.")
    add = cands.get("additive")
    if add:
        line += (f" The additive control: log-RMS {add['check']['log_rms']:.4f}, host part " + ", ".join(
            f"`{k}` {add['constants'][k]:g}" for k in TESTBED_HOST) + ".")
    line += (" A host part hidden behind a larger GPU part shows in no published figure; only the thinned batch at "
             "the run's end (previous points) lets the table see one.")
    return [line]


def _best_line(r: Mapping[str, Any]) -> list[str]:
    """The refit with the lowest log-RMS on the full check, beside the stored profile, and why it is or is not
    proposed: a better fit is not by itself evidence for an assumption."""
    if not r["candidates"]:
        return []
    name, best = min(r["candidates"].items(), key=lambda kv: kv[1]["check"]["log_rms"])
    cur, ch = r["current"]["check"], best["check"]
    worst = {k: max(abs(e["ratio_error"]) for e in x["buckets"].values()) for k, x in (("stored", cur), (name, ch))}
    return [f"- **Best refit:** `{name}` — log-RMS {ch['log_rms']:.4f} (stored {cur['log_rms']:.4f}), worst ratio error "
            f"{worst[name]:.1%} ({worst['stored']:.1%}), worst tok/s error {ch['worst_abs_throughput_error']:.1%} "
            f"({cur['worst_abs_throughput_error']:.1%}), TPOT on {_pct(ch['tpot']['on_error'])} "
            f"({_pct(cur['tpot']['on_error'])}). "
            + ("It is what the decision below proposes." if r["decision"]["proposed_candidate"] == name else
               "Not proposed: " + ("an additive refit changes constants, not an assumption, and no testbed figure calls "
                                   "for it" if name == "additive" else ", ".join(r["decision"]["reasons_not"].get(name, [])))
               + ". How much better a step structure fits these six figures is weak evidence beside that: six figures "
               "of one load, fitted with seven or eight constants.")]


def render_md(r: Mapping[str, Any]) -> str:
    costs = r["step_costs"]
    last = r["current"]["check"]["tpot"]["bucket"]
    implied = r["published_implied_step_costs"]
    d = r["decision"]
    out = [
        "# The published Intern-S2 profile held against the MoE testbed (SIMULATED)", "",
        f"Command: `{r['command']}` ({r['date']}, {r['wall_s']:.0f} s; commit `{(r['git_commit'] or '?')[:12]}`). "
        f"Versions: {', '.join(f'{k} {v}' for k, v in r['versions'].items())}. Hardware: {r['hardware']['cpu_model']}, "
        f"{r['hardware']['cpus']} CPUs, no GPU. Issue #22 item 4, second part.", "",
        f"**Simulated:** every figure except the published table and the testbed's measured costs comes from the "
        f"simulator's model (`orchestrator/sim/model.py`, `scheduler.simulate_workload`) with profile `{r['profile']}` "
        f"or a refit of it; the published workload (input {r['workload']['input_len']}, range "
        f"{r['workload']['range_ratio']}, concurrency {r['workload']['concurrency']}, T 0, MTP-{r['workload']['num_draft_tokens']} "
        f"vs off, seed 0), searched at {r['workload']['search_prompts']} prompts, checked at "
        f"{r['workload']['check_prompts']}. **Measured:** the published table (the profile's `published` section) and "
        f"the testbed's landscape (`{costs['testbed_source']['landscape']}`).", "",
        "## (a) What an MTP step costs against a plain decode step", "",
        f"Testbed, measured ({costs['testbed_source']['measure']}; output {costs['testbed_source']['output_len']}, "
        f"T {costs['testbed_source']['temperature']:g}, concurrency 1–256): "
        + ", ".join(f"MTP-{n} {lo:.2f}–{hi:.2f}x" for n, (lo, hi) in costs["testbed_measured_range"].items())
        + ". Per concurrency: " + "; ".join(f"MTP-{n}: " + ", ".join(f"c{c} {v:.2f}" for c, v in row.items())
                                           for n, row in costs["testbed_measured"].items()) + ".", "",
        f"Testbed profile's model (`{costs['testbed_model']['profile']}`, its own step at context "
        f"{costs['testbed_model']['context_per_seq']:.0f} per sequence): "
        + "; ".join(f"MTP-{n}: " + ", ".join(f"c{c} {v:.2f}" for c, v in row.items())
                    for n, row in costs["testbed_model"]["ratios"].items()) + ".", "",
        "Published profile's model (the step alone, tp 8), at each bucket's mean decode context (mean prompt + half "
        "the mean output, an approximation):", "",
        "| bucket (context/seq) | " + " | ".join(f"MTP-{n} c{c}" for n in ("1", "3") for c in CONCURRENCIES) + " |",
        "|---|" + "---|" * 8]
    for b, v in costs["published_model"].items():
        out.append(f"| {b} ({v['context_per_seq']:.0f}) | " + " | ".join(f"{v['ratios'][n][str(c)]:.2f}"
                                                                         for n in ("1", "3") for c in CONCURRENCIES) + " |")
    full = costs["published_model"]["1024"]["ratios"]
    out += ["", "All draft counts at the 1024 bucket: " + "; ".join(
        f"MTP-{n}: " + ", ".join(f"c{c} {v:.2f}" for c, v in row.items()) for n, row in full.items()) + ".", "",
        "What the published table itself implies for MTP-3 (accept / (on / off) throughput, as the testbed measures): "
        + ", ".join(f"{b} {v:.2f}x" for b, v in implied.items() if b.isdigit())
        + f"; from the TPOTs at {last} (accept x TPOT on / TPOT off): {implied[f'tpot_{last}']:.2f}x. The stored "
        "model's MTP-3 step at concurrency 64 costs " + f"{full['3']['64']:.2f}x" + " a plain one, its throughput "
        "implies " + ", ".join(f"{b} {v:.2f}x" for b, v in r["current"]["implied_step_costs"].items() if b.isdigit())
        + f" and its TPOTs {r['current']['implied_step_costs'][f'tpot_{last}']:.2f}x.", "",
        "## (b), (c) Refits against the published table, checked on the full workload", "",
        f"Fitted: {', '.join(f'`{k}`' for k in r['search']['fitted'])} (bounds as the testbed fit's); objective: "
        f"{r['search']['objective']}; coordinate search (`tuning.simfit.coordinate_search`), at most "
        f"{r['search']['max_evals']} evaluations, step down to {r['search']['min_rel_step']:g} of each bound's width. "
        f"Held: `routing_spread` {r['held']['routing_spread']:g}, `verify_route_novelty` "
        f"{r['held']['verify_route_novelty']:g} ({r['held']['why']}); acceptance; `eff_prefill_flops`.", ""]
    for name, c in r["candidates"].items():
        out.append(f"- **{name}**: {c['why']}. Constants: " + ", ".join(f"`{k}` {v:g}" for k, v in c["constants"].items())
                   + f" ({c['evaluations']} evaluations, search log-RMS {c['search_log_rms']:.4f}); at a bound: "
                   + (", ".join(f"`{k}`" for k, v in c["constants"].items() if k in c["bounds"] and v in c["bounds"][k])
                      or "none") + ".")
    out += ["", f"**Why fixed in `overlap_testbed`:** {OVERLAP_CHOICE}", "",
            *_summary_rows(r), "", *_check_rows(r), "",
            "## Conclusion", "",
            *_decode_share_lines(r),
            *_draft_cost_lines(r),
            *_host_lines(r),
            "- **Expert coverage:** `routing_spread` and `verify_route_novelty` are kept: the testbed's router is "
            "random by construction, so it cannot inform a trained router's correlated routing.",
            *_best_line(r),
            "- **Decision:** " + (f"propose `{d['proposed_candidate']}` (see `proposed_profile_changes` in the JSON); "
                                  "the lead engineer decides." if d["change_profile"] else
                                  "the evidence does not justify a change; the profile stays as it is "
                                  "(`proposed_profile_changes` null). An additive refit is never proposed; per overlap "
                                  "candidate: " + "; ".join(f"{n}: {', '.join(w) or 'none'}"
                                                                    for n, w in d["reasons_not"].items()) + "."),
            "", "Regenerate: the command above (writes this file and the JSON beside it; `--render RESULT_JSON` "
            "re-derives what needs no simulation from the stored simulated figures); "
            "`tests/unit/test_sim_fit_published.py` checks the JSON against the stored profile and the landscape."]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m docs.analyses.sim_fit.sim_fit_published", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out-prefix", type=Path, default=OUT_PREFIX, help="writes PREFIX.json and PREFIX.md")
    ap.add_argument("--render", type=Path, metavar="RESULT_JSON",
                    help="re-derive every figure that needs no simulation from a stored result's simulated ones "
                         "(checks, step costs, decision) and re-write it and its markdown, without fitting")
    ap.add_argument("--only", nargs="+", choices=["additive", "overlap_testbed", "overlap_free"],
                    help="fit only these candidates (default: all three)")
    ap.add_argument("--search-prompts", type=int, default=SEARCH_PROMPTS, help="prompts per search evaluation")
    ap.add_argument("--max-evals", type=int, default=250, help="simulator evaluations per refit at most")
    ap.add_argument("--min-rel-step", type=float, default=0.02,
                    help="the search stops below this share of each bound's width")
    args = ap.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    if args.render:  # the cheap, profile-derived figures again; the fits are not rerun
        r = json.loads(args.render.read_text())
        r["mtp_layer_share"] = mtp_layer_shares()
        r["search"]["overlap_choice"] = OVERLAP_CHOICE
        stored = load_profile(str(PROFILE_PATH))
        r["current"].update(derived(stored, r["current"]["sim"], r["published"], r["step_costs"]))
        for c in r["candidates"].values():
            c.update(derived(stored.replace(**c["constants"]), c["sim"], r["published"], r["step_costs"]))
        r["decision"] = decide(r["current"]["check"], r["candidates"])
        if not r["decision"]["change_profile"]:
            r["proposed_profile_changes"] = None
        atomic_write_text(args.render, json.dumps(r, indent=1) + "\n")
        atomic_write_text(args.render.with_suffix(".md"), render_md(r))
        print(f"wrote {args.render.with_suffix('.md')}")
        return 0
    r = run(args, given)
    args.out_prefix.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(f"{args.out_prefix}.json"), json.dumps(r, indent=1) + "\n")
    atomic_write_text(Path(f"{args.out_prefix}.md"), render_md(r))
    d = r["decision"]
    print("\nsummary (SIMULATED against the published table):")
    for name, c in [("stored", r["current"]), *r["candidates"].items()]:
        ch = c["check"]
        print(f"  {name}: log-RMS {ch['log_rms']:.4f}, bar {'pass' if ch['passes_bar'] else 'FAIL'}, TPOT "
              f"{ch['tpot']['off_ms']:.2f} -> {ch['tpot']['on_ms']:.2f} ms, decode share on {c['decode_share']['on']:.2f}")
    print(f"  published decode share on {r['published_decode_share']['on']:.2f}; decision: "
          + (f"propose {d['proposed_candidate']}" if d["change_profile"] else "no change to the profile"))
    print(f"wrote {args.out_prefix}.json and .md")
    print("next: python -m pytest -q tests/unit/test_sim_fit_published.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
