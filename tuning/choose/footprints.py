"""Each config's GPU memory footprint, where it is known: what the shared-GPU plan checks memory with
(:mod:`tuning.choose.shared_gpu`).

Why only simulated configs: a simulated engine's memory is its performance model's
(:meth:`orchestrator.sim.model.PerformanceModel.memory_report`: weights, MTP head, reserved memory and
sequence states, and the KV cache its memory fraction takes of the rest), the same figures that bound its
batch; a real engine's footprint is not recorded in the sweep's rows yet, so a real config is never
placed beside another (it stays on whole GPUs).
"""
from __future__ import annotations

from orchestrator.config import EngineConfig
from orchestrator.sim.model import (
    EngineParams,
    PerformanceModel,
    SimModelError,
    load_profile,
)
from tuning.choose.shared_gpu import EngineFootprint

__all__ = ["footprint_of"]

_GB = 1e9


def footprint_of(config: EngineConfig) -> EngineFootprint | None:
    """``config``'s footprint on one of its GPUs, or ``None`` where it is not known (a real engine, a
    tp > 1 engine, which cannot share a GPU, or a config its simulator refuses, e.g. out of memory)."""
    if not config.simulated or config.tp != 1:
        return None
    try:
        profile = load_profile(config.model)
        params = EngineParams(tp=1, num_draft_tokens=config.num_draft_tokens if config.speculative else 0,
                              memory_fraction=config.memory_fraction, max_batch_size=config.max_batch_size,
                              session_len=config.session_len, max_prefill_tokens=config.max_prefill_tokens,
                              backend=config.simulated_backend or "pytorch")
        mem = PerformanceModel(profile, params).memory_report()
    except SimModelError:
        return None
    held = mem["weight_bytes"] + mem["mtp_bytes"] + mem["reserved_bytes"] + mem["state_bytes"]
    return EngineFootprint(weights_gb=held / _GB, kv_gb=mem["free_bytes"] * config.memory_fraction / _GB,
                           gpu_gb=mem["total_bytes"] / _GB)
