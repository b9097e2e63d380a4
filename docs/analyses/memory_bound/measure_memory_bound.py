"""LMDeploy MTP off vs on at realistic per-layer shapes, where decode should be memory-bound: the
decode step time against the floor ``weight bytes read per step / HBM bandwidth``.

    source benchmarks/gpu/staging/device_env.sh                      # on the lent H200, after the wheels
    python -m docs.analyses.memory_bound.measure_memory_bound --out $OUT --deadline-s 420
    python -m docs.analyses.memory_bound.measure_memory_bound --render RESULTS.json > RESULTS.md   # anywhere
    python -m docs.analyses.memory_bound.measure_memory_bound --build-only --device cpu --layers 4 \\
        --hidden 256 --inter 512 --vocab 4096 --tok-vocab 1024 --out /tmp/mb          # CPU check

What it does, in one call:

1. HBM bandwidth, measured with torch on the same GPU: a 4 GiB device-to-device copy (bytes read +
   written / time) and a 4 GiB read-only reduction (``sum``; bytes read / time). The vendor's
   4.8 TB/s is the other yardstick.
2. Two checkpoints with :mod:`tuning.checkpoint.build` (its ``make_config`` / ``make_weights`` /
   ``train_tokenizer``, the layout LMDeploy 0.18 loads), at per-layer shapes of a 7-9B-class
   Qwen3.5 (defaults: hidden 4096, MLP 12288, 16 query / 4 KV heads of dim 256 with output gate,
   gated delta-net with 16 key / 32 value heads of dim 128, every 4th layer full attention, 8
   layers, vocabulary padded to 151936): ``--oracle`` (the MTP head always agrees: 100 %
   acceptance) and random (0 %). The weights are drawn on the GPU (``make_weights`` under a CUDA
   default device and a CUDA generator) and saved with safetensors. One tokenizer (byte-level BPE,
   ``--tok-vocab`` entries) serves both; the rows of ``lm_head`` past the tokenizer's vocabulary
   are zeroed so every generated id decodes, while the matrix read per step keeps its full size.
3. LMDeploy engines (PyTorch backend, ``--language-model-only``) through
   :class:`orchestrator.engine.EngineProcess`: MTP off and ``qwen3_5_mtp`` with N draft tokens, on
   each checkpoint. ``--start parallel`` (default) starts them all at once (start-up is compilation
   and CUDA-graph capture; on a fresh machine the first start costs ~150 s, so overlapping saves
   minutes) and measures them ONE AT A TIME: the others sit idle (no GPU work, ~25 % of a CPU core
   each) and every engine is stopped right after its cells. ``--start sequential`` starts, measures
   and stops one engine at a time (cleaner, but each start costs ~60-150 s).
4. Per engine and concurrency: the project's bench client (:func:`tuning.bench.benchmark`),
   ``random`` dataset (real text cut to exactly ``--input-len`` tokens), exactly ``--output-len``
   output tokens (``ignore_eos``, temperature 0), one wave of ``concurrency`` requests
   (``--c1-requests`` one after the other at concurrency 1). Output throughput, TPOT median/mean,
   accept length (bench client, and from ``/metrics`` deltas here).
5. Decode step time = TPOT median x accept length (MTP off: accept length 1) against the floor
   ``bytes / bandwidth`` where bytes = the target's weights read once per step (decoder layers,
   final norm, ``lm_head``; the embedding is a gather) plus, with MTP, N draft passes each reading
   the MTP layer, its ``fc`` and norms, and ``lm_head`` again. KV-cache and recurrent-state traffic
   is not in the floor (estimated separately in the JSON).

Writes ``gpu_memory_bound.json`` to ``--out`` after every step (a deadline keeps what was
measured), ``engine_log_tails.txt`` at the end, and prints the markdown report.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]

SPEC_TBPS = 4.8
"""H200 HBM3e bandwidth by the vendor's datasheet, TB/s."""

CONFIG_LABELS = ("off", "mtp3", "mtp3_rand", "off_rand", "mtp1", "mtp1_rand")
"""Engines in measuring order: the essential comparison first. ``_rand`` = the random (0 %)
checkpoint, otherwise the oracle (100 %) one."""


