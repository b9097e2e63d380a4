"""``python -m orchestrator.sim``: run the simulated engine. It takes the flags of the engine it stands in
for: LMDeploy's ``serve api_server`` names, or with ``--backend vllm`` vLLM's ``serve`` names (so the
command a vLLM config renders is the one tested), and serves that engine's metric names.

Exit codes: 0 clean stop; 1 out of memory at start (real or ``--fault oom-at-start``); 2 bad flags
or profile (speculation with ``--backend turbomind`` included: EngineConfig refuses it too); 3 ``--fault
crash-at-start``; 137 ``--fault crash-after:S``.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time

from orchestrator.sim.gpu_share import SHARED_GPU_ENV, SharedGpu
from orchestrator.sim.model import (
    DEFAULT_PROFILE,
    SIM_BACKENDS,
    EngineParams,
    SimModelError,
    SimOutOfMemory,
    load_profile,
)
from orchestrator.sim.noise import EngineNoise

FAULT_KINDS = ("none", "crash-at-start", "never-ready", "oom-at-start", "crash-after", "hang-after")
log = logging.getLogger("orchestrator.sim")


def _fault(value: str) -> str:
    kind, sep, arg = value.partition(":")
    if kind not in FAULT_KINDS:
        raise argparse.ArgumentTypeError(f"unknown fault {value!r}; allowed: none, crash-at-start, never-ready, "
                                         "oom-at-start, crash-after:SECONDS, hang-after:SECONDS")
    if kind in ("crash-after", "hang-after"):
        try:
            if float(arg) < 0:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"{kind} needs non-negative simulated seconds, e.g. {kind}:30") from None
    elif sep:
        raise argparse.ArgumentTypeError(f"fault {kind!r} takes no argument")
    return value


_VLLM_MTP_METHODS = ("mtp", "qwen3_5_mtp")  # vLLM rewrites the second to the first


def _speculative_config(value: str) -> dict:
    """vLLM's ``--speculative-config`` as the simulator understands it: MTP with N draft tokens."""
    try:
        spec = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--speculative-config is not JSON ({exc}): {value!r}") from None
    if not isinstance(spec, dict) or spec.get("method") not in _VLLM_MTP_METHODS:
        raise argparse.ArgumentTypeError(f"--speculative-config must set method to one of {list(_VLLM_MTP_METHODS)} "
                                         f"(the simulator has MTP only), got {value!r}")
    n = spec.get("num_speculative_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise argparse.ArgumentTypeError(f"--speculative-config needs num_speculative_tokens >= 1, got {value!r}")
    unknown = sorted(set(spec) - {"method", "num_speculative_tokens", "num_speculative_tokens_per_batch_size"})
    if unknown:
        raise argparse.ArgumentTypeError(f"--speculative-config keys {unknown} are not simulated; the simulator takes "
                                         "method, num_speculative_tokens, num_speculative_tokens_per_batch_size")
    if "num_speculative_tokens_per_batch_size" in spec:
        from orchestrator.backends.vllm import check_draft_schedule
        from orchestrator.errors import ConfigError

        try:
            spec["num_speculative_tokens_per_batch_size"] = check_draft_schedule(
                spec["num_speculative_tokens_per_batch_size"], n)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(f"--speculative-config: {exc}") from None
    return spec


_VLLM_DESTS = ("tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs", "max_model_len",
               "max_num_batched_tokens", "generation_config", "speculative_config")
_LMDEPLOY_DESTS = {"tp": None, "cache_max_entry_count": 0.8, "max_batch_size": None, "session_len": None,
                   "max_prefill_token_num": 8192, "speculative_algorithm": None,
                   "speculative_num_draft_tokens": None}


def _engine_settings(args: argparse.Namespace) -> argparse.Namespace:
    """The LMDeploy-named settings the model takes, from the flags of the engine simulated. Mixing the
    two engines' names is an error: a simulated engine takes only what its engine would."""
    given_vllm = [d for d in _VLLM_DESTS if getattr(args, d) is not None]
    if args.backend != "vllm":
        if given_vllm:
            raise ValueError(f"vLLM flags {['--' + d.replace('_', '-') for d in given_vllm]} need --backend vllm")
        return argparse.Namespace(**vars(args), draft_schedule=None)
    given_lmdeploy = [d for d, default in _LMDEPLOY_DESTS.items() if getattr(args, d) != default]
    if given_lmdeploy:
        raise ValueError(f"--backend vllm takes vLLM's flag names, not LMDeploy's "
                         f"{['--' + d.replace('_', '-') for d in given_lmdeploy]}")
    spec = args.speculative_config
    return argparse.Namespace(**{
        **vars(args), "tp": args.tensor_parallel_size,
        "cache_max_entry_count": args.gpu_memory_utilization if args.gpu_memory_utilization is not None else 0.9,
        "max_batch_size": args.max_num_seqs, "session_len": args.max_model_len,
        "max_prefill_token_num": args.max_num_batched_tokens or 8192,
        "speculative_algorithm": "qwen3_5_mtp" if spec else None,
        "speculative_num_draft_tokens": spec["num_speculative_tokens"] if spec else None,
        "draft_schedule": (spec or {}).get("num_speculative_tokens_per_batch_size"),
    })


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator.sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="profile name (orchestrator/sim/profiles) or JSON path")
    p.add_argument("--backend", default="pytorch", choices=SIM_BACKENDS,
                   help="the engine simulated (the profile's constants for it; turbomind: no speculation; vllm: "
                   "vLLM's flag and metric names)")
    p.add_argument("--server-name", default="127.0.0.1")
    p.add_argument("--server-port", type=int, default=23333)
    p.add_argument("--model-name", default=None, help="served model name (default: the profile name)")
    p.add_argument("--tp", type=int, default=None, help="GPUs (default: the profile's)")
    p.add_argument("--cache-max-entry-count", type=float, default=0.8, help="share of free GPU memory for KV cache")
    p.add_argument("--max-batch-size", type=int, default=None)
    p.add_argument("--session-len", type=int, default=None)
    p.add_argument("--max-prefill-token-num", type=int, default=8192)
    p.add_argument("--speculative-algorithm", default=None, choices=["qwen3_5_mtp"])
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    v = p.add_argument_group("vLLM's names of the same settings (--backend vllm only)")
    v.add_argument("--tensor-parallel-size", type=int, default=None)
    v.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's share of the whole GPU; simulated as the KV share of the memory left after the "
                   "weights, as --cache-max-entry-count (a simplification: the same figure gives vLLM less KV)")
    v.add_argument("--max-num-seqs", type=int, default=None)
    v.add_argument("--max-model-len", type=int, default=None)
    v.add_argument("--max-num-batched-tokens", type=int, default=None)
    v.add_argument("--generation-config", default=None, choices=["vllm"],
                   help="only 'vllm' (vLLM's own sampling defaults) is simulated")
    v.add_argument("--speculative-config", type=_speculative_config, default=None,
                   help='JSON, e.g. {"method": "mtp", "num_speculative_tokens": 3}')
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--fault", type=_fault, default="none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-delay", type=float, default=0.0, help="simulated seconds before serving")
    n = p.add_argument_group("run-to-run variation (off by default; the figures stay simulated)")
    n.add_argument("--noise-start-sd", type=float, default=0.0,
                   help="log sd of a factor on every iteration's time, drawn once per engine start")
    n.add_argument("--noise-sd", type=float, default=0.0,
                   help="log sd of a factor on iteration time drawn afresh every --noise-window-s")
    n.add_argument("--noise-window-s", type=float, default=5.0, help="simulated seconds one such factor lasts")
    n.add_argument("--noise-seed", type=int, default=None,
                   help="fixed draws, the same for every engine (default: fresh at every start, as two GPU "
                   "starts differ)")
    p.add_argument("--shared-gpu", metavar="DIR", default=os.environ.get(SHARED_GPU_ENV) or None,
                   help="share one GPU with the simulated engines given the same directory: each iteration takes "
                   f"as many times longer as engines are busy on it (time-slicing; default: ${SHARED_GPU_ENV})")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args = _engine_settings(args)
    except ValueError as exc:
        print(f"python -m orchestrator.sim: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stdout,
                        format="%(asctime)s %(levelname)s sim: %(message)s")
    if args.time_scale <= 0:
        log.error("--time-scale must be > 0, got %s", args.time_scale)
        return 2
    fault = args.fault
    log.info("simulated engine starting (NOT a GPU): profile=%s backend=%s fault=%s time_scale=%g", args.profile,
             args.backend, fault, args.time_scale)
    if fault == "crash-at-start":
        log.error("simulated fault crash-at-start: exiting with code 3 before serving")
        return 3
    if fault == "oom-at-start":
        log.error("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (simulated fault "
                  "oom-at-start)")
        return 1
    if args.speculative_algorithm and not args.speculative_num_draft_tokens:
        log.error("--speculative-algorithm needs --speculative-num-draft-tokens N (N >= 1)")
        return 2
    n_draft = (args.speculative_num_draft_tokens or 0) if args.speculative_algorithm else 0
    try:
        profile = load_profile(args.profile)
        params = EngineParams(tp=args.tp or profile.num_gpus, num_draft_tokens=n_draft,
                              memory_fraction=args.cache_max_entry_count, max_batch_size=args.max_batch_size,
                              session_len=args.session_len, max_prefill_tokens=args.max_prefill_token_num,
                              backend=args.backend,
                              draft_schedule=args.draft_schedule)
        from orchestrator.sim.server import SimEngine  # aiohttp import only when serving

        asyncio.set_event_loop(loop := asyncio.new_event_loop())
        noise = EngineNoise(start_sd=args.noise_start_sd, sd=args.noise_sd, window_s=args.noise_window_s,
                            seed=args.noise_seed)
        engine = SimEngine(profile, params, time_scale=args.time_scale, seed=args.seed, model_name=args.model_name,
                           noise=noise, shared_gpu=SharedGpu(args.shared_gpu) if args.shared_gpu else None)
    except SimOutOfMemory as exc:
        log.error("torch.OutOfMemoryError: %s", exc)
        return 1
    except (SimModelError, ValueError) as exc:  # ValueError: a noise setting out of range
        log.error("%s", exc)
        return 2
    log.info("engine: %s", engine.model.describe())
    if engine.noise:
        log.info("simulated run-to-run variation: %s", dataclasses.asdict(engine.noise))
    if fault == "never-ready":
        log.warning("simulated fault never-ready: process stays alive and never serves")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        while True:
            time.sleep(3600)
    if args.startup_delay > 0:
        time.sleep(args.startup_delay / args.time_scale)
    return loop.run_until_complete(_serve(engine, args.server_name, args.server_port, fault))


async def _serve(engine, host: str, port: int, fault: str) -> int:  # noqa: ANN001
    from aiohttp import web

    from orchestrator.sim.server import build_app, fault_task

    runner = web.AppRunner(build_app(engine), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot bind %s:%s: %s; pick a free --server-port", host, port, exc)
        await runner.cleanup()
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = fault_task(engine, fault)
    if task is not None:
        loop.create_task(task)
    log.info("serving the simulated engine on http://%s:%s (model %r)", host, port, engine.model_name)
    await stop.wait()
    log.info("stopping")
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
