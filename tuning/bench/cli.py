"""``python -m tuning.bench``: benchmark a server, or a simulated engine started for the run."""
from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import DEFAULT_PROFILE
from tuning.bench.display import RichProgress, summary_table
from tuning.bench.errors import ServerUnreachableError
from tuning.bench.runner import benchmark
from tuning.bench.steady import SteadyStateRule
from tuning.workload import Workload, resolve_token_counter

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__ = ["main"]

logger = logging.getLogger(__name__)




def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuning.bench",
        description=(
            "Benchmark an OpenAI-compatible LLM server like sglang.bench_serving (TTFT, ITL, TPOT, E2E, "
            "throughput, MTP accept length). Without --base-url, starts the simulated engine and benchmarks it."
        ),
    )
    a = p.add_argument
    a("--base-url", help="server to benchmark, e.g. http://127.0.0.1:23333; omit to start a simulated engine (--sim)")
    a("--sim", action="store_true", help="start a simulated engine (profile %s, tp 8, MTP with 3 draft tokens) and benchmark it; the default without --base-url" % DEFAULT_PROFILE)
    a("--sim-time-scale", type=float, default=20.0, help="simulated engine speed-up over real time (figures are reported in simulated time; default 20)")
    a("--sim-no-mtp", action="store_true", help="start the simulated engine without speculative decoding (baseline)")
    a("--sim-log-dir", default=None, help="folder for the simulated engine's log (default: a temporary folder)")
    a("--backend-api", choices=["completions", "chat"], default="completions", help="endpoint: /v1/completions or /v1/chat/completions (default completions)")
    a("--model", default=None, help="model name sent in requests (default: the first model GET /v1/models lists)")
    a("--dataset", choices=["random", "sharegpt"], default="random", help="prompt source (default random: real text cut to drawn lengths)")
    a("--dataset-path", default=None, help="ShareGPT JSON file (for --dataset sharegpt)")
    a("--sharegpt-output-len", choices=["fixed", "dataset"], default="fixed", help="ShareGPT output length: --random-output-len for every request (fixed) or the gpt turn's length (dataset)")
    a("--random-input-len", type=int, default=1024, help="max input tokens per request (random); max prompt length kept (sharegpt) (default 1024)")
    a("--random-output-len", type=int, default=1024, help="max output tokens per request (default 1024)")
    a("--random-range-ratio", type=float, default=0.5, help="lengths are drawn uniformly in [ratio*len, len] (default 0.5)")
    a("--num-prompts", type=int, default=256, help="requests measured (default 256)")
    a("--max-concurrency", type=int, default=64, help="requests in flight at most; 0 = unbounded (default 64)")
    a("--request-rate", type=float, default=math.inf, help="Poisson arrival rate in requests/s; inf = all at once (default inf)")
    a("--warmup-requests", type=int, default=1, help="requests sent before measuring, not counted (default 1)")
    a("--temperature", type=float, default=0.0, help="sampling temperature (default 0)")
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True, help="generate exactly the requested output length (default on)")
    a("--seed", type=int, default=0, help="seed of the dataset draw, prompt text and arrivals (default 0)")
    a("--tokenizer", default=None, help="model dir or tokenizer.json to count tokens with (default: the simulator's word tokenizer)")
    a("--num-draft-tokens", type=int, default=None, help="draft tokens per step N for the accept length (default: from the engine's counters)")
    a("--steady-state-tolerance", type=float, default=None, help="stop early once steady-state output throughput is known within this relative 95%% CI half-width (e.g. 0.02); off by default")
    a("--steady-state-window", type=float, default=5.0, help="steady-state window length in server seconds (default 5)")
    a("--request-timeout", type=float, default=3600.0, help="per-request wall-clock timeout in seconds (default 3600)")
    a("--name", default="", help="workload (bucket) name recorded in the result")
    a("--output", default=None, help="write the BenchResult JSON to this file")
    a("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    a("--quiet", action="store_true", help="no progress bar or summary table (the JSON still goes to --output)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 when the server cannot be reached or inputs are invalid)."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console

    console = Console(stderr=True)
    try:
        workload = Workload(
            dataset=args.dataset,
            input_len=args.random_input_len,
            output_len=args.random_output_len,
            range_ratio=args.random_range_ratio,
            num_prompts=args.num_prompts,
            max_concurrency=args.max_concurrency or None,
            request_rate=args.request_rate,
            temperature=args.temperature,
            seed=args.seed,
            api=args.backend_api,
            ignore_eos=args.ignore_eos,
            warmup_requests=args.warmup_requests,
            sharegpt_path=args.dataset_path,
            sharegpt_output_len=args.sharegpt_output_len,
            name=args.name,
        )
        rule = (
            SteadyStateRule(rel_tolerance=args.steady_state_tolerance, window_s=args.steady_state_window)
            if args.steady_state_tolerance is not None
            else None
        )
        tokenizer = resolve_token_counter(args.tokenizer)
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    progress = None if args.quiet else RichProgress(description=workload.name or "benchmark", console=console)
    kwargs: dict[str, Any] = dict(
        model=args.model,
        tokenizer=tokenizer,
        steady_state=rule,
        progress=progress,
        request_timeout_s=args.request_timeout,
        api_key=args.api_key,
        num_draft_tokens=args.num_draft_tokens,
    )
    engine = None
    try:
        if args.base_url and not args.sim:
            base_url = args.base_url
        else:
            engine, engine_config = _start_sim_engine(args, console)
            base_url = engine.base_url
            kwargs["engine_config"] = engine_config
        result = benchmark(base_url, workload, **kwargs)
    except ServerUnreachableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OrchestratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if engine is not None:
            engine.stop()

    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.to_json() + "\n", encoding="utf-8")
    if not args.quiet:
        try:
            Console().print(summary_table(result))
        except Exception:  # noqa: BLE001 - the display never fails the run
            logger.exception("could not render the summary table")
    if not args.output:
        print(result.to_json())
    return 0


def _start_sim_engine(args: argparse.Namespace, console: Any) -> tuple[Any, EngineConfig]:
    """Start the simulated engine for ``--sim`` (lazy imports: the engine package is optional here)."""
    import tempfile

    from orchestrator.config import EngineConfig
    from orchestrator.engine import EngineProcess

    spec = {} if args.sim_no_mtp else {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 3}
    config = EngineConfig(backend="sim", model=DEFAULT_PROFILE, tp=8, **spec)
    log_dir = args.sim_log_dir or tempfile.mkdtemp(prefix="bench-sim-")
    engine = EngineProcess(config, sim_time_scale=args.sim_time_scale, log_dir=log_dir)
    if not args.quiet:
        console.print(f"starting the simulated engine ({config.label()}, time scale {args.sim_time_scale:g}); log in {log_dir}")
    engine.start()
    try:
        engine.wait_until_ready()
    except BaseException:
        engine.stop()
        raise
    return engine, config