def log(msg: str) -> None:
    print(f"[mb {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----- bandwidth ---------------------------------------------------------------------------------------------
def measure_bandwidth(gib: float = 4.0, iters: int = 20) -> dict[str, Any]:
    """Device-to-device copy (read + write bytes / time) and a read-only reduction (read bytes /
    time), each the median of ``iters`` timed runs after warm-up, with CUDA events."""
    import torch

    n = int(gib * (1 << 30)) // 2
    src = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()

    def timed(fn) -> list[float]:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        return sorted(out)

    copy_t = timed(lambda: dst.copy_(src))  # noqa: F821 (ruff reads the del below as the lambdas')
    sum_t = timed(lambda: src.sum(dtype=torch.float32))  # noqa: F821
    med = lambda xs: xs[len(xs) // 2]
    res = {"buffer_bytes": nbytes, "iters": iters,
           "copy_tbps_read_plus_write": 2 * nbytes / med(copy_t) / 1e12,
           "copy_tbps_best": 2 * nbytes / copy_t[0] / 1e12,
           "read_sum_tbps": nbytes / med(sum_t) / 1e12,
           "read_sum_tbps_best": nbytes / sum_t[0] / 1e12}
    del src, dst
    torch.cuda.empty_cache()
    return res


# ----- checkpoints -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _torch_default_device(device: str):
    """Run :func:`tuning.checkpoint.build.make_weights` on ``device``: default device, and its
    ``torch.Generator()`` created there (it seeds a generator of its own)."""
    import torch

    if device == "cpu":
        yield
        return
    orig = torch.Generator
    torch.set_default_device(device)
    torch.Generator = lambda *a, **k: orig(device=device)  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        torch.Generator = orig  # type: ignore[misc]
        torch.set_default_device(None)


def shape_from(a: argparse.Namespace):
    from tuning.checkpoint.build import ModelShape

    return ModelShape(hidden_size=a.hidden, num_layers=a.layers, vocab_size=a.vocab, intermediate_size=a.inter,
                      num_heads=a.heads, num_kv_heads=a.kv_heads, head_dim=a.head_dim,
                      linear_num_key_heads=a.lin_k_heads, linear_num_value_heads=a.lin_v_heads,
                      linear_head_dim=a.lin_head_dim)


def build_tokenizer(tok_dir: Path, vocab: int, nbytes: int):
    from tuning.checkpoint.tokenizer import collect_source_files, train_tokenizer

    files = collect_source_files(None, max_bytes=nbytes, split="train")
    tok_dir.mkdir(parents=True, exist_ok=True)
    return train_tokenizer(tok_dir, files, vocab)


def weight_groups(weights: dict[str, Any]) -> dict[str, int]:
    """Bytes of each group of tensors that matters for the floor."""
    g = {"decoder_layers": 0, "final_norm": 0, "lm_head": 0, "embed_tokens": 0, "mtp": 0, "vision": 0, "other": 0}
    for k, v in weights.items():
        b = v.numel() * v.element_size()
        if k.startswith("model.language_model.layers."):
            g["decoder_layers"] += b
        elif k == "model.language_model.norm.weight":
            g["final_norm"] += b
        elif k == "lm_head.weight":
            g["lm_head"] += b
        elif k == "model.language_model.embed_tokens.weight":
            g["embed_tokens"] += b
        elif k.startswith("mtp."):
            g["mtp"] += b
        elif k.startswith("model.visual."):
            g["vision"] += b
        else:
            g["other"] += b
    g["total"] = sum(g.values())
    return g


def build_one(out_dir: Path, shape, tok_dir: Path, tok_info, *, oracle: bool, device: str, seed: int) -> dict[str, Any]:
    """One checkpoint: config + tokenizer files copied from ``tok_dir`` + weights drawn on ``device``."""
    import torch

    from tuning.checkpoint.build import (
        make_config,
        make_weights,
        save_weights,
        write_checkpoint_files,
    )

    t0 = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tok_dir / f, out_dir / f)
    vocab = max(shape.vocab_size, (tok_info.vocab_size + 63) // 64 * 64)
    config = make_config(shape, vocab, tok_info.special_ids)
    write_checkpoint_files(out_dir, config, tok_info.special_ids)
    with _torch_default_device(device):
        w = make_weights(config, oracle=oracle, seed=seed)
        # Rows past the tokenizer's vocabulary: zero, so greedy picks a decodable id (the max of
        # thousands of real logits is positive); the matrix keeps its full size (read every step).
        w["lm_head.weight"][tok_info.vocab_size:] = 0
    if device != "cpu":
        torch.cuda.synchronize()
    t_gen = time.monotonic() - t0
    w = {k: v.cpu() for k, v in w.items()}
    groups = weight_groups(w)
    params = sum(v.numel() for v in w.values())
    t_cpu = time.monotonic() - t0
    save_weights(out_dir, w)
    del w
    if device != "cpu":
        torch.cuda.empty_cache()
    return {"dir": str(out_dir), "oracle": oracle, "device": device, "parameters": params, "bytes": groups, "vocab": vocab,
            "tokenizer_vocab": tok_info.vocab_size, "seconds_generate": round(t_gen, 2),
            "seconds_to_cpu": round(t_cpu - t_gen, 2), "seconds_total": round(time.monotonic() - t0, 2),
            "file_bytes": (out_dir / "model.safetensors").stat().st_size,
            "text_config": {k: v for k, v in config["text_config"].items() if k != "layer_types"},
            "layer_types": config["text_config"]["layer_types"]}


def step_bytes(groups: dict[str, int], n_draft: int) -> dict[str, int]:
    """Weight bytes read per decode step: the target once (verification of N+1 tokens reads each
    matrix once), plus N draft passes of the MTP head (each reads its layer, ``fc``, norms and the
    shared ``lm_head``)."""
    target = groups["decoder_layers"] + groups["final_norm"] + groups["lm_head"]
    draft = groups["mtp"] + groups["lm_head"]
    return {"target": target, "draft_per_pass": draft, "total": target + n_draft * draft}


def state_bytes_estimate(tc: dict[str, Any], concurrency: int, context: int) -> dict[str, float]:
    """Rough per-step bytes of KV cache (bf16, full-attention layers + the MTP layer, read) and
    gated-delta-net recurrent state (fp32 assumed, read + written), for the report only."""
    full = sum(1 for t in tc.get("layer_types", []) if t == "full_attention") + tc.get("mtp_num_hidden_layers", 1)
    lin = sum(1 for t in tc.get("layer_types", []) if t == "linear_attention")
    kv = full * 2 * tc["num_key_value_heads"] * tc["head_dim"] * 2 * context * concurrency
    state = lin * tc["linear_num_value_heads"] * tc["linear_key_head_dim"] * tc["linear_value_head_dim"] * 4 * 2 * concurrency
    return {"kv_bytes": kv, "recurrent_state_bytes": state, "context_tokens": context, "concurrency": concurrency}


# ----- engines -----------------------------------------------------------------------------------------------
def engine_config(label: str, ckpts: dict[str, str], a: argparse.Namespace):
    from orchestrator.config import EngineConfig

    ckpt = ckpts["random" if label.endswith("_rand") else "oracle"]
    if a.sim_profile:  # dry run of this script's flow against the simulated engine (no GPU figures)
        base = EngineConfig(backend="sim", model=a.sim_profile, memory_fraction=a.mem, max_batch_size=a.max_batch_size)
    else:
        base = EngineConfig(backend="pytorch", model=ckpt, memory_fraction=a.mem, max_batch_size=a.max_batch_size,
                        session_len=a.session_len, max_prefill_tokens=a.max_prefill,
                        extra_flags=("--language-model-only",))
    name = label.removesuffix("_rand")
    if name == "off":
        return base
    return base.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=int(name.removeprefix("mtp")))


def new_engine(cfg, log_dir: Path, ready_timeout_s: float, sim_time_scale: float | None = None):
    from orchestrator.engine import EngineProcess
    from orchestrator.errors import PreflightError

    eng = EngineProcess(cfg, log_dir=log_dir, ready_timeout_s=ready_timeout_s, sim_time_scale=sim_time_scale)
    note = None
    try:
        eng.start()
    except PreflightError as e:
        note = f"preflight failed ({str(e)[:300]}); started without it"
        eng = EngineProcess(cfg, log_dir=log_dir, ready_timeout_s=ready_timeout_s, preflight=False,
                            sim_time_scale=sim_time_scale)
        eng.start()
    return eng, note


def warm_up(base_url: str, prompt: str, n: int = 2) -> None:
    """``n`` short greedy completions of a prompt of the measured length: the first requests of a
    fresh server pay for lazy set-up (in the 2026-11-29 run a 12-token warm-up left a 1.75 s TTFT on
    the first 128-token prompt)."""
    import urllib.request

    from benchmarks.gpu import measure_mtp as mm

    body = json.dumps({"model": mm.served_model(base_url), "prompt": prompt, "max_tokens": 32,
                       "temperature": 0.0, "ignore_eos": True}).encode()
    for _ in range(n):
        req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()


def bench_cell(eng, counter, a: argparse.Namespace, conc: int) -> dict[str, Any]:
    from benchmarks.gpu import measure_mtp as mm
    from tuning.bench import benchmark
    from tuning.workload import Workload

    n_req = a.c1_requests if conc == 1 else conc
    wl = Workload(dataset="random", input_len=a.input_len, output_len=a.output_len, range_ratio=1.0,
                  num_prompts=n_req, max_concurrency=conc, temperature=0.0, ignore_eos=True, seed=1000 + conc,
                  name=f"in{a.input_len}-out{a.output_len}")
    before = mm.scrape(eng.base_url)
    t0 = time.monotonic()
    d = benchmark(eng.base_url, wl, tokenizer=counter, engine_config=eng.config, request_timeout_s=600).to_dict()
    wall = time.monotonic() - t0
    after = mm.scrape(eng.base_url)
    n = eng.config.num_draft_tokens
    return {"concurrency": conc, "num_requests": n_req, "input_len": a.input_len, "output_len": a.output_len,
            "completed": d["completed"], "failed": d["failed"], "failure_reasons": d["failure_reasons"],
            "duration_s": d["duration_s"], "wall_s": round(wall, 2), "output_throughput": d["output_throughput"],
            "total_output_tokens": d["total_output_tokens"], "tpot_ms": d["tpot_ms"], "ttft_ms": d["ttft_ms"],
            "itl_ms": d["itl_ms"], "accept_length": d["accept_length"],
            "accept_length_from_metrics": mm.accept_length(before, after, n) if n else None}


def derive(row: dict[str, Any], label: str, n: int, ckpt: dict[str, Any], bw: dict[str, Any]) -> None:
    """Step time and floors for one measured cell (in place)."""
    sb = step_bytes(ckpt["bytes"], n)
    al = row.get("accept_length") or row.get("accept_length_from_metrics") or 1.0
    if not n:
        al = 1.0
    tpot = (row.get("tpot_ms") or {}).get("median")
    row["num_draft_tokens"] = n
    row["accept_length_used"] = al
    row["step_bytes"] = sb
    row["step_ms"] = tpot * al if tpot else None
    row["floor_ms_spec"] = sb["total"] / (SPEC_TBPS * 1e12) * 1e3
    row["floor_ms_target_only_spec"] = sb["target"] / (SPEC_TBPS * 1e12) * 1e3
    meas = bw.get("read_sum_tbps") if bw else None
    copy = bw.get("copy_tbps_read_plus_write") if bw else None
    row["floor_ms_measured_read"] = sb["total"] / (meas * 1e12) * 1e3 if meas else None
    row["floor_ms_measured_copy"] = sb["total"] / (copy * 1e12) * 1e3 if copy else None
    if row["step_ms"]:
        row["step_over_floor_spec"] = row["step_ms"] / row["floor_ms_spec"]
        if row["floor_ms_measured_copy"]:
            row["step_over_floor_measured_copy"] = row["step_ms"] / row["floor_ms_measured_copy"]
        if row["floor_ms_measured_read"]:
            row["step_over_floor_measured_read"] = row["step_ms"] / row["floor_ms_measured_read"]
        row["achieved_weight_tbps"] = sb["total"] / (row["step_ms"] / 1e3) / 1e12


# ----- main run ----------------------------------------------------------------------------------------------
def run(a: argparse.Namespace) -> int:
    from benchmarks.gpu import measure_mtp as mm

    t_start = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           "command": " ".join(["measure_memory_bound.py", *sys.argv[1:]]),
                           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                           "spec_tbps": SPEC_TBPS, "notes": [], "skipped": [], "cells": [], "engines": {}}
    out_json = a.out / "gpu_memory_bound.json"

    def save() -> None:
        res["elapsed_s"] = round(time.monotonic() - t_start, 1)
        out_json.write_text(json.dumps(res, indent=1))

    def left() -> float:
        return a.deadline_s - (time.monotonic() - t_start)

    res["versions"] = mm.versions() if not a.build_only else {}
    save()
    if a.sim_profile:
        res["notes"].append(f"DRY RUN against the simulated engine ({a.sim_profile}): no GPU figure here")
    if a.device != "cpu":
        res["bandwidth"] = measure_bandwidth()
        log(f"bandwidth: {res['bandwidth']}")
        save()

    # Checkpoints: tokenizer once, oracle first (its engines can start while the random one is written).
    shape = shape_from(a)
    t0 = time.monotonic()
    tok_dir = work / "tokenizer"
    tok = build_tokenizer(tok_dir, a.tok_vocab, a.tokenizer_bytes)
    res["tokenizer"] = {"vocab": tok.vocab_size, "seconds": round(time.monotonic() - t0, 1),
                        "source_bytes": a.tokenizer_bytes}
    log(f"tokenizer: {res['tokenizer']}")
    res["checkpoints"] = {}
    paths = {"oracle": str(work / "ckpt_oracle"), "random": str(work / "ckpt_random")}
    res["checkpoints"]["oracle"] = build_one(Path(paths["oracle"]), shape, tok_dir, tok, oracle=True,
                                             device=a.device, seed=a.seed)
    log(f"oracle checkpoint: {json.dumps(res['checkpoints']['oracle']['bytes'])} "
        f"in {res['checkpoints']['oracle']['seconds_total']} s")
    save()
    labels = [lab for lab in a.configs if lab in CONFIG_LABELS]
    engines: dict[str, Any] = {}
    log_dir = work / "engine_logs"

    def start(label: str) -> None:
        cfg = engine_config(label, paths, a)
        eng, note = new_engine(cfg, log_dir, ready_timeout_s=max(30.0, left() - 20),
                               sim_time_scale=a.sim_time_scale if a.sim_profile else None)
        engines[label] = eng
        res["engines"][label] = {"argv": " ".join(eng.argv), "started_at_s": round(time.monotonic() - t_start, 1)}
        if note:
            res["engines"][label]["note"] = note
            res["notes"].append(f"{label}: {note}")

    if a.build_only:
        res["checkpoints"]["random"] = build_one(Path(paths["random"]), shape, tok_dir, tok, oracle=False,
                                                 device=a.device, seed=a.seed + 1)
        save()
        for label in labels:
            res["engines"][label] = {"argv": " ".join(engine_config(label, paths, a).command(host="127.0.0.1",
                                                                                               port=0))}
        save()
        print(json.dumps({k: res[k] for k in ("tokenizer", "checkpoints", "engines")}, indent=1))
        return 0

    try:
        if a.start == "parallel":
            for label in labels:
                if not label.endswith("_rand"):
                    start(label)
        res["checkpoints"]["random"] = build_one(Path(paths["random"]), shape, tok_dir, tok, oracle=False,
                                                 device=a.device, seed=a.seed + 1)
        log(f"random checkpoint in {res['checkpoints']['random']['seconds_total']} s")
        save()
        if a.start == "parallel":
            for label in labels:
                if label.endswith("_rand"):
                    start(label)
            save()

        from tokenizers import Tokenizer

        from tuning.checkpoint.tokenizer import collect_source_files
        from tuning.workload import HFTokenCounter

        corpus = "\n".join(f.read_text(errors="replace") for f in collect_source_files(None, max_bytes=1 << 20,
                                                                                     split="eval"))
        counter = HFTokenCounter(Tokenizer.from_file(str(tok_dir / "tokenizer.json")), name="ckpt-bpe",
                                 corpus_text=corpus)
        import random as _random

        warm_prompt = counter.sample_text(a.input_len, _random.Random(7))
        stoppers: list[threading.Thread] = []
        est_cell = {1: a.c1_requests * a.output_len * 0.006 + 3, a.concurrency[-1]: a.output_len * 0.012 + 5}

        def measure_cells(label: str, eng, tag: str) -> None:
            for conc in a.concurrency:
                need = est_cell.get(conc, 20) * 1.2
                if left() < need:
                    res["skipped"].append({"config": tag, "concurrency": conc,
                                           "reason": f"deadline ({left():.0f} s left, ~{need:.0f} s needed)"})
                    continue
                try:
                    row = bench_cell(eng, counter, a, conc)
                except Exception as e:
                    res["skipped"].append({"config": tag, "concurrency": conc,
                                           "reason": f"bench failed: {type(e).__name__}: {str(e)[:300]}"})
                    continue
                row["config"] = tag
                row["engine"] = label
                row["checkpoint"] = "random" if label.endswith("_rand") else "oracle"
                row["engines_alive"] = sum(1 for e in engines.values() if e.is_alive())
                derive(row, label, eng.config.num_draft_tokens, res["checkpoints"][row["checkpoint"]],
                       res.get("bandwidth") or {})
                est_cell[conc] = max(est_cell.get(conc, 0), row["wall_s"] + 2)
                res["cells"].append(row)
                log(f"{tag} conc {conc}: {row['output_throughput']:.0f} tok/s, TPOT median "
                    f"{row['tpot_ms']['median']:.3f} ms, AL {row['accept_length']}, step {row['step_ms']:.3f} ms, "
                    f"floor {row['floor_ms_spec']:.3f} ms (x{row.get('step_over_floor_spec', 0):.2f}), "
                    f"{row['completed']}/{row['failed']} in {row['wall_s']} s, {row['engines_alive']} engines up")
                save()

        keep_first = a.remeasure_first and a.start == "parallel"
        first_label: str | None = None
        for label in labels:
            info = res["engines"].setdefault(label, {})
            if a.start == "sequential":
                if left() < 100:
                    res["skipped"].append({"config": label, "reason": f"deadline ({left():.0f} s left) before start"})
                    continue
                start(label)
            eng = engines.get(label)
            if eng is None:
                res["skipped"].append({"config": label, "reason": "not started"})
                continue
            try:
                eng.ready_timeout_s = max(5.0, left() - 15)
                eng.wait_until_ready()
                info["ready_s"] = round(time.monotonic() - t_start - info["started_at_s"], 1)
                info["gpu_mib"] = mm.gpu_memory_by_pgid().get(eng.pid)
                info["gpu_mib_total_now"] = mm.gpu_memory_used_mib()
                log(f"{label} ready after {info['ready_s']} s, {info['gpu_mib']} MiB")
                warm_up(eng.base_url, warm_prompt)
            except Exception as e:
                info["error"] = f"{type(e).__name__}: {str(e)[-2000:]}"
                log(f"{label} failed: {info['error'][-600:]}")
                res["skipped"].append({"config": label, "reason": "engine not ready: " + info["error"][:200]})
                eng.stop()
                save()
                continue
            save()
            measure_cells(label, eng, label)
            if first_label is None:
                first_label = label
                if keep_first:  # measured again at the end, alone
                    continue
            if a.start == "sequential":
                eng.stop()
            else:  # free the GPU and CPU for the next engine without waiting
                th = threading.Thread(target=eng.stop, daemon=True)
                th.start()
                stoppers.append(th)
        for th in stoppers:
            th.join(timeout=40)
        if keep_first and first_label is not None and engines[first_label].is_alive():
            # The first engine was measured while every other engine was up (idle, or finishing its
            # start-up); measure it again with all others stopped.
            measure_cells(first_label, engines[first_label], f"{first_label}@end")
    finally:
        for eng in engines.values():
            with contextlib.suppress(Exception):
                eng.stop(timeout_s=10)
        res["gpu_mib_after_stop"] = mm.gpu_memory_used_mib()
        add_summary(res)
        save()
        tails = []
        for label, eng in engines.items():
            with contextlib.suppress(Exception):
                lines = eng.log_path.read_text(errors="replace").splitlines()
                tails.append(f"===== {label}: {eng.log_path.name} ({len(lines)} lines; first 5, last 60)\n"
                             + "\n".join(lines[:5] + ["..."] + lines[-60:]))
        (a.out / "engine_log_tails.txt").write_text("\n\n".join(tails))
    md = render_markdown(res)
    (a.out / "gpu_memory_bound.md").write_text(md)
    print(md)
    return 0


