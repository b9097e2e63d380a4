"""The engine the GPU measurement scripts run: LMDeploy's PyTorch engine on the project's test
checkpoint (``--language-model-only``: the checkpoint declares a vision tower it does not ship), or,
for a dry run without a GPU, the simulated engine of the published profile. One place, so the scripts
measure the same engine and their dry runs the same simulator."""
from __future__ import annotations

from orchestrator.config import EngineConfig

SIM_PROFILE = "intern-s2-preview-8xh200"


def measured_engine(ckpt: str, *, sim: bool, draft_tokens: int, memory_fraction: float,
                    max_batch_size: int, session_len: int = 4096) -> EngineConfig:
    """MTP (``qwen3_5_mtp``) with ``draft_tokens`` draft tokens, or MTP off when it is 0."""
    spec = dict(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=draft_tokens) if draft_tokens else {}
    if sim:
        return EngineConfig(backend="sim", model=SIM_PROFILE, tp=8, memory_fraction=memory_fraction,
                            max_batch_size=max_batch_size, extra_flags=("--startup-delay", "0"), **spec)
    return EngineConfig(backend="pytorch", model=ckpt, memory_fraction=memory_fraction, max_batch_size=max_batch_size,
                        session_len=session_len, extra_flags=("--language-model-only",), **spec)
