"""The landscape on the MoE testbed (issue #22 item 3): MTP off and 1-4 draft tokens x concurrency x
agreement level x temperature x output length, one engine on the GPU at a time.

The testbed is the constructed Qwen3.5-MoE of ``tuning.checkpoint.build --preset
qwen3.5-moe-35b-a3b-12l`` (Qwen3.5-35B-A3B's per-layer shapes, 12 layers, 23 GB in bf16) with
controllable acceptance: an agreement level sets how often the MTP head drafts the target's next token,
the sharpness how acceptance falls with temperature, and the build predicts the accept length (written
beside each measured one). One checkpoint per agreement level, built on the GPU when its engines come
up and deleted after (three would not fit the machine's disk). MTP off is measured once, on the first
checkpoint: the target's computation — shapes, the successor cycle its tokens follow — does not depend on
the agreement level, only the MTP head does.

Per engine: start (``--backend pytorch``, alone on the GPU), one unmeasured full-length wave per
temperature (a fresh engine's first full-length run is 15-45 % slow) and one short unmeasured run at every
concurrency it will measure (a first pass over new concurrencies can read slow, as if a cost were paid on
the first use of a batch shape; a cell should not carry it), then every cell once: ``--waves``
waves of ``concurrency`` requests (at least 4), input ``--input-len`` tokens of held-out source,
``ignore_eos``. Results go to ``--out``/``landscape.json`` after every cell; a later run with the same
``--out`` skips what is there, so the landscape fills over several device calls (``--deadline-s``: no
engine starts after it). ``--redo PREFIX`` measures again the cells whose key starts with it and that were
measured before the per-concurrency warm-up (the old figures stay in the file, under ``superseded``).

    python benchmarks/gpu/measure_landscape.py --out $OUT/landscape [--deadline-s 480]     # on the GPU machine
    python benchmarks/gpu/measure_landscape.py --sim --out /tmp/landscape                  # dry run, simulated
    python benchmarks/gpu/measure_landscape.py --render landscape.json                     # the markdown report
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.config import EngineConfig
from tuning.landscape import (
    PRESET,
    WARMUP,
    cell_key,
    cells_of,
    cells_to_redo,
    engines_planned,
    planned_keys,
    prediction_start_tokens,
    render,
)

ROOT = Path(__file__).resolve().parents[2]

SIM_PROFILE = "intern-s2-preview-8xh200"
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[landscape {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def engine_config(eng: dict[str, Any], ckpt: Path | None, a: argparse.Namespace) -> EngineConfig:
    spec = dict(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=eng["draft_tokens"]) if eng["draft_tokens"] else {}
    if a.sim:
        return EngineConfig(backend="sim", model=SIM_PROFILE, tp=8, memory_fraction=0.8, max_batch_size=max(a.concurrency),
                            extra_flags=("--startup-delay", "0"), **spec)
    return EngineConfig(backend="pytorch", model=str(ckpt), memory_fraction=a.memory_fraction,
                        max_batch_size=max(a.concurrency), session_len=a.input_len + max(a.output_len) + 64,
                        extra_flags=("--language-model-only",), **spec)


def build(agreement: float, a: argparse.Namespace) -> Path:
    """The agreement level's checkpoint in ``--work`` (built on the GPU), replacing any other level's."""
    path = Path(a.work) / f"moe-a{agreement:g}"
    done = path / ".built"  # written last: a build cut short is built again
    if done.exists():
        return path
    for old in Path(a.work).glob("moe-a*"):
        shutil.rmtree(old, ignore_errors=True)
    log(f"building {path} (agreement {agreement:g}, sharpness {a.sharpness:g})")
    cmd = [sys.executable, "-m", "tuning.checkpoint.build", str(path), "--preset", PRESET, "--agreement", str(agreement),
           "--sharpness", str(a.sharpness), "--device", "cuda", "--no-digest"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    done.write_text(" ".join(cmd))
    return path


def predicted(ckpt: Path | None, n: int, t: float) -> float | None:
    if ckpt is None or n == 0:
        return None
    from tuning.checkpoint.build import predicted_accept_length

    try:
        return predicted_accept_length(ckpt, n, t)
    except Exception:
        return None


def measure_cell(url: str, cfg: EngineConfig, tokenizer: Any, *, o: int, t: float, c: int,
                 a: argparse.Namespace) -> dict[str, Any]:
    from tuning.bench import benchmark
    from tuning.workload import Workload

    w = Workload(input_len=a.input_len, output_len=o, range_ratio=1.0, num_prompts=max(4, a.waves * c), max_concurrency=c,
                 request_rate=float("inf"), temperature=t, ignore_eos=True, warmup_requests=0, seed=c)
    r = benchmark(url, w, tokenizer=tokenizer, engine_config=cfg, request_timeout_s=1800).to_dict()
    keep = ("output_throughput", "request_throughput", "completed", "failed", "failure_reasons", "duration_s",
            "accept_length", "spec_counters", "simulated")  # the deltas say how far the counted figure reads high
    out = {k: r.get(k) for k in keep}
    for k in ("ttft_ms", "tpot_ms"):
        out[f"{k}_median"] = (r.get(k) or {}).get("median")
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    from orchestrator.engine import EngineProcess
    from orchestrator.hostinfo import measured_on, package_versions
    from tuning.workload import load_tokenizer

    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / "landscape.json"
    state: dict[str, Any] = json.loads(state_path.read_text()) if state_path.exists() else {
        "simulated": a.sim, "preset": PRESET, "sharpness": a.sharpness, "input_len": a.input_len, "waves": a.waves,
        "host": measured_on() | package_versions(("torch", "triton", "flash_attn_3")), "commands": [], "starts_s": {},
        "cells": {}}
    state["commands"].append(" ".join(["python", "benchmarks/gpu/measure_landscape.py", *a.argv]))

    def save() -> None:
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(state_path)

    cells = cells_of(a)
    planned = planned_keys(a)
    for key in cells_to_redo(state["cells"], a.redo):
        if key in planned:  # a cell this run will measure again, not one another run's flags plan
            state.setdefault("superseded", {}).setdefault(key, []).append(state["cells"].pop(key))
            log(f"{key}: measured again (the earlier figure is kept under 'superseded')")
    for eng in engines_planned(a):
        todo = [(o, t, c) for o, t, c in cells if cell_key(eng["name"], o, t, c) not in state["cells"]]
        if not todo:
            continue
        if time.monotonic() - T0 > a.deadline_s:
            log(f"deadline: {eng['name']} and later engines not started (run again with the same --out)")
            break
        ckpt = None if a.sim else build(eng["agreement"], a)
        tokenizer = load_tokenizer(None if a.sim else ckpt)
        cfg = engine_config(eng, ckpt, a)
        proc = EngineProcess(cfg, log_dir=out_dir / "engine-logs", ready_timeout_s=900,
                             sim_time_scale=a.sim_time_scale if a.sim else None)
        t_start = time.monotonic()
        try:
            proc.start()
            proc.wait_until_ready()
            state["starts_s"][eng["name"]] = round(time.monotonic() - t_start, 1)
            log(f"{eng['name']} ready in {state['starts_s'][eng['name']]} s")
            for t in dict.fromkeys(t for _, t, _ in todo):  # the first full-length wave, unmeasured
                measure_cell(proc.base_url, cfg, tokenizer, o=max(a.output_len), t=t, c=min(64, max(a.concurrency)), a=a)
            for c in dict.fromkeys(c for _, _, c in todo):  # every batch shape once, short, unmeasured
                measure_cell(proc.base_url, cfg, tokenizer, o=a.warmup_output_len, t=todo[0][1], c=c, a=a)
            start_tokens = prediction_start_tokens(ckpt) if eng["draft_tokens"] else None
            for o, t, c in todo:
                r = measure_cell(proc.base_url, cfg, tokenizer, o=o, t=t, c=c, a=a)
                state["cells"][cell_key(eng["name"], o, t, c)] = {
                    "engine": eng["name"], "agreement": None if eng["draft_tokens"] == 0 else eng["agreement"],
                    "draft_tokens": eng["draft_tokens"], "output_len": o, "temperature": t, "concurrency": c,
                    "predicted_accept_length": predicted(ckpt, eng["draft_tokens"], t),
                    "prediction_start_tokens": start_tokens,
                    "warmup": WARMUP, **r}
                save()
                log(f"{eng['name']} out {o} T {t:g} c {c}: {r['output_throughput']:.0f} tok/s, accept "
                    f"{r.get('accept_length')}, failed {r.get('failed')}")
        except Exception as e:
            state.setdefault("failures", {})[eng["name"]] = repr(e)[:500]
            log(f"{eng['name']} failed: {e!r}")
        finally:
            proc.stop()
            save()
    return state


# ----- report -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure_landscape.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder of landscape.json (kept across runs: what is there is skipped)")
    p.add_argument("--work", default="/root/landscape-ckpt", help="where the checkpoint of the current agreement level is built")
    p.add_argument("--render", type=Path, help="print the markdown report of a landscape.json and exit")
    p.add_argument("--sim", action="store_true", help="simulated engines (a dry run; no GPU figure)")
    p.add_argument("--sim-time-scale", type=float, default=20.0)
    p.add_argument("--agreements", type=floats, default=[0.5, 0.7, 0.9])
    p.add_argument("--sharpness", type=float, default=8.0)
    p.add_argument("--draft-tokens", type=ints, default=[1, 2, 3, 4])
    p.add_argument("--concurrency", type=ints, default=[1, 4, 16, 64, 256])
    p.add_argument("--temperatures", type=floats, default=[0.0, 0.8])
    p.add_argument("--output-len", type=ints, default=[128, 512])
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--waves", type=int, default=2, help="waves of `concurrency` requests per cell")
    p.add_argument("--memory-fraction", type=float, default=0.5, help="--cache-max-entry-count (the engine is alone)")
    p.add_argument("--deadline-s", type=float, default=480, help="no engine starts after this (from the start)")
    p.add_argument("--warmup-output-len", type=int, default=32, help="output tokens of the short warm-up run per concurrency")
    p.add_argument("--redo", type=lambda s: [x for x in s.split(",") if x], default=[], metavar="PREFIX[,PREFIX]",
                   help="measure again the cells whose key (ENGINE|outO|TT|cC) starts with a prefix and that came "
                        "before the per-concurrency warm-up, e.g. 'mtp-off|out128|T0|' (the closing '|' matters: "
                        "'...|T0' also matches T0.8); the old figures are kept")
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # the command the file records
    if a.render:
        print(render(json.loads(a.render.read_text())), end="")
        return 0
    if not a.out:
        p.error("--out is required unless --render")
    global T0
    T0 = time.monotonic()  # the deadline counts from the run, not from the import (tests import it early)
    state = run(a)
    planned = planned_keys(a)
    done, total = len(planned & set(state["cells"])), len(planned)  # the file may hold other runs' cells too
    log(f"{done} of {total} cells in {Path(a.out) / 'landscape.json'}"
        + ("" if done == total else "; run again with the same --out for the rest"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
