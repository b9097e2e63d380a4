"""vLLM 0.26.0, served by ``vllm serve MODEL`` (``python -m vllm.entrypoints.cli.main serve``).

Facts this module encodes (read in vllm-project/vllm's source):

- MTP is ``--speculative-config '{"method": "mtp", "num_speculative_tokens": N}'``: the model's own MTP
  layers draft N tokens (``vllm/config/speculative.py``; ``qwen3_5_mtp`` is accepted there but logged as
  deprecated and rewritten to ``mtp``, so the canonical name is written). ``--speculative-config`` is
  JSON; a draft length that changes with the batch size is its ``num_speculative_tokens_per_batch_size``
  (a list of ``[first batch size, last batch size, draft tokens]``, :mod:`tuning.schedule`).
- ``--gpu-memory-utilization`` is the share of the *whole* GPU the engine may use (weights, activations
  and KV cache together), not LMDeploy's share of the memory left after the weights: the same
  ``memory_fraction`` leaves vLLM less KV cache than LMDeploy.
- Batch size is ``--max-num-seqs``; tensor parallelism ``--tensor-parallel-size`` (its workers are
  processes of the engine's own group on the GPUs in ``CUDA_VISIBLE_DEVICES``); the sequence cap
  ``--max-model-len``; tokens per prefill step ``--max-num-batched-tokens``.
- ``--generation-config vllm`` keeps vLLM's own sampling defaults (temperature 1.0 for a request that
  gives none); vLLM's default (``auto``) takes them from the checkpoint's ``generation_config.json``,
  which would make the router's band for such requests depend on the checkpoint.
- Readiness ``GET /v1/models``, health ``GET /health``. Metrics ``vllm:*``; the spec-decode counters
  ``vllm:spec_decode_num_drafts`` / ``_num_draft_tokens`` / ``_num_accepted_tokens`` (samples with
  ``_total``, ``vllm/v1/spec_decode/metrics.py``) count every step, so the mean accept length is
  ``1 + Δaccepted / Δdrafts`` (vLLM's own definition, bonus token included).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import EngineBackend, MetricNames, compact_json
from orchestrator.errors import ConfigError, PreflightError

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__ = ["MIN_VLLM_VERSION", "VLLM", "VLLM_METRICS", "check_draft_schedule", "speculative_config"]

MIN_VLLM_VERSION = "0.26.0"
"""The version this module was written against: it pins torch 2.11.0, the GPU image's torch, and has
per-batch-size draft lengths."""

VLLM_METRICS = MetricNames(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    drafts="vllm:spec_decode_num_drafts_total",
    draft_tokens="vllm:spec_decode_num_draft_tokens_total",
    accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
)

MTP_METHOD = "mtp"


def speculative_config(config: EngineConfig) -> dict[str, Any] | None:
    """The ``--speculative-config`` object of a config (``None``: speculation off), with its draft
    schedule (``num_speculative_tokens_per_batch_size``) when it has one."""
    if not config.speculative:
        return None
    spec: dict[str, Any] = {"method": MTP_METHOD, "num_speculative_tokens": config.num_draft_tokens}
    if config.draft_schedule is not None:
        spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in config.draft_schedule]
    return spec


def check_draft_schedule(ranges: Any, num_draft_tokens: int) -> tuple[tuple[int, int, int], ...]:
    """``num_speculative_tokens_per_batch_size`` as this project writes it: ``[first, last, draft tokens]``
    ranges running contiguously from batch size 1, each draft length within ``0..num_draft_tokens``
    and the longest equal to it (vLLM sizes its draft buffers by ``num_speculative_tokens``).

    Returns the ranges as a tuple of int triples; raises :class:`ConfigError` saying what is wrong."""
    try:
        out = tuple((int(lo), int(hi), int(k)) for lo, hi, k in ranges)
    except (TypeError, ValueError):
        raise ConfigError(f"draft_schedule={ranges!r} must be a list of [first batch size, last batch size, "
                          "draft tokens]") from None
    expected = 1
    for lo, hi, k in out:
        if lo != expected or hi < lo or not 0 <= k <= num_draft_tokens:
            raise ConfigError(f"draft_schedule={[list(r) for r in out]}: ranges must run contiguously from batch "
                              f"size 1, first <= last, with 0..{num_draft_tokens} draft tokens each")
        expected = hi + 1
    if not out or max(k for _, _, k in out) != num_draft_tokens:
        raise ConfigError(f"draft_schedule={[list(r) for r in out]}: its longest draft length must be the "
                          f"config's num_draft_tokens={num_draft_tokens} (vLLM's num_speculative_tokens)")
    return out


class VLLM(EngineBackend, name="vllm"):
    package = "vllm"
    memory_flag = "--gpu-memory-utilization"
    default_temperature = 1.0
    supports_speculation = True
    supports_draft_schedule = True
    metrics = VLLM_METRICS

    def check_config(self, config: EngineConfig) -> None:
        super().check_config(config)
        if config.draft_schedule is not None:
            check_draft_schedule(config.draft_schedule, config.num_draft_tokens)

    def flags(self, config: EngineConfig) -> list[str]:
        argv = ["--tensor-parallel-size", str(config.tp), self.memory_flag, f"{config.memory_fraction:g}"]
        if config.max_batch_size is not None:
            argv += ["--max-num-seqs", str(config.max_batch_size)]
        if config.session_len is not None:
            argv += ["--max-model-len", str(config.session_len)]
        argv += ["--max-num-batched-tokens", str(config.max_prefill_tokens), "--generation-config", "vllm"]
        if (spec := speculative_config(config)) is not None:
            argv += ["--speculative-config", compact_json(spec)]
        return argv

    def command(self, config: EngineConfig, *, host: str, port: int,
                served_model_name: str | None = None) -> list[str]:
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", config.model,
                "--host", host, "--port", str(port)]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        return argv + self.flags(config) + list(config.extra_flags)

    def preflight_checks(self, config: EngineConfig,
                         env: Mapping[str, str] | None = None) -> list[Callable[[], object]]:
        from orchestrator import preflight as pf

        checks: list[Callable[[], object]] = [check_vllm_version]
        if config.speculative:
            checks.append(lambda: pf.check_mtp_checkpoint(config.model))
        else:
            checks.append(lambda: pf.check_model_path(config.model))
        return checks


def check_vllm_version(minimum: str = MIN_VLLM_VERSION) -> str:
    """vLLM is installed (read from its metadata: importing it pulls in torch) and ``>= minimum``."""
    from packaging.version import Version

    from orchestrator.hostinfo import package_version

    fix = f"pip install 'vllm=={MIN_VLLM_VERSION}' on this node (docs/gpu.md, section vLLM)"
    version = package_version("vllm")
    if version is None:
        raise PreflightError(f"vLLM is not installed in this Python environment; {fix}")
    if Version(version) < Version(minimum):
        raise PreflightError(f"vLLM {version} is too old: this project drives vLLM >= {minimum}; {fix}")
    return version