def add_summary(res: dict[str, Any]) -> None:
    """MTP vs off per acceptance and concurrency, against every MTP-off cell of that concurrency
    (the oracle and random checkpoints have the same shapes, so either is a valid baseline; they
    differ only in when they were measured)."""
    cells = res.get("cells", [])
    out = []
    for c in cells:
        if c.get("num_draft_tokens", 0) == 0 or not c.get("output_throughput"):
            continue
        for base in cells:
            if base.get("num_draft_tokens", 0) != 0 or base["concurrency"] != c["concurrency"]:
                continue
            if not base.get("output_throughput"):
                continue
            out.append({"config": c["config"], "concurrency": c["concurrency"],
                        "acceptance": "0% (random)" if c["checkpoint"] == "random" else "100% (oracle)",
                        "baseline": base["config"], "accept_length": c.get("accept_length_used"),
                        "throughput_speedup": c["output_throughput"] / base["output_throughput"],
                        "tpot_speedup": (base["tpot_ms"]["median"] / c["tpot_ms"]["median"])
                        if c["tpot_ms"].get("median") else None,
                        "memory_bound_ideal_speedup": (c.get("accept_length_used") or 1.0)
                        * base["floor_ms_spec"] / c["floor_ms_spec"],
                        "step_time_ratio_vs_off": (c["step_ms"] / base["step_ms"])
                        if c.get("step_ms") and base.get("step_ms") else None})
    res["speedups"] = out


