"""Fit the simulator's MoE-testbed profile (``qwen35-moe-testbed-1xh200``) to the testbed's measured landscape
and check it on held-out cells (issue #22 item 4). SIMULATED figures against GPU measurements.

The testbed: the constructed Qwen3.5-MoE of ``python -m tuning.checkpoint.build --preset qwen3.5-moe-35b-a3b-12l``
on one H200 (tp=1), LMDeploy 0.18 PyTorch engine, measured by ``benchmarks/gpu/measure_landscape.py``: MTP off
and 1-4 draft tokens x concurrency x temperature x output length, per agreement level, each cell one
closed-loop run of max(4, 2c) requests. Its architecture numbers are counted from the preset's shape
(:mod:`tuning.checkpoint.footprint`), not fitted. The split (:data:`TESTBED_SPLIT`) was fixed before the
first fit. Fitted on the FIT half: acceptance per agreement level (each level is its own checkpoint), then
the step constants shared by every level, under three nested step structures (:data:`STRUCTURES`: host
overhead added to GPU time; partly hidden behind it, ``host_overlap``; and that with a cost for sampled steps,
``sampling_overhead_ms``); the structure is chosen on the FIT half alone (:func:`choose_structure`), and each
held-out cell's run is then repeated by the simulator's own closed-loop benchmark and compared with the one
measured run (±10 % throughput, ±0.15 accept length as LMDeploy's counters count it), for every structure.

    python -m docs.analyses.sim_fit.sim_fit_testbed                                   # fit, check, write the write-up (~40 min, one core)
    python -m docs.analyses.sim_fit.sim_fit_testbed --measurement A.json B.json      # pool several leases' landscapes
    python -m docs.analyses.sim_fit.sim_fit_testbed --write-profile                  # ... and store the fit in the profile
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

from benchmarks.gpu import measure_landscape
from orchestrator.fsutil import atomic_write_text, utc_now_iso
from orchestrator.sim.model import PROFILES_DIR, EngineParams, PerformanceModel, Profile
from tuning.checkpoint.build import PRESETS
from tuning.checkpoint.footprint import footprint
from tuning.simfit import (
    ACCEPT_TOLERANCE,
    THROUGHPUT_TOLERANCE,
    CellCheck,
    MeasuredCell,
    SimFitError,
    Split,
    WaveSetup,
    check_cells,
    fit_acceptance,
    fit_step_overheads,
    landscape_cells,
    repeat_noise,
    repeat_pairs,
)

ROOT = Path(__file__).resolve().parents[3]

MEASUREMENT = ROOT / "benchmarks" / "results" / "gpu_landscape_h200_2026-12-04_a0.5" / "landscape.json"
"""The newest landscape (it holds every lease's cells: each lease is seeded with the one before)."""
PROFILE_NAME = "qwen35-moe-testbed-1xh200"
PROFILE = PROFILES_DIR / f"{PROFILE_NAME}.json"
OUT_PREFIX = Path(__file__).resolve().parent / "sim_fit_testbed_2026-12-04"
"""The result of the stored profile's fit (the default run writes it again)."""
PRESET = measure_landscape.PRESET


def is_held_out(num_draft_tokens: int, concurrency: int, temperature: float) -> bool:
    """The testbed's split rule (:data:`TESTBED_SPLIT`)."""
    return concurrency in (4, 64) or num_draft_tokens == 2


TESTBED_SPLIT = Split(
    "HELD-OUT = every cell at concurrency 4 or 64 (load: interpolated between the measured 1, 16 and 256) and "
    "every MTP-2 cell (draft count: interpolated between MTP-1 and MTP-3); FIT = every other cell.",
    is_held_out)
"""Fixed before the first fit was run, never changed after seeing a result."""

MEMORY_FRACTION_DEFAULT = 0.5
"""``measure_landscape.py --memory-fraction``'s default, used where a landscape's commands do not set it (its
JSON does not record the flag). On this testbed the KV cache never binds (the largest cell needs under 0.3 M
tokens of some 6 M), so the figure does not move a simulated result."""

ACCEPTANCE_BOUNDS = {"accept_p0": (0.02, 0.999), "accept_temperature_slope": (0.0, 8.0)}
"""Fitted per agreement level. Held: ``accept_log_slope`` 0 and ``accept_depth_penalty`` 0 -- the construction
drafts right with the agreement level at every output position and every draft depth (each token of the
successor cycle is in the disagreement set at random), a chain of constant per-draft acceptance, which is the
simulator's acceptance model with those two at 0; ``accept_pos_scale`` then has no effect."""
HELD_ACCEPTANCE = {"accept_log_slope": 0.0, "accept_depth_penalty": 0.0, "accept_pos_scale": 1000.0}

SAMPLING_BOUNDS = {"sampling_overhead_ms": (0.0, 4.0)}
"""The sampling-cost constant fitted with the step constants (:data:`SAMPLING_WHY`), and its bounds."""
SAMPLING_WHY = (
    "The engine's sampling cost (`orchestrator/sim/model.py`): a decode step in which any sequence samples pays "
    "`sampling_overhead_ms` of host time (LMDeploy's sampler runs top-k, top-p, softmax and a multinomial draw as "
    "eager kernels outside the decode CUDA graph once any sequence of the batch has top_k > 1; an all-greedy batch "
    "takes one argmax). Fitted with the other step constants on the FIT half, searched from the overlap fit with "
    "the term at 0 (no cost): the T 0.8 cells against the T 0 ones identify it.")
"""Why the sampling term is fitted (quoted by the write-up)."""

STEP_BOUNDS = {"eff_bandwidth": (0.2, 1.0), "eff_decode_flops": (0.02, 1.0), "decode_overhead_ms": (0.0, 10.0),
               "decode_overhead_per_seq_ms": (0.0, 0.1), "prefill_overhead_ms": (0.0, 50.0),
               "prefill_overhead_per_token_us": (0.0, 80.0), "draft_overhead_ms": (0.0, 10.0),
               "mtp_verify_overhead_ms": (0.0, 15.0), "mtp_prefill_overhead_ms": (0.0, 200.0)}
"""The step constants fitted (shared by every agreement level: the target and the MTP layer's shapes are the
same), and their bounds. The decode step at concurrency 1 is mostly host-side (the fixed overhead), from 64 up
every expert is read each step (bandwidth) and MTP verification multiplies the tokens a step computes (FLOPs)."""

OVERLAP_BOUNDS = {"host_overlap": (0.0, 1.0)}
"""The overlap structure's one more constant: the share of the smaller of a decode step's host and GPU parts
hidden behind the other (``orchestrator.sim.model``); the additive structure holds it at 0."""
OVERLAP_START = 0.5
"""Where the overlap structure's search starts (mid-range: no side taken before the fit)."""
STRUCTURES = {"additive": STEP_BOUNDS, "overlap": {**STEP_BOUNDS, **OVERLAP_BOUNDS},
              "overlap+sampling": {**STEP_BOUNDS, **OVERLAP_BOUNDS, **SAMPLING_BOUNDS}}
"""The step structures compared, by the constants each fits; each nests the one before it."""
STRUCTURE_RULE = (
    "Chosen on the FIT half only, before any held-out cell is simulated: the lower Bayesian information "
    "criterion of the FIT cells' throughput log errors, n ln(log-RMS^2) + k ln(n) (n FIT cells, k step constants "
    "fitted): the overlap structure nests the additive one (host_overlap 0) and overlap+sampling nests overlap "
    "(sampling_overhead_ms 0), so each must lower the FIT log-RMS by more than its one extra constant buys by itself "
    "(a factor exp(ln(n) / 2n): 4 % at 48 cells, 3 % at 84, 2 % at 124); a tie keeps the fewer constants.")
"""How :func:`choose_structure` chooses (quoted by the write-up)."""

LMDEPLOY_OVERLAP = (
    "LMDeploy's PyTorch engine does overlap host and GPU work (read in `InternLM/lmdeploy` at commit 1263d5cd, "
    "whose `lmdeploy/version.py` says 0.16.0: the newest snapshot stored here; the 0.18 release itself was not "
    "read): `lmdeploy/pytorch/engine/engine_loop.py` `EngineLoop._main_loop_get_outputs` queues forward k, then "
    "awaits `_prefetch_next_inputs()` (the scheduler picks, `inputs_maker.prefetch_next_inputs` builds forward "
    "k+1) before `executor.get_output_async()` hands back forward k's tokens; "
    "`lmdeploy/pytorch/engine/model_agent/agent.py` copies inputs to the GPU on a second stream "
    "(`_async_loop_inputs_preprocess`), builds a decode step's inputs as a `ModelInputsDelta` applied to the "
    "previous step's on-GPU state (`_async_step`: `_get_inputs_from_delta`, `step_inputs.step_decode`), so "
    "step k+1 launches without step k's tokens reaching the host, and `get_output_async` polls a CUDA event "
    "instead of blocking; decode runs as captured CUDA graphs (`build_graph_runner`, the MTP proposer's too in "
    "`lmdeploy/pytorch/spec_decode/spec_agent.py`, whose draft passes loop inside the same forward). How much "
    "of the host work that hides depends on the load, so the model fits it (`host_overlap`).")
"""What LMDeploy's source shows about host/GPU overlap (quoted by the write-up)."""

HELD_STEP = {"routing_spread": 1.0, "verify_route_novelty": 1.0, "eff_prefill_flops": 0.4}
"""Held, for the reasons :data:`HELD_STEP_WHY` gives."""
HELD_STEP_WHY = (
    "Routing: the router is random and each position's hidden state is its own token's embedding (no token "
    "mixing), and concurrent sequences carry distinct tokens along the successor cycle, so every routed token "
    "(verified draft positions included) picks its experts independently: routing_spread 1, verify_route_novelty "
    "1; issue #22's probe counted 8 / 31 / 102 / 222 experts per layer (MTP off c1, MTP-3 c1, off c16, MTP-3 c16) "
    "where this gives 8 / 30.5 / 102.0 / 222.4. eff_prefill_flops: with every prompt 512 tokens it moves prefill "
    "time exactly as prefill_overhead_per_token_us does, so it is held at the test checkpoint profile's 0.4.")
"""Why :data:`HELD_STEP` is held (quoted by the write-up)."""

HARDWARE_FROM = PROFILES_DIR / "qwen35-test-83m-1xh200.json"
"""The profile whose ``hardware`` section (one H200: dense bf16 TFLOP/s without sparsity) the testbed's copies:
the same GPU, described once."""
LIMITS = {"default_session_len": 4096, "block_size": 64}
MTP_MEMORY = {"mtp_memory_overhead_gb": 1.0, "safe_max_memory_fraction_mtp": 0.9}
START = {"eff_bandwidth": 0.7, "eff_decode_flops": 0.3, "decode_overhead_ms": 3.0, "decode_overhead_per_seq_ms": 0.01,
         "prefill_overhead_ms": 5.0, "prefill_overhead_per_token_us": 10.0, "draft_overhead_ms": 1.5,
         "mtp_verify_overhead_ms": 2.0, "mtp_prefill_overhead_ms": 20.0, "eos_prob_per_token": 0.0005,
         "sampling_overhead_ms": 0.0}
"""Where the search starts when no profile is stored yet (sampling at 0: the model without the terms)."""


def _round(value: float) -> float:
    """Four significant digits: what the profile stores, and so what the check runs."""
    return float(f"{value:.4g}")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def agreement_key(agreement: float) -> str:
    return f"{agreement:g}"


def architecture() -> dict[str, dict[str, Any]]:
    """The profile's ``architecture`` and ``mtp`` sections: counted from the preset's shape, plus the limits."""
    sections = footprint(PRESETS[PRESET]).profile_sections()
    return {"architecture": {**sections["architecture"], **LIMITS}, "mtp": {**sections["mtp"], **MTP_MEMORY}}


def build_profile(fitted: Mapping[str, float], acceptance: Mapping[float, Mapping[str, float]], notes: str,
                  default_agreement: float) -> dict[str, Any]:
    """The profile JSON: architecture counted, hardware stated, step constants and acceptance as fitted. The
    ``acceptance`` section is ``default_agreement``'s level; other levels go to ``other_agreements``."""
    steps = {**HELD_STEP, **{k: fitted[k] for k in (*STEP_BOUNDS, *OVERLAP_BOUNDS, *SAMPLING_BOUNDS) if k in fitted}}
    data: dict[str, Any] = {
        "name": PROFILE_NAME, "calibrated": False, "notes": notes,
        "derived_from": f"architecture and mtp sections: tuning.checkpoint.footprint.footprint(PRESETS[{PRESET!r}])"
                        " (docs/analyses/sim_fit/sim_fit_testbed.py writes them; tests/unit/test_sim_fit_testbed.py checks them)",
        **architecture(), "hardware": json.loads(HARDWARE_FROM.read_text())["hardware"], "fitted": steps,
        "acceptance": {"agreement": default_agreement, **acceptance[default_agreement], **HELD_ACCEPTANCE,
                       "eos_prob_per_token": START["eos_prob_per_token"]},
    }
    others = {agreement_key(a): dict(v) for a, v in sorted(acceptance.items()) if a != default_agreement}
    if others:
        data["other_agreements"] = others
    return data


def at_agreement(profile: Profile, agreement: float | None) -> Profile:
    """The profile with the acceptance of the testbed's checkpoint at ``agreement`` (None: MTP off, any)."""
    if agreement is None or agreement == profile.extra.get("agreement"):
        return profile
    level = (profile.extra.get("other_agreements") or {}).get(agreement_key(agreement))
    if level is None:
        known = [profile.extra.get("agreement"), *(profile.extra.get("other_agreements") or {})]
        raise SimFitError(f"profile {profile.name!r} has no acceptance for agreement {agreement:g}; fitted: {known}")
    return profile.replace(**level)


def setup_of(landscapes: Sequence[Mapping[str, Any]]) -> WaveSetup:
    """The engine flags and workload every landscape ran (``measure_landscape.engine_config``'s rule over the
    cells it measured); landscapes that differ are refused: they measure different things."""
    setups = set()
    for landscape in landscapes:
        cells = list(landscape["cells"].values())
        fractions = {float(m.group(1)) for cmd in landscape.get("commands", [])
                     if (m := re.search(r"--memory-fraction[ =]([0-9.]+)", cmd))}
        if len(fractions) > 1:
            raise SimFitError(f"a landscape's runs used memory fractions {sorted(fractions)}; fit them apart")
        ns = argparse.Namespace(sim=False, memory_fraction=fractions.pop() if fractions else MEMORY_FRACTION_DEFAULT,
                                concurrency=[int(c["concurrency"]) for c in cells], input_len=int(landscape["input_len"]),
                                output_len=[int(c["output_len"]) for c in cells])
        cfg = measure_landscape.engine_config({"draft_tokens": 0}, Path(PRESET), ns)
        setups.add(WaveSetup(input_len=ns.input_len, memory_fraction=cfg.memory_fraction,
                             max_batch_size=cfg.max_batch_size, session_len=cfg.session_len,
                             max_prefill_tokens=cfg.max_prefill_tokens))
    if len(setups) != 1:
        raise SimFitError(f"the landscapes differ in engine flags or workload {sorted(map(str, setups))}; fit them apart")
    return setups.pop()


def fit(base: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup, *, max_evals: int = 2000,
        min_rel_step: float = 0.02,
        step_bounds: Mapping[str, tuple[float, float]] = STEP_BOUNDS, progress: Any = print
        ) -> tuple[dict[float, dict[str, float]], dict[str, float], dict[str, float]]:
    """Fit on ``cells`` (the FIT half): acceptance per agreement level (from the accept lengths, as counted),
    then the step constants over every cell, each level under its own acceptance. Returns (acceptance by
    level, step constants, errors: per-level accept RMS and the throughput log-RMS), all rounded as stored."""
    acceptance, errors = fit_acceptance_levels(base, cells, progress=progress)
    steps, log_rms = fit_steps(base, cells, setup, acceptance, max_evals=max_evals, min_rel_step=min_rel_step,
                               step_bounds=step_bounds, progress=progress)
    return acceptance, steps, {**errors, "throughput_log_rms": log_rms}


def fit_acceptance_levels(base: Profile, cells: Sequence[MeasuredCell], *, progress: Any = print
                          ) -> tuple[dict[float, dict[str, float]], dict[str, float]]:
    """Acceptance per agreement level from the accept lengths of ``cells`` (as counted), rounded as stored;
    and each level's accept-length RMS."""
    levels = sorted({c.agreement for c in cells if c.agreement is not None})
    if not levels:
        raise SimFitError("no MTP cell with an agreement level among the cells to fit")
    acceptance: dict[float, dict[str, float]] = {}
    errors: dict[str, float] = {}
    for level in levels:
        mine = [c for c in cells if c.agreement == level]
        start = base.replace(**HELD_ACCEPTANCE, accept_p0=min(max(level, 0.05), 0.99))
        point, rms = fit_acceptance(start, mine, bounds=ACCEPTANCE_BOUNDS)
        acceptance[level] = {k: _round(v) for k, v in point.items()}
        errors[f"accept_rms_a{agreement_key(level)}"] = round(rms, 4)
        progress(f"  agreement {level:g}: {acceptance[level]} (accept-length RMS {rms:.3f}, {len(mine)} cells)")
    return acceptance, errors


def fit_steps(base: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup,
              acceptance: Mapping[float, Mapping[str, float]], *, max_evals: int = 2000, min_rel_step: float = 0.02,
              step_bounds: Mapping[str, tuple[float, float]] = STEP_BOUNDS, progress: Any = print
              ) -> tuple[dict[str, float], float]:
    """The step constants in ``step_bounds`` over every cell, each level under its own acceptance, searched
    from ``base``'s values; rounded as stored, with the throughput log-RMS on ``cells``."""
    def cell_profile(p: Profile, c: MeasuredCell) -> Profile:
        return p if c.agreement is None else p.replace(**HELD_ACCEPTANCE, **acceptance[c.agreement])

    progress(f"fitting {len(step_bounds)} step constants on {len(cells)} cells (runs the simulator) ...")
    steps, log_rms = fit_step_overheads(base.replace(**HELD_STEP), cells, setup, bounds=step_bounds,
                                        cell_profile=cell_profile, max_evals=max_evals,
                                        min_rel_step=min_rel_step)
    return {k: _round(v) for k, v in steps.items()}, round(log_rms, 4)


def information_criterion(log_rms: float, cells: int, constants: int) -> float:
    """BIC of a fit with Gaussian log errors: ``n ln(log-RMS^2) + k ln(n)`` (lower is better)."""
    if cells < 1 or log_rms <= 0:
        raise SimFitError(f"an information criterion needs cells >= 1 and a log-RMS > 0; got {cells}, {log_rms}")
    return cells * math.log(log_rms ** 2) + constants * math.log(cells)


def choose_structure(fit_log_rms: Mapping[str, float], cells: int,
                     structures: Mapping[str, Mapping[str, Any]] = STRUCTURES) -> tuple[str, dict[str, float]]:
    """The structure :data:`STRUCTURE_RULE` chooses from each structure's throughput log-RMS on the ``cells``
    FIT cells (and nothing else: a held-out figure never enters); with each one's criterion. Ties go to the
    structure with fewer constants."""
    unknown = sorted(set(fit_log_rms) - set(structures))
    if unknown or not fit_log_rms:
        raise SimFitError(f"structures {unknown or '(none)'} to choose from; known: {list(structures)}")
    scores = {name: round(information_criterion(rms, cells, len(structures[name])), 3)
              for name, rms in fit_log_rms.items()}
    return min(scores, key=lambda name: (scores[name], len(structures[name]))), scores


def fit_overlap_structure(base: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup,
                          acceptance: Mapping[float, Mapping[str, float]], additive: Mapping[str, float],
                          additive_log_rms: float, **kw: Any) -> tuple[dict[str, float], float]:
    """The overlap structure's constants: searched from :data:`OVERLAP_START` with the other constants at
    ``base``'s start, kept only if they beat the additive fit on ``cells``, which is itself a point of this
    structure (``host_overlap`` 0): a local search that ends worse found less, not a worse structure."""
    return _nested_fit(base.replace(host_overlap=OVERLAP_START), cells, setup, acceptance, STRUCTURES["overlap"],
                       additive, additive_log_rms, "host_overlap", **kw)


def fit_sampling_structure(base: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup,
                           acceptance: Mapping[float, Mapping[str, float]], overlap: Mapping[str, float],
                           overlap_log_rms: float, *, step_bounds: Mapping[str, tuple[float, float]] | None = None,
                           **kw: Any) -> tuple[dict[str, float], float]:
    """The overlap+sampling structure's constants (``step_bounds``, default all of them): searched from the
    overlap fit with ``sampling_overhead_ms`` 0 (that fit is a point of this structure), kept only if they beat
    it on ``cells``."""
    return _nested_fit(base.replace(**overlap, sampling_overhead_ms=0.0), cells, setup, acceptance,
                       step_bounds or STRUCTURES["overlap+sampling"], overlap, overlap_log_rms, "sampling_overhead_ms",
                       **kw)


def _nested_fit(start: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup,
                acceptance: Mapping[float, Mapping[str, float]], bounds: Mapping[str, tuple[float, float]],
                parent: Mapping[str, float], parent_log_rms: float, new_constant: str,
                **kw: Any) -> tuple[dict[str, float], float]:
    """A structure that adds ``new_constant`` to ``parent``'s: ``bounds`` searched from ``start``; the parent
    fit is this structure's point with ``new_constant`` 0, so a search that ends worse returns that point."""
    steps, log_rms = fit_steps(start, cells, setup, acceptance, step_bounds=bounds, **kw)
    if log_rms <= parent_log_rms:
        return steps, log_rms
    return {**parent, new_constant: 0.0}, parent_log_rms


def summarise(checks: Sequence[CellCheck]) -> dict[str, Any]:
    with_accept = [ch for ch in checks if ch.accept_ok is not None]
    worst = sorted(checks, key=lambda ch: -abs(ch.throughput_error))[:5]
    worst_accept = sorted(with_accept, key=lambda ch: -abs(ch.accept_error))[:5]
    return {"cells": len(checks), "throughput_pass": sum(ch.throughput_ok for ch in checks),
            "accept_cells": len(with_accept), "accept_pass": sum(bool(ch.accept_ok) for ch in with_accept),
            "max_abs_throughput_error": round(max(abs(ch.throughput_error) for ch in checks), 4),
            "median_abs_throughput_error": round(statistics.median(abs(ch.throughput_error) for ch in checks), 4),
            "log_rms": round(math.sqrt(statistics.fmean(math.log1p(ch.throughput_error) ** 2 for ch in checks)), 4),
            "max_abs_accept_error": round(max(abs(ch.accept_error) for ch in with_accept), 4) if with_accept else None,
            "worst_throughput": [f"{ch.cell.name} {ch.throughput_error:+.0%}" for ch in worst],
            "worst_accept": [f"{ch.cell.name} {ch.accept_error:+.2f}" for ch in worst_accept]}


def by_group(checks: Sequence[CellCheck]) -> dict[str, dict[str, Any]]:
    """Throughput error (simulated over measured, minus 1) by concurrency and by draft count: where the
    model misses systematically rather than by one run's noise."""
    out: dict[str, dict[str, Any]] = {}
    for label, key in (("concurrency", lambda c: c.concurrency), ("draft_tokens", lambda c: c.num_draft_tokens),
                       ("output_len", lambda c: c.output_len), ("temperature", lambda c: c.temperature)):
        groups: dict[Any, list[float]] = defaultdict(list)
        for ch in checks:
            groups[key(ch.cell)].append(ch.throughput_error)
        out[label] = {f"{k:g}": {"cells": len(v), "mean_error": round(statistics.fmean(v), 4),
                                 "pass": sum(abs(e) <= THROUGHPUT_TOLERANCE for e in v)}
                      for k, v in sorted(groups.items())}
    return out


def mtp_ratio_check(checks: Sequence[CellCheck]) -> dict[str, Any]:
    """MTP over MTP-off throughput of the same (output, temperature, concurrency), measured and simulated: what
    a tuner reads off a profile. Counted over every checked cell whose MTP-off partner was checked too."""
    off = {(ch.cell.output_len, ch.cell.temperature, ch.cell.concurrency): ch for ch in checks
           if not ch.cell.num_draft_tokens}
    rows, agree = [], 0
    for ch in checks:
        partner = off.get((ch.cell.output_len, ch.cell.temperature, ch.cell.concurrency))
        if not ch.cell.num_draft_tokens or partner is None:
            continue
        measured = ch.cell.throughput / partner.cell.throughput
        simulated = ch.sim_throughput / partner.sim_throughput
        same_side = (measured >= 1) == (simulated >= 1)
        agree += same_side
        rows.append({"cell": ch.cell.name, "measured": round(measured, 3), "simulated": round(simulated, 3),
                     "same_side_of_1": same_side})
    return {"pairs": len(rows), "same_side_of_1": agree, "rows": rows}


def measurement_facts(cells: Sequence[MeasuredCell]) -> dict[str, Any]:
    """Figures the write-up quotes about the measurement itself, computed here (not typed in)."""
    by = {(c.engine, c.output_len, c.temperature, c.concurrency): c for c in cells}
    off_c1_over_c4 = {f"o{o} T{t:g}": round(4 * by[("mtp-off", o, t, 1)].throughput / by[("mtp-off", o, t, 4)].throughput, 2)
                      for o in sorted({c.output_len for c in cells}) for t in sorted({c.temperature for c in cells})
                      if ("mtp-off", o, t, 1) in by and ("mtp-off", o, t, 4) in by}
    mtp_beats_off = sum(1 for c in cells if c.num_draft_tokens and (p := by.get(("mtp-off", c.output_len, c.temperature,
                                                                                   c.concurrency)))
                        and c.throughput > p.throughput)
    spans = {}
    for (engine, o, t, c), off in by.items():
        if engine != "mtp-off":
            continue
        for level in sorted({x.agreement for x in cells if x.agreement is not None}):  # one checkpoint each
            ratios = [x.throughput / off.throughput for (e, oo, tt, cc), x in by.items()
                      if e != "mtp-off" and x.agreement == level and (oo, tt, cc) == (o, t, c)]
            if len(ratios) > 1:
                spans[f"a{level:g} o{o} T{t:g} c{c}"] = [round(min(ratios), 2), round(max(ratios), 2)]
    widest = max(spans.items(), key=lambda kv: kv[1][1] - kv[1][0], default=None)
    return {"cells": len(cells), "mtp_cells": sum(1 for c in cells if c.num_draft_tokens),
            "widest_mtp_over_off_span": None if widest is None else {"cell": widest[0], "range": widest[1]},
            "mtp_faster_than_off": mtp_beats_off,
            "agreement_levels": sorted({c.agreement for c in cells if c.agreement is not None}),
            "runs_per_cell": sorted({len(c.throughputs) for c in cells}),
            "mtp_off_4x_c1_over_c4": off_c1_over_c4}


def one_run_noise(landscapes: Sequence[Mapping[str, Any]], cells: Sequence[MeasuredCell]) -> dict[str, Any]:
    """How far one run moves, from the landscape's warm repeat pairs (:func:`tuning.simfit.repeat_pairs`: a cell
    measured in two leases), and from it the share of cells a model exact in expectation would put within ±10 %
    of one run (normal errors). Beside it, MTP off greedy over sampled at each output length and concurrency:
    the same work but for the engine's sampling cost, so a ratio that stays above 1 is that cost (which the model
    fits since :data:`SAMPLING_BOUNDS`), not noise."""
    pairs = [q for landscape in landscapes for q in repeat_pairs(landscape)[0]]
    noise = repeat_noise(pairs)
    by = {(c.output_len, c.concurrency, c.temperature): c for c in cells if not c.num_draft_tokens}
    logs = {f"o{o} c{c}": math.log(by[(o, c, 0.0)].throughput / by[(o, c, 0.8)].throughput)
            for (o, c, t) in sorted(by) if t == 0.0 and (o, c, 0.8) in by}
    out: dict[str, Any] = {"pairs": len(pairs), "repeats": {q.key: round(math.exp(q.log_ratio), 3) for q in pairs}}
    if logs:
        out["greedy_over_sampled"] = {k: round(math.exp(v), 3) for k, v in logs.items()}
        out["greedy_faster"] = sum(v > 0 for v in logs.values())
        out["greedy_over_sampled_geomean"] = round(math.exp(statistics.fmean(logs.values())), 3)
    if noise is not None:
        tol = math.log(1 + THROUGHPUT_TOLERANCE)
        out |= {"one_run_log_sigma": round(noise.sd, 4), "df": noise.df,
                "exact_model_pass_share": round(2 * NormalDist().cdf(tol / noise.sd) - 1, 3)}
    return out


def step_overlap(landscapes: Sequence[Mapping[str, Any]], profile: Profile, setup: WaveSetup) -> dict[str, Any]:
    """The measured MTP-off decode step (median TPOT) at each concurrency, beside the least time the model's
    own byte count allows for that step's GPU work (weights touched, KV and states read at the H200's full
    bandwidth, no FLOP cost, no overhead). Where the measured step grows by less than that between two loads,
    no additive ``host overhead + GPU time`` step fits with an efficiency <= 1: host and GPU work overlap."""
    ideal = profile.replace(eff_bandwidth=1.0, eff_decode_flops=1e9, decode_overhead_ms=0.0,
                            decode_overhead_per_seq_ms=0.0)
    model = PerformanceModel(ideal, EngineParams(tp=1, memory_fraction=setup.memory_fraction,
                                                 max_batch_size=setup.max_batch_size, session_len=setup.session_len))
    rows: dict[tuple[int, float], dict[int, float]] = defaultdict(dict)
    for landscape in landscapes:
        for c in landscape["cells"].values():
            if not c["draft_tokens"] and c.get("tpot_ms_median") and not c.get("failed"):
                rows[(int(c["output_len"]), float(c["temperature"]))][int(c["concurrency"])] = float(c["tpot_ms_median"])
    out = {}
    for (o, t), tpot in sorted(rows.items()):
        floor = {c: round(model.decode_time(c, c * (setup.input_len + o // 2)) * 1e3, 2) for c in sorted(tpot)}
        out[f"o{o} T{t:g}"] = {"tpot_ms": {c: round(v, 2) for c, v in sorted(tpot.items())}, "gpu_floor_ms": floor}
    return out


def warmed_per_concurrency(landscapes: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many cells were measured after ``measure_landscape.py``'s warm-up at every concurrency (its ``warmup``
    field), of how many."""
    cells = [c for m in landscapes for c in m["cells"].values()]
    return {"cells": sum(c.get("warmup") == measure_landscape.WARMUP for c in cells), "of": len(cells)}


def mtp_off_ttft(landscapes: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """MTP-off median TTFT (ms) by output length, temperature and concurrency, as measured."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for landscape in landscapes:
        for c in sorted(landscape["cells"].values(), key=lambda c: (c["output_len"], c["temperature"], c["concurrency"])):
            if not c["draft_tokens"] and c.get("ttft_ms_median") is not None:
                out[f"o{c['output_len']} T{c['temperature']:g}"][int(c["concurrency"])] = round(float(c["ttft_ms_median"]), 1)
    return dict(out)


def _table(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| cell | requests | measured tok/s | SIMULATED tok/s | error | ±10 % | accept measured | accept SIMULATED "
             "(as counted) | error | ±0.15 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        acc = ("—", "—", "—", "—") if e["measured_accept_length"] is None else (
            f"{e['measured_accept_length']:.2f}", f"{e['sim_accept_length']:.2f}", f"{e['accept_error']:+.2f}",
            "pass" if e["accept_ok"] else "**fail**")
        lines.append(f"| {e['cell']} | {e['requests']} | {e['measured_throughput']:,.0f} | {e['sim_throughput']:,.0f} | "
                     f"{e['throughput_error']:+.1%} | {'pass' if e['throughput_ok'] else '**fail**'} | "
                     + " | ".join(acc) + " |")
    return lines


def _group_lines(groups: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [f"- by {label}: " + "; ".join(f"{k}: mean {v['mean_error']:+.0%} ({v['pass']}/{v['cells']} pass)"
                                          for k, v in g.items()) for label, g in groups.items()]


def _against_noise(r: Mapping[str, Any]) -> list[str]:
    """The held-out pass share beside what one run's measured noise alone would allow an exact model."""
    noise, held = r.get("one_run_noise") or {}, r["held_out"]
    if "one_run_log_sigma" not in noise:
        return []
    log_rms = math.sqrt(statistics.fmean(math.log(1 + e["throughput_error"]) ** 2 for e in held))
    share = sum(e["throughput_ok"] for e in held) / len(held)
    return [f"- Against the noise floor (Notes): {share:.0%} of held-out cells pass where a model exact in expectation "
            f"would pass about {noise['exact_model_pass_share']:.0%} of one-run cells; held-out log-RMS error "
            f"{log_rms:.2f} against one run's measured {noise['one_run_log_sigma']:.2f}, which leaves about "
            f"{math.sqrt(max(log_rms ** 2 - noise['one_run_log_sigma'] ** 2, 0.0)):.2f} for the model itself if the "
            "two are independent; the model's own part shows in the means by concurrency below."]


def _structure_lines(r: Mapping[str, Any]) -> list[str]:
    """The step structures side by side: what chose (FIT), and the held-out result of each (the record)."""
    structures = r.get("structures") or {}
    if not structures:
        return []
    chosen = r["chosen_structure"]

    def by_c(groups: Mapping[str, Any]) -> str:
        return ", ".join(f"c{c} {g['mean_error']:+.0%}" for c, g in groups.items())

    lines = ["## Step structure: additive, host/GPU overlap, or overlap with a sampling cost (chosen on the FIT half)", "",
             LMDEPLOY_OVERLAP, "",
             ("The structures: **additive**, a decode step of host overhead + GPU time (every earlier profile); "
              "**overlap**, `gpu + host - host_overlap x min(host, gpu)` (`orchestrator/sim/model.py`; the MTP step's "
              "parts summed over its draft passes and verification first; prefill stays a sum), `host_overlap` "
              f"fitted in 0..1 beside the same constants, its search started at {OVERLAP_START:g}; **overlap+sampling**, "
              "the overlap structure with `sampling_overhead_ms` (host time a decode step pays when any of its "
              "sequences samples) fitted too, searched from the overlap fit with the term at 0. "
              f"{r['structure_rule']}"),
             "",
             ("| structure | constants fitted | `host_overlap` | `sampling_overhead_ms` | FIT log-RMS | criterion | "
              "FIT ±10 % | FIT mean error by concurrency | held-out ±10 % (median) | held-out accept ±0.15 | held-out "
              "mean error by concurrency |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, st in structures.items():
        fs, hs = st["fit_summary"], st["held_out_summary"]
        lines.append(f"| {'**' + name + '** (chosen)' if name == chosen else name} | {len(st['fitted'])} | "
                     f"{st['fitted'].get('host_overlap', 0.0):g} | {st['fitted'].get('sampling_overhead_ms', 0.0):g} | "
                     f"{st['fit_log_rms']:.4f} | {st['criterion']:.1f} | "
                     f"{fs['throughput_pass']}/{fs['cells']} | {by_c(st['fit_by_concurrency'])} | "
                     f"{hs['throughput_pass']}/{hs['cells']} ({hs['median_abs_throughput_error']:.0%}) | "
                     f"{hs['accept_pass']}/{hs['accept_cells']} | {by_c(st['held_out_by_concurrency'])} |")
    other = [n for n in structures if n != chosen]
    mine = structures[chosen]
    lines += ["", f"Chosen: **{chosen}**, on the FIT columns alone (criterion lower"
              + (f" than {', '.join(other)}'s" if other else "") + "); the held-out columns were computed after the "
              "choice, for the record, and did not enter it. The rest of this write-up is the chosen structure's."]
    for name in other:
        theirs = structures[name]
        h_mine, h_theirs = mine["held_out_summary"], theirs["held_out_summary"]
        better = h_mine["log_rms"] < h_theirs["log_rms"]
        lines += ["", f"Held out, {chosen} against {name}: log-RMS {h_mine['log_rms']:.3f} against "
                  f"{h_theirs['log_rms']:.3f}, ±10 % in {h_mine['throughput_pass']} against "
                  f"{h_theirs['throughput_pass']} of {h_mine['cells']} cells (FIT: log-RMS {mine['fit_log_rms']:.3f} "
                  f"against {theirs['fit_log_rms']:.3f}, ±10 % {mine['fit_summary']['throughput_pass']} against "
                  f"{theirs['fit_summary']['throughput_pass']} of {mine['fit_summary']['cells']}): "
                  + ("the FIT half's gain carries to the held-out half." if better else
                     "the FIT half's gain does NOT carry to the held-out half; the structure stays chosen, because "
                     "choosing it by these columns would fit the held-out cells.")]
    bounds = STRUCTURES["overlap+sampling"]
    pinned = {name: [f"`{k}` {v:g}" for k, v in st["fitted"].items() if k in bounds and v in bounds[k]]
              for name, st in structures.items()}
    lines += ["", "Constants at a bound of their search: " + "; ".join(
        f"{name}: {', '.join(v) if v else 'none'}" for name, v in pinned.items()) + ".", ""]
    lines += [
              "Constants of each fit: " + "; ".join(
                  f"{name}: " + ", ".join(f"`{k}` {v:g}" for k, v in st["fitted"].items())
                  for name, st in structures.items()) + ".", ""]
    return lines


def render_md(r: Mapping[str, Any]) -> str:
    held, fit_s, facts = r["held_out_summary"], r["fit_summary"], r["facts"]
    goal = held["throughput_pass"] == held["cells"] and held["accept_pass"] == held["accept_cells"]
    arch = r["architecture"]
    ratio = r["mtp_ratio_check"]
    out = [
        "# Simulator profile of the MoE testbed: fit on half of the landscape, check on the other half (SIMULATED)",
        "",
        f"Command: `{r['command']}` ({r['date']}, {r['wall_s']:.0f} s on this machine's CPU; the simulator runs in "
        "simulated time). Issue #22 item 4.",
        "",
        f"**Measured:** {', '.join(f'`{m}`' for m in r['measurements'])}: the constructed Qwen3.5-MoE "
        f"(`--preset {PRESET}`) on one H200, LMDeploy 0.18 PyTorch engine, {facts['cells']} cells "
        f"(agreement level(s) {', '.join(f'{a:g}' for a in facts['agreement_levels'])}), each **one closed-loop run** "
        f"of max(4, 2c) requests at concurrency c, input {r['setup']['input_len']}, `ignore_eos`. Engine flags "
        f"simulated: {r['setup']}. Runs per cell: {facts['runs_per_cell']} — so there is no interval per cell, and "
        "every throughput verdict below is on one run.",
        "",
        "**Simulated:** profile `" + PROFILE_NAME + "` as stored"
        + (" (written by this run)" if r["profile_written"] else " (this run's fit; not written to the profile)")
        + ", each cell's run repeated by `orchestrator.sim.scheduler.simulate_workload` (closed loop, the cell's "
        "requests and concurrency, fixed lengths, seed 0); its accept length as LMDeploy's counters count it over "
        "the decode outputs per request they saw in that cell (`tuning.simfit.as_counted`).",
        "",
        f"**Split, fixed before fitting:** {r['split_rule']} FIT {r['fit_cells']} cells, HELD-OUT {r['held_out_cells']}.",
        "",
        "## Architecture (counted, not fitted)",
        "",
        f"`tuning.checkpoint.footprint.footprint(PRESETS['{PRESET}'])`, tensor by tensor as the builder writes them: "
        f"dense (non-expert) {arch['architecture']['dense_params_b']:.4f} B parameters (embedding and `lm_head` "
        f"0.311 B each), routed experts {arch['architecture']['expert_params_b']:.4f} B "
        f"({arch['architecture']['num_experts']} experts, top-{arch['architecture']['experts_per_token']}), MTP layer "
        f"{arch['mtp']['mtp_dense_params_b']:.4f} B dense + {arch['mtp']['mtp_expert_params_b']:.4f} B experts; KV "
        f"{arch['architecture']['kv_bytes_per_token']} B per token (3 full-attention layers x K,V x 2 heads x 256 x "
        f"bf16), MTP KV {arch['mtp']['mtp_kv_bytes_per_token']} B; delta-net states "
        f"{arch['architecture']['state_bytes_per_seq']:,} B per sequence (9 layers x (conv 8192 x 4 + recurrent "
        "32 x 128 x 128) x bf16, as LMDeploy's `configurations/qwen3_5.py` allocates them); weights "
        f"{r['weights_gb']:.2f} GB. Hardware as `qwen35-test-83m-1xh200` (one H200: 4.8 TB/s, 989 dense TFLOP/s).",
        "",
        "## What was fitted, what was held",
        "",
        "- **Acceptance, per agreement level** (each level is its own checkpoint), from the FIT half's accept "
        "lengths compared as counted: " + "; ".join(
            f"agreement {a}: `accept_p0` {v['accept_p0']:g}, `accept_temperature_slope` {v['accept_temperature_slope']:g} "
            f"(RMS {r['fit_errors'][f'accept_rms_a{a}']:.3f})" for a, v in r["acceptance"].items())
        + ". Held: `accept_log_slope` 0, `accept_depth_penalty` 0 — the construction drafts right with the "
        "agreement level at every position and depth (a chain of constant per-draft acceptance), which is the "
        "simulator's acceptance model with those at 0; it represents the construction exactly, and the "
        "temperature dependence through one slope on the logit scale (one temperature above 0 measured, so the "
        "slope is identified by it alone).",
        "- **Step constants, shared by every level:** " + ", ".join(f"`{k}` {v:g}" for k, v in r["fitted"].items())
        + f" (throughput log-RMS on FIT {r['fit_errors']['throughput_log_rms']:.3f}).",
        "- **Held:** " + ", ".join(f"`{k}` {v:g}" for k, v in r["held"].items()) + ". " + HELD_STEP_WHY,
        "",
        *_structure_lines(r),
        "## Held-out result",
        "",
        f"- Throughput within ±10 %: **{held['throughput_pass']} of {held['cells']} cells** (median |error| "
        f"{held['median_abs_throughput_error']:.0%}, worst {held['max_abs_throughput_error']:.0%}), each against ONE "
        "measured run.",
        f"- Accept length (as counted) within ±0.15: **{held['accept_pass']} of {held['accept_cells']} MTP cells** "
        f"(worst {held['max_abs_accept_error']:.2f}).",
        f"- **Goal (±10 % throughput and ±0.15 accept length on every held-out cell): {'MET' if goal else 'NOT MET'}.**",
        *_against_noise(r),
        f"- Worst throughput: {'; '.join(held['worst_throughput'])}. Worst accept: {'; '.join(held['worst_accept'])}.",
        *_group_lines(r["held_out_by_group"]),
        f"- MTP over MTP-off (same output, temperature, concurrency), held-out MTP cells with a held-out partner "
        f"(MTP off at c4/c64): the simulated ratio is on the same side of 1 as the measured in "
        f"{ratio['same_side_of_1']} of {ratio['pairs']}.",
        "",
        *_table(r["held_out"]),
        "",
        "## The FIT half, for comparison",
        "",
        f"Throughput within ±10 % in {fit_s['throughput_pass']} of {fit_s['cells']} (median |error| "
        f"{fit_s['median_abs_throughput_error']:.0%}), accept length within ±0.15 in {fit_s['accept_pass']} of "
        f"{fit_s['accept_cells']}.",
        *_group_lines(r["fit_by_group"]),
        "",
        *_table(r["fit"]),
        "",
        "## Notes",
        "",
        *[f"- {n}" for n in r["findings"]],
        "",
        "Regenerate: the command above (writes this file and the JSON beside it; `--write-profile` stores the fit "
        f"in `orchestrator/sim/profiles/{PROFILE_NAME}.json`; `tests/unit/test_sim_fit_testbed.py` checks the "
        "stored profile against this result).",
    ]
    return "\n".join(out) + "\n"


def findings(r: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    """The notes the data supports, computed from this run's result."""
    held_groups = r["held_out_by_group"]["concurrency"]
    notes = [
        f"Agreement levels measured: {', '.join(f'{a:g}' for a in facts['agreement_levels'])} (acceptance is fitted "
        "per level, the step constants over all). Each lease's landscape.json is seeded with the one before, so the "
        "newest file holds every cell: pass it alone as `--measurement` (a cell in two files counts as two runs; the "
        "same run in two files is refused).",
        "One run per cell: a throughput verdict is one run against the model, with no interval of its own. Issue "
        "#22 measured 12-17 % CV for one wave and 1.5-2x between engine starts on this GPU; in this landscape MTP "
        f"beats MTP off in {facts['mtp_faster_than_off']} of {facts['mtp_cells']} cells, and the draft counts of one "
        + (f"(agreement, output, temperature, concurrency) span up to {w['range'][0]:g}x-{w['range'][1]:g}x of MTP off ({w['cell']})"
           if (w := facts.get("widest_mtp_over_off_span")) else "cell differ little")
        + ": differences a model smooth in draft count cannot follow.",
        "MTP off, four times its concurrency-1 throughput over its concurrency-4 throughput (above 1: four "
        "streams ran slower than four lone ones would): "
        + ", ".join(f"{k} {v:g}" for k, v in facts["mtp_off_4x_c1_over_c4"].items())
        + "; the engine measured its cells in the order "
        "c1, c4, c16, ... after one unmeasured full-length run at concurrency 64, and, where its `warmup` field says "
        "so, one short run at every concurrency (`measure_landscape.run`); MTP-off "
        "median TTFT in ms by concurrency: " + "; ".join(f"{k}: " + ", ".join(f"c{c} {v:.0f}" for c, v in row.items())
                                                        for k, row in r["mtp_off_ttft_ms"].items())
        + ". Cells measured after `measure_landscape.py`'s later warm-up at every concurrency (its `warmup` field): "
        f"{r['per_concurrency_warmup']['cells']} of {r['per_concurrency_warmup']['of']}; cells measured again with it "
        "(`--redo`) would tell a first use of a batch shape from load. Held-out c4 mean error: "
        f"{held_groups.get('4', {}).get('mean_error', float('nan')):+.0%}, c64: "
        f"{held_groups.get('64', {}).get('mean_error', float('nan')):+.0%}.",
        *_noise_note(r),
        *_overlap_note(r),
        "Model limits met here (not changed): the decode step reads "
        "every dense weight, the 0.31 B-parameter embedding table included (a gather in the engine, 0.62 GB a step "
        "too many in the model), and an MTP draft step reads only the MTP layer's weights, not the shared 0.62 GB "
        "`lm_head` it computes its draft logits with; the fitted efficiencies and draft overhead absorb both.",
    ]
    return notes


def _noise_note(r: Mapping[str, Any]) -> list[str]:
    noise, lines = r["one_run_noise"], []
    if "one_run_log_sigma" in noise:
        lines.append(
            "The noise floor, measured: cells measured warm in two leases (later / earlier) "
            + ", ".join(f"`{k}` {v:g}" for k, v in noise["repeats"].items())
            + f": one run moves by about {noise['one_run_log_sigma']:.0%} (log sd, {noise['df']} df; a shift between "
            f"leases counted as noise). With that noise a model exact in expectation would put about "
            f"{noise['exact_model_pass_share']:.0%} of one-run cells within ±10 %: the bar needs repeated runs per cell "
            "to be judged cell by cell.")
    if "greedy_over_sampled" in noise:
        sampling = {k: v for k, v in r.get("fitted", {}).items() if k in SAMPLING_BOUNDS}
        tried = (r.get("structures") or {}).get("overlap+sampling", {}).get("fitted", {})
        if sampling:
            has = ("costs time, which the model's sampling term stands for ("
                   + ", ".join(f"`{k}` {v:g}" for k, v in sampling.items()) + f" as fitted; {SAMPLING_WHY})")
        elif tried:
            has = ("costs time the stored model does not have: the overlap+sampling structure fitted `sampling_overhead_ms` "
                   f"{tried.get('sampling_overhead_ms', 0.0):g}, which did not lower the FIT error by more than its extra "
                   "constant buys (above)")
        else:
            has = "costs time the model does not have"
        lines.append(
            "MTP off greedy over sampled (T 0 over T 0.8), the same work but for sampling: "
            + ", ".join(f"{k} {v:g}" for k, v in noise["greedy_over_sampled"].items())
            + f" — greedy faster in {noise['greedy_faster']} of {len(noise['greedy_over_sampled'])}, geometric mean "
            f"{noise['greedy_over_sampled_geomean']:g}: the engine's sampling work (top-k/top-p over the whole "
            f"vocabulary) {has}{_tpot_pair(r)}; where the sampled cell was measured before "
            "the per-concurrency warm-up and the greedy one after it, the ratio holds the first pass's cost as well. "
            "These pairs are not noise (an earlier version of this fit took them for it).")
    return lines


def _tpot_pair(r: Mapping[str, Any]) -> str:
    """MTP off's median TPOT greedy and sampled at the lowest concurrency of the longest output, as text."""
    steps = r.get("step_overlap") or {}
    outs = sorted({int(k.split()[0][1:]) for k in steps})
    if not outs or f"o{outs[-1]} T0" not in steps or f"o{outs[-1]} T0.8" not in steps:
        return ""
    greedy, sampled = steps[f"o{outs[-1]} T0"]["tpot_ms"], steps[f"o{outs[-1]} T0.8"]["tpot_ms"]
    c = min(set(map(int, greedy)) & set(map(int, sampled)), default=None)
    if c is None:
        return ""
    g, t = ({int(k): v for k, v in d.items()}[c] for d in (greedy, sampled))
    return f" (median TPOT at concurrency {c}, output {outs[-1]}: {g:g} ms greedy, {t:g} ms sampled)"


def _overlap_note(r: Mapping[str, Any]) -> list[str]:
    overlap = {k: {part: {int(c): ms for c, ms in by_c.items()} for part, by_c in v.items()}  # JSON keys are text
               for k, v in r["step_overlap"].items()}
    rows = {k: v for k, v in overlap.items() if 1 in v["tpot_ms"] and 16 in v["tpot_ms"]}
    if not rows:
        return []
    additive = (r.get("structures") or {}).get("additive") or {
        "fitted": r["fitted"], "fit_by_concurrency": r["fit_by_group"]["concurrency"]}  # a result from before
    fitted = additive["fitted"]
    flatter = sum(v["tpot_ms"][16] - v["tpot_ms"][1] < v["gpu_floor_ms"][16] - v["gpu_floor_ms"][1] for v in rows.values())
    parts = [f"{k}: " + ", ".join(f"c{c} {v['tpot_ms'][c]:.2f} ({v['gpu_floor_ms'][c]:.2f})" for c in v["tpot_ms"])
             for k, v in overlap.items()]
    errors = {c: g["mean_error"] for c, g in additive["fit_by_concurrency"].items()}
    bounds = STRUCTURES["additive"]
    at_bounds = [k for k, v in fitted.items() if k in bounds and v in bounds[k]]
    return ["Why a second structure: measured MTP-off median TPOT in ms, with the least GPU time the model's own "
            "byte count allows at the H200's full 4.8 TB/s in brackets: "
            + "; ".join(parts) + f". From concurrency 1 to 16 the measured step grows by less than that floor "
            f"(about 7 GB more expert weights a step) in {flatter} of {len(rows)} rows, which a step of host overhead "
            "PLUS GPU time fits only with a bandwidth efficiency above 1; the additive fit's mean error on FIT cells "
            "by concurrency: " + ", ".join(f"c{c} {e:+.0%}" for c, e in errors.items())
            + (f"; its constants at a bound of their search: {', '.join(f'{k} {fitted[k]:g}' for k in at_bounds)}"
               if at_bounds else "")
            + ". Only concurrency 1 to 16 is read this way: under load a client's TPOT also sees coalesced chunks "
            "(a median below any GPU step, as at o128 T0.8 c256, is one)."]


def structure_report(profile: Profile, cells: Sequence[MeasuredCell], setup: WaveSetup, fitted: Mapping[str, float],
                     fit_log_rms: float, criterion: float) -> dict[str, Any]:
    """One step structure's fit and checks: its constants, FIT log-RMS and criterion (what chose), and, for the
    record only, its held-out result."""
    fit_checks, held_checks = (check_cells(profile, [c for c in cells if c.held_out is held], setup,
                                           cell_profile=lambda p, c: at_agreement(p, c.agreement))
                               for held in (False, True))
    return {"fitted": dict(fitted), "fit_log_rms": fit_log_rms, "criterion": criterion,
            "fit_summary": summarise(fit_checks), "fit_by_concurrency": by_group(fit_checks)["concurrency"],
            "held_out_summary": summarise(held_checks),
            "held_out_by_concurrency": by_group(held_checks)["concurrency"]}


def result_of(args: argparse.Namespace, argv: Sequence[str], landscapes: Sequence[Mapping[str, Any]],
              cells: Sequence[MeasuredCell],
              setup: WaveSetup, acceptance: Mapping[float, Mapping[str, float]], steps: Mapping[str, float],
              errors: Mapping[str, float], profile: Profile, t0: float,
              structures: Mapping[str, Any] | None = None, chosen: str = "additive") -> dict[str, Any]:
    fit_cells = [c for c in cells if not c.held_out]
    held_cells = [c for c in cells if c.held_out]
    held_checks = check_cells(profile, held_cells, setup, cell_profile=lambda p, c: at_agreement(p, c.agreement))
    fit_checks = check_cells(profile, fit_cells, setup, cell_profile=lambda p, c: at_agreement(p, c.agreement))
    facts = measurement_facts(cells)
    r: dict[str, Any] = {
        "simulated": True,
        "command": " ".join(["python -m docs.analyses.sim_fit.sim_fit_testbed", *argv]),
        "date": utc_now_iso(),
        "measurements": [_rel(p) for p in args.measurement],
        "profile": PROFILE_NAME, "profile_written": args.write_profile,
        "results_md": _rel(Path(f"{args.out_prefix}.md")),
        "split_rule": TESTBED_SPLIT.rule, "fit_cells": len(fit_cells), "held_out_cells": len(held_cells),
        "setup": setup.__dict__, "seed": 0, "max_evals": args.max_evals, "min_rel_step": args.min_rel_step,
        "architecture": architecture(), "weights_gb": round(footprint(PRESETS[PRESET]).total_bytes / 1e9, 3),
        "acceptance": {agreement_key(a): dict(v) for a, v in sorted(acceptance.items())},
        "held_acceptance": HELD_ACCEPTANCE,
        "fitted": dict(steps), "held": dict(HELD_STEP), "fit_errors": dict(errors),
        "tolerances": {"throughput": THROUGHPUT_TOLERANCE, "accept_length": ACCEPT_TOLERANCE},
        "held_out": [ch.to_dict() for ch in held_checks], "held_out_summary": summarise(held_checks),
        "held_out_by_group": by_group(held_checks), "mtp_ratio_check": mtp_ratio_check(held_checks),
        "fit": [ch.to_dict() for ch in fit_checks], "fit_summary": summarise(fit_checks),
        "fit_by_group": by_group(fit_checks), "facts": facts, "one_run_noise": one_run_noise(landscapes, cells),
        "step_overlap": step_overlap(landscapes, profile, setup), "mtp_off_ttft_ms": mtp_off_ttft(landscapes),
        "per_concurrency_warmup": warmed_per_concurrency(landscapes),
        "structure_rule": STRUCTURE_RULE, "chosen_structure": chosen, "structures": dict(structures or {}),
    }
    r["findings"] = findings(r, facts)
    r["wall_s"] = round(time.time() - t0, 1)
    return r


def profile_notes(r: Mapping[str, Any]) -> str:
    held = r["held_out_summary"]
    return (
        f"The MoE testbed (python -m tuning.checkpoint.build --preset {PRESET}: Qwen3.5-35B-A3B per-layer shapes, 12 "
        "layers of which 3 gated full attention, 256 experts top-8, one MTP layer, constructed acceptance) on one H200 "
        "(tp=1), LMDeploy 0.18 PyTorch engine. Architecture counted from the preset's shape "
        "(tuning.checkpoint.footprint), not fitted. Fitted by docs/analyses/sim_fit/sim_fit_testbed.py on the FIT half of "
        f"{' + '.join(r['measurements'])} (MTP off and 1-4 draft tokens x concurrency 1/4/16/64/256 x T 0/0.8 x output "
        "128/512, input 512, each cell one closed-loop run of max(4, 2c) requests). Split, fixed before fitting: "
        f"{r['split_rule']} Fitted: acceptance per agreement level (accept_p0, accept_temperature_slope; the "
        "'acceptance' section is agreement " + str(r["default_agreement"]) + ", other levels under 'other_agreements'; "
        "accept_log_slope and accept_depth_penalty 0: the construction's per-draft acceptance is constant) and the "
        f"step constants {', '.join(r['fitted'])} (step structure {r.get('chosen_structure', 'additive')!r}, chosen "
        "on the FIT half: host_overlap is the share of the smaller of a decode step's host and GPU parts hidden "
        "behind the other, absent or 0 = added; sampling_overhead_ms the host time a decode step pays when any of "
        "its sequences samples, absent or 0 = none); held: routing_spread 1 and verify_route_novelty 1 (random router, "
        "independent tokens; issue #22's probe's expert counts agree), eff_prefill_flops 0.4. Held-out check "
        "(simulator's closed-loop benchmark vs ONE measured run per cell): throughput within ±10 % in "
        f"{held['throughput_pass']} of {held['cells']} cells (median |error| {held['median_abs_throughput_error']:.0%}, "
        f"worst {held['max_abs_throughput_error']:.0%}), accept length as counted within ±0.15 in {held['accept_pass']} "
        f"of {held['accept_cells']}. Details: {r['results_md']}. calibrated=false; a figure from this profile is "
        "SIMULATED, never a GPU measurement."
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m docs.analyses.sim_fit.sim_fit_testbed", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--measurement", type=Path, nargs="+", default=[MEASUREMENT],
                    help="measure_landscape.py landscape.json files (pooled by cell key; default: the committed one)")
    ap.add_argument("--profile", type=Path, default=PROFILE,
                    help="profile JSON to write with --write-profile")
    ap.add_argument("--out-prefix", type=Path, default=OUT_PREFIX, help="writes PREFIX.json and PREFIX.md")
    ap.add_argument("--write-profile", action="store_true",
                    help="store the fit (and its notes) in --profile; with --render, the stored result's fit")
    ap.add_argument("--render", type=Path, metavar="RESULT_JSON",
                    help="re-write the markdown beside a result JSON this script wrote, without fitting")
    ap.add_argument("--max-evals", type=int, default=2000, help="simulator evaluations of the step fit at most")
    ap.add_argument("--min-rel-step", type=float, default=0.02,
                    help="the step search stops below this share of each bound's width (smaller: slower, finer)")
    args = ap.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    if args.render:  # the notes are recomputed from the stored figures, the fit is not
        r = json.loads(args.render.read_text())
        landscapes = [json.loads((ROOT / m).read_text()) for m in r["measurements"]]
        r["one_run_noise"] = one_run_noise(landscapes, landscape_cells(landscapes, TESTBED_SPLIT))
        r["per_concurrency_warmup"] = warmed_per_concurrency(landscapes)
        r["facts"] = measurement_facts(landscape_cells(landscapes, TESTBED_SPLIT))
        if r.get("structures"):  # each structure's checks again from its stored constants (a second of simulation)
            acceptance = {float(a): v for a, v in r["acceptance"].items()}
            cells = landscape_cells(landscapes, TESTBED_SPLIT)
            r["structures"] = {name: structure_report(
                Profile.from_dict(build_profile(st["fitted"], acceptance, "", r["default_agreement"])), cells,
                WaveSetup(**r["setup"]), st["fitted"], st["fit_log_rms"], st["criterion"])
                for name, st in r["structures"].items()}
            chosen = r["structures"][r["chosen_structure"]]
            r["fit_summary"], r["held_out_summary"] = chosen["fit_summary"], chosen["held_out_summary"]
        r["findings"] = findings(r, r["facts"])
        r["profile_written"] = r.get("profile_written", False) or args.write_profile
        atomic_write_text(args.render, json.dumps(r, indent=1) + "\n")
        atomic_write_text(args.render.with_suffix(".md"), render_md(r))
        print(f"wrote {args.render} and {args.render.with_suffix('.md')}")
        if args.write_profile:  # the stored result's constants, with notes from the current code
            acceptance = {float(a): v for a, v in r["acceptance"].items()}
            data = build_profile(r["fitted"], acceptance, profile_notes(r), r["default_agreement"])
            atomic_write_text(args.profile, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            print(f"updated {args.profile}")
        return 0
    t0 = time.time()
    try:
        landscapes = [json.loads(p.read_text()) for p in args.measurement]
        setup = setup_of(landscapes)
        cells = landscape_cells(landscapes, TESTBED_SPLIT)
    except (OSError, ValueError, KeyError) as e:  # SimFitError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    fit_cells = [c for c in cells if not c.held_out]
    print(f"{len(cells)} measured cells: FIT {len(fit_cells)}, HELD-OUT {len(cells) - len(fit_cells)} "
          f"({TESTBED_SPLIT.rule})", flush=True)
    start = dict(START)  # never the stored profile's: a rerun of one measurement gives the same fit
    default_agreement = 0.7 if any(c.agreement == 0.7 for c in cells) else min(
        c.agreement for c in cells if c.agreement is not None)
    # a starting profile: counted architecture, stated hardware, the search's start
    base = Profile.from_dict(build_profile(start, {default_agreement: {"accept_p0": 0.7, "accept_temperature_slope": 2.0}},
                                           "fit in progress", default_agreement))
    def say(message: str) -> None:
        print(message, flush=True)

    print("fitting acceptance per agreement level on FIT ...", flush=True)
    acceptance, errors = fit_acceptance_levels(base, fit_cells, progress=say)
    kw = {"max_evals": args.max_evals, "min_rel_step": args.min_rel_step, "progress": say}
    say("structure 'additive' (host overhead + GPU time):")
    additive, additive_rms = fit_steps(base, fit_cells, setup, acceptance, step_bounds=STRUCTURES["additive"], **kw)
    say(f"  {additive} (FIT log-RMS {additive_rms:.4f})")
    say(f"structure 'overlap' (host_overlap fitted, search from {OVERLAP_START}):")
    overlap, overlap_rms = fit_overlap_structure(base, fit_cells, setup, acceptance, additive, additive_rms, **kw)
    say(f"  {overlap} (FIT log-RMS {overlap_rms:.4f})")
    say("structure 'overlap+sampling' (sampling_overhead_ms fitted, search from the overlap fit):")
    sampling, sampling_rms = fit_sampling_structure(base, fit_cells, setup, acceptance, overlap, overlap_rms, **kw)
    say(f"  {sampling} (FIT log-RMS {sampling_rms:.4f})")
    fits = {"additive": (additive, additive_rms), "overlap": (overlap, overlap_rms),
            "overlap+sampling": (sampling, sampling_rms)}
    chosen, criteria = choose_structure({k: v[1] for k, v in fits.items()}, len(fit_cells))
    say(f"chosen on FIT: {chosen!r} (criterion {criteria}; lower is better)")
    print("checking every cell under every structure ...", flush=True)
    structures = {name: structure_report(Profile.from_dict(build_profile(st, acceptance, "", default_agreement)),
                                         cells, setup, st, rms, criteria[name])
                  for name, (st, rms) in fits.items()}
    steps, errors = fits[chosen][0], {**errors, "throughput_log_rms": fits[chosen][1]}
    data = build_profile(steps, acceptance, "", default_agreement)
    profile = Profile.from_dict(data)
    r = result_of(args, given, landscapes, cells, setup, acceptance, steps, errors, profile, t0, structures, chosen)
    r["default_agreement"] = default_agreement
    data["notes"] = profile_notes(r)
    args.out_prefix.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(f"{args.out_prefix}.json"), json.dumps(r, indent=1) + "\n")
    atomic_write_text(Path(f"{args.out_prefix}.md"), render_md(r))
    if args.write_profile:
        atomic_write_text(args.profile, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    h = r["held_out_summary"]
    for name, st in structures.items():
        fs, hs = st["fit_summary"], st["held_out_summary"]
        print(f"{name}: FIT log-RMS {st['fit_log_rms']:.4f}, criterion {st['criterion']:.1f}, FIT ±10 % "
              f"{fs['throughput_pass']}/{fs['cells']}; held-out ±10 % {hs['throughput_pass']}/{hs['cells']}, accept "
              f"{hs['accept_pass']}/{hs['accept_cells']}" + ("  <- chosen on FIT" if name == chosen else ""))
    print(f"\nHELD-OUT, {chosen} (SIMULATED vs one measured run per cell): throughput within ±10 % in "
          f"{h['throughput_pass']}/{h['cells']} cells (median |error| {h['median_abs_throughput_error']:.0%}), accept "
          f"length as counted within ±0.15 in {h['accept_pass']}/{h['accept_cells']}.")
    print(f"wrote {args.out_prefix}.json and .md" + (f"; updated {args.profile}" if args.write_profile else ""))
    print("next: python -m pytest -q tests/unit/test_sim_fit_testbed.py" if args.write_profile else
          f"next: python -m docs.analyses.sim_fit.sim_fit_testbed {' '.join(given)} --write-profile   (store this fit in the profile)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
