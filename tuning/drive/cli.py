"""``python -m tuning.drive``: drive an OpenAI-compatible server with a traffic mix under a load profile
and report goodput per phase."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import OrchestratorError
from tuning.drive.report import MLPERF_SERVER_SLO, Slo, overall_figures, phase_figures
from tuning.drive.runner import run_drive
from tuning.drive.summary import kept_schedule, report_lines
from tuning.traffic import load_mix, load_profile

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuning.drive",
        description="Drive an OpenAI-compatible server (the Serve router of a routing table, or one engine) with a "
                    "traffic mix (request classes: max_tokens x temperature x share) under a load profile (in-flight "
                    "requests over time: steady phases, ramps, bursts); report goodput and throughput per phase. "
                    "Simulated servers are labelled SIMULATED and their figures are in simulated time.")
    a = p.add_argument
    a("--base-url", required=True, help="server without /v1, e.g. http://127.0.0.1:8000")
    a("--mix", required=True, help="traffic mix file (YAML/JSON, see tuning/traffic.py)")
    a("--profile", required=True, help="load profile file (YAML/JSON: phases of seconds with concurrency or ramp_to)")
    a("--seed", type=int, default=0, help="seed of the class draw, prompt lengths and texts (default 0)")
    a("--input-len", type=int, default=1024, help="max prompt tokens, drawn in [0.5x, 1x] (default 1024)")
    a("--slo-ttft-s", type=float, default=MLPERF_SERVER_SLO.ttft_s,
      help=f"a good request's TTFT bound in seconds (default {MLPERF_SERVER_SLO.ttft_s:g}: MLPerf's Llama-2-70B server)")
    a("--slo-tpot-ms", type=float, default=MLPERF_SERVER_SLO.tpot_s * 1000,
      help=f"a good request's TPOT bound in ms (default {MLPERF_SERVER_SLO.tpot_s * 1000:g}: MLPerf's Llama-2-70B server)")
    a("--drain-s", type=float, default=600.0,
      help="seconds (profile clock) requests still running at the profile's end may take before they are cancelled")
    a("--api-key", default=None, help="Bearer key of the server")
    a("--model", default=None, help="model name to send (default: the first one /v1/models lists)")
    a("--tokenizer", default=None, help="model dir or tokenizer.json for prompts (default: the simulator's words)")
    a("--out", default=None, help="write the records, figures and settings as JSON here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        slo = Slo(ttft_s=args.slo_ttft_s, tpot_s=args.slo_tpot_ms / 1000)
        mix, profile = load_mix(args.mix), load_profile(args.profile)
    except (OrchestratorError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def on_phase(i: int, label: str, in_flight: int, started: int, finished: int) -> None:
        print(f"[drive] phase {i} {label}: {in_flight} in flight, {started} started, {finished} finished",
              file=sys.stderr, flush=True)

    print(f"[drive] {profile.seconds:g} s profile ({len(profile.phases)} phases), {len(mix.classes)} request "
          f"classes, seed {args.seed}", file=sys.stderr, flush=True)
    try:
        result = run_drive(args.base_url, mix, profile, api_key=args.api_key, model=args.model, seed=args.seed,
                           input_len=args.input_len, tokenizer=args.tokenizer, drain_s=args.drain_s,
                           on_phase=on_phase)
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    for line in report_lines(result, slo):
        print(line)
    if args.out:
        out = {"slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
               "phases": [f.__dict__ for f in phase_figures(result.records, profile, slo)],
               "overall": overall_figures(result.records, profile, slo).__dict__,
               "kept_schedule": kept_schedule(result.lateness, profile) if result.simulated else None,
               **result.to_dict()}
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"records: {args.out}")
    print("next: drive another deployment with the same --mix, --profile and --seed to compare, e.g. "
          "benchmarks/mixed_payoff.py for a routing table against each of its configs alone")
    return 0