# ----- report ------------------------------------------------------------------------------------------------
def _f(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def render_markdown(res: dict[str, Any]) -> str:
    v = res.get("versions") or {}
    L = [f"# LMDeploy MTP at realistic per-layer shapes on {v.get('gpu', '?')}: decode step vs the HBM floor", "",
         f"Measured {res.get('started_at', '?')} with `{res.get('command', '')}` "
         f"({res.get('elapsed_s', '?')} s).", "",
         "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()), ""]
    bw = res.get("bandwidth")
    if bw:
        L += ["## HBM bandwidth (torch, same GPU, 4 GiB buffers, median of 20)", "",
              f"- device-to-device copy: {bw['copy_tbps_read_plus_write']:.2f} TB/s (read + written bytes; best "
              f"{bw['copy_tbps_best']:.2f})",
              f"- read-only reduction (`sum`): {bw['read_sum_tbps']:.2f} TB/s (best {bw['read_sum_tbps_best']:.2f})",
              f"- vendor spec: {res.get('spec_tbps', SPEC_TBPS)} TB/s", ""]
    ck = res.get("checkpoints") or {}
    if ck:
        o = ck.get("oracle") or next(iter(ck.values()))
        tc = o["text_config"]
        b = o["bytes"]
        L += [f"## Checkpoints (tuning.checkpoint.build, weights drawn on {o.get('device', '?')})", "",
              f"hidden {tc['hidden_size']}, {tc['num_hidden_layers']} layers ({o['layer_types'].count('linear_attention')} "
              f"gated delta-net + {o['layer_types'].count('full_attention')} gated full attention), MLP "
              f"{tc['intermediate_size']}, attention {tc['num_attention_heads']} q / {tc['num_key_value_heads']} kv heads x "
              f"{tc['head_dim']} (output gate), delta-net {tc['linear_num_key_heads']} k / {tc['linear_num_value_heads']} v "
              f"heads x {tc['linear_key_head_dim']}, vocab {o['vocab']} (tokenizer {o['tokenizer_vocab']}; "
              f"`lm_head` rows past it zeroed), 1 MTP layer; {o['parameters'] / 1e9:.2f}B parameters, "
              f"{o['file_bytes'] / 1e9:.2f} GB bf16.", "",
              "| checkpoint | acceptance | build s (generate / to CPU / total) |", "|---|---|---|"]
        for name, c in ck.items():
            L.append(f"| {name} | {'100% (oracle)' if c['oracle'] else '0% (random)'} | "
                     f"{c['seconds_generate']} / {c['seconds_to_cpu']} / {c['seconds_total']} |")
        sb0, sb1, sb3 = step_bytes(b, 0), step_bytes(b, 1), step_bytes(b, 3)
        L += ["", f"Weight bytes read per decode step: decoder layers {b['decoder_layers'] / 1e9:.3f} GB + final norm + "
              f"`lm_head` {b['lm_head'] / 1e9:.3f} GB = **{sb0['target'] / 1e9:.3f} GB** (MTP off); each MTP draft pass adds "
              f"MTP layer+fc+norms {b['mtp'] / 1e9:.3f} GB + `lm_head` again = {sb0['draft_per_pass'] / 1e9:.3f} GB "
              f"(N=1: {sb1['total'] / 1e9:.3f} GB, N=3: {sb3['total'] / 1e9:.3f} GB). Embedding ({b['embed_tokens'] / 1e9:.3f} GB) "
              f"is a gather, not counted. Floor at {res.get('spec_tbps', SPEC_TBPS)} TB/s: off "
              f"{sb0['total'] / (SPEC_TBPS * 1e9):.3f} ms, N=1 {sb1['total'] / (SPEC_TBPS * 1e9):.3f} ms, "
              f"N=3 {sb3['total'] / (SPEC_TBPS * 1e9):.3f} ms.", ""]
        est = state_bytes_estimate(dict(tc, layer_types=o["layer_types"]), 16, 640)
        L += [f"Not in the floor: KV cache at concurrency 16 x 640 tokens ≈ {est['kv_bytes'] / 1e6:.0f} MB read per step, "
              f"gated delta-net state ≈ {est['recurrent_state_bytes'] / 1e6:.0f} MB read+written per step "
              "(fp32 assumed); at concurrency 1 both together are < 1% of the weight bytes.", ""]
    eng = res.get("engines") or {}
    if eng:
        L += ["## Engines", "", "| config | ready seen after (s from its start; polled when its turn came) | GPU MiB | command |", "|---|---|---|---|"]
        for label, e in eng.items():
            L.append(f"| {label} | {e.get('ready_s', (e.get('error') or '')[:80])} | {_f(e.get('gpu_mib'), 0)} | "
                     f"`{e.get('argv', '')}` |")
        L.append("")
    cells = res.get("cells") or []
    if cells:
        L += ["## Decode step time vs floor (step = TPOT median x accept length; floor = weight bytes / bandwidth)", "",
              "| config | acceptance | conc | out tok/s | TPOT median ms | TPOT mean ms | AL (bench) | AL (/metrics) | "
              "step ms | floor ms @4.8 | floor ms @copy | step / floor @4.8 | step / floor @copy | TTFT median / p99 ms | "
              "engines up | ok/failed |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in cells:
            L.append(f"| {c['config']} | {'0%' if c['checkpoint'] == 'random' else '100%'} | {c['concurrency']} | "
                     f"{_f(c.get('output_throughput'), 0)} | {_f(c['tpot_ms'].get('median'), 3)} | "
                     f"{_f(c['tpot_ms'].get('mean'), 3)} | {_f(c.get('accept_length'), 3)} | "
                     f"{_f(c.get('accept_length_from_metrics'), 3)} | {_f(c.get('step_ms'), 3)} | "
                     f"{_f(c.get('floor_ms_spec'), 3)} | {_f(c.get('floor_ms_measured_copy'), 3)} | "
                     f"{_f(c.get('step_over_floor_spec'))} | {_f(c.get('step_over_floor_measured_copy'))} | "
                     f"{_f((c.get('ttft_ms') or {}).get('median'), 0)} / {_f((c.get('ttft_ms') or {}).get('p99'), 0)} | "
                     f"{c.get('engines_alive', '?')} | {c.get('completed')}/{c.get('failed')} |")
        L.append("")
    sp = res.get("speedups") or []
    if sp:
        L += ["## MTP vs off", "",
              "| config | acceptance | conc | baseline | AL | throughput speedup | TPOT speedup | "
              "step time / off step | ideal memory-bound speedup (AL x floor_off / floor_mtp) |",
              "|---|---|---|---|---|---|---|---|---|"]
        for s in sp:
            L.append(f"| {s['config']} | {s['acceptance']} | {s['concurrency']} | {s['baseline']} | "
                     f"{_f(s.get('accept_length'), 3)} | {_f(s['throughput_speedup'])}x | {_f(s.get('tpot_speedup'))}x | "
                     f"{_f(s.get('step_time_ratio_vs_off'))} | {_f(s['memory_bound_ideal_speedup'])}x |")
        L.append("")
    if res.get("skipped"):
        L += ["## Not measured", ""] + [f"- {s.get('config')} conc {s.get('concurrency', 'all')}: {s['reason']}"
                                        for s in res["skipped"]] + [""]
    if res.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    return "\n".join(L)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--workdir", default="/root/mb", help="checkpoints, tokenizer and engine logs")
    ap.add_argument("--device", default="cuda", help="where the weights are drawn (cpu: no bandwidth, no engines)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--inter", type=int, default=12288)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--lin-k-heads", type=int, default=16)
    ap.add_argument("--lin-v-heads", type=int, default=32)
    ap.add_argument("--lin-head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936, help="model vocabulary (lm_head rows)")
    ap.add_argument("--tok-vocab", type=int, default=16384, help="BPE tokenizer vocabulary")
    ap.add_argument("--tokenizer-bytes", type=int, default=4 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", type=lambda s: s.split(","), default=list(CONFIG_LABELS),
                    help=f"engines, in measuring order; from {','.join(CONFIG_LABELS)}")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    ap.add_argument("--c1-requests", type=int, default=3, help="requests (one after the other) at concurrency 1")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--mem", type=float, default=0.04, help="--cache-max-entry-count per engine")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--session-len", type=int, default=2048)
    ap.add_argument("--max-prefill", type=int, default=2048)
    ap.add_argument("--start", choices=["parallel", "sequential"], default="parallel")
    ap.add_argument("--remeasure-first", action=argparse.BooleanOptionalAction, default=True,
                    help="parallel start: measure the first engine again at the end, all others stopped")
    ap.add_argument("--deadline-s", type=float, default=420, help="whole run, build included")
    ap.add_argument("--build-only", action="store_true", help="build both checkpoints, print their sizes and exit")
    ap.add_argument("--sim-profile", help="dry run: simulated engines with this profile instead of LMDeploy "
                    "(checks this script's flow on a CPU machine; its figures mean nothing)")
    ap.add_argument("--sim-time-scale", type=float, default=20.0)
    ap.add_argument("--render", type=Path, help="print the markdown report of a results JSON and exit")
    a = ap.parse_args(argv)
    if a.render:
        res = json.loads(a.render.read_text())
        add_summary(res)
        print(render_markdown(res))
        return 0
    return run(a)


if __name__ == "__main__":
    raise SystemExit(main())
