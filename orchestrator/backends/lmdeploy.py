"""LMDeploy 0.18's two engines, PyTorch and TurboMind, served by ``lmdeploy serve api_server``.

Facts this module encodes:

- MTP (``--speculative-algorithm qwen3_5_mtp``) exists only in the PyTorch engine; TurboMind ignores
  speculation with a warning, so a TurboMind config with speculation is refused rather than silently
  measured as a non-speculative engine.
- LMDeploy has one draft knob, ``--speculative-num-draft-tokens`` (the draft model runs that many
  steps), so "num steps" and "draft tokens" of other engines' guides collapse into it.
- ``--cache-max-entry-count`` is the fraction of *free* GPU memory (after weights) given to the KV cache.
- The OpenAI endpoints sample at temperature 0.7 when a request gives none (``ChatCompletionRequest`` /
  ``CompletionRequest``).
- The metrics are ``lmdeploy:*``; how its spec-decode counters count under load:
  :mod:`orchestrator.spec_counting`.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import EngineBackend, MetricNames

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__ = ["FLAG_TABLE", "LMDEPLOY_METRICS", "TURBOMIND_HAS_NO_SPECULATION", "FlagSpec", "LMDeployPyTorch",
           "TurboMind"]

LMDEPLOY_METRICS = MetricNames(
    running="lmdeploy:num_requests_running",
    waiting="lmdeploy:num_requests_waiting",
    drafts="lmdeploy:spec_decode_num_drafts_total",
    draft_tokens="lmdeploy:spec_decode_num_draft_tokens_total",
    accepted_tokens="lmdeploy:spec_decode_num_accepted_tokens_total",
)

TURBOMIND_HAS_NO_SPECULATION = (
    "LMDeploy 0.18's TurboMind engine ignores speculative decoding (it only logs a warning), so this config "
    "would silently run without MTP. Use backend='pytorch' for MTP, or speculative_algorithm=None for TurboMind."
)
"""Why speculation with TurboMind is refused: by :class:`EngineConfig` and by the simulated engine alike."""


@dataclass(frozen=True)
class FlagSpec:
    """How one config field becomes a command-line flag."""

    field: str
    flag: str
    format: Callable[[Any], str | None] = str
    """Value -> flag argument; ``None`` omits the flag (engine default)."""

    def render(self, value: Any) -> list[str]:
        if value is None:
            return []
        arg = self.format(value)
        return [] if arg is None else [self.flag, arg]


FLAG_TABLE: tuple[FlagSpec, ...] = (
    FlagSpec("tp", "--tp"),
    FlagSpec("memory_fraction", "--cache-max-entry-count", lambda v: f"{v:g}"),
    FlagSpec("max_batch_size", "--max-batch-size"),
    FlagSpec("session_len", "--session-len"),
    FlagSpec("max_prefill_tokens", "--max-prefill-token-num"),
    FlagSpec("speculative_algorithm", "--speculative-algorithm", lambda v: v.value),
    # Only rendered when speculation is on: num_draft_tokens is normalised to 0 otherwise.
    FlagSpec("num_draft_tokens", "--speculative-num-draft-tokens", lambda v: str(v) if v else None),
)
"""The single mapping of config fields to LMDeploy ``serve api_server`` flags (the simulated engine
standing in for LMDeploy accepts the same names)."""


class _LMDeploy(EngineBackend):
    package = "lmdeploy"
    memory_flag = "--cache-max-entry-count"
    default_temperature = 0.7
    metrics = LMDEPLOY_METRICS

    def flags(self, config: EngineConfig) -> list[str]:
        argv: list[str] = []
        for spec in FLAG_TABLE:
            argv += spec.render(getattr(config, spec.field))
        return argv

    def command(self, config: EngineConfig, *, host: str, port: int,
                served_model_name: str | None = None) -> list[str]:
        # ``python -m lmdeploy`` rather than the ``lmdeploy`` script: installs without console scripts
        # (``pip --target``, some images) have the module but not the executable.
        argv = [sys.executable, "-m", "lmdeploy", "serve", "api_server", config.model, "--backend", self.name,
                "--server-name", host, "--server-port", str(port)]
        if served_model_name:
            argv += ["--model-name", served_model_name]
        return argv + self.flags(config) + list(config.extra_flags)


class LMDeployPyTorch(_LMDeploy, name="pytorch"):
    """LMDeploy's PyTorch engine: the only LMDeploy engine with MTP speculative decoding in 0.18."""

    supports_speculation = True

    def command(self, config: EngineConfig, *, host: str, port: int,
                served_model_name: str | None = None) -> list[str]:
        """As LMDeploy's, plus ``--distributed-executor-backend mp`` when ``tp > 1`` and ``extra_flags``
        choose no executor: LMDeploy could otherwise pick its Ray executor, which joins whatever Ray
        cluster it can reach (inside a Ray worker: ours) and places TP workers on GPUs outside the
        caller's reservation, or deadlocks waiting for GPUs the caller holds. The ``mp`` executor forks
        its workers on exactly ``CUDA_VISIBLE_DEVICES``, and they die with the process group on stop."""
        argv = super().command(config, host=host, port=port, served_model_name=served_model_name)
        if config.tp > 1 and not _chooses_executor(config.extra_flags):
            argv += ["--distributed-executor-backend", "mp"]
        return argv

    def preflight_checks(self, config: EngineConfig,
                         env: Mapping[str, str] | None = None) -> list[Callable[[], object]]:
        from orchestrator import preflight as pf

        if not config.speculative:
            return [lambda: pf.check_model_path(config.model)]
        return [pf.check_lmdeploy_version, pf.check_fa3, lambda: pf.check_mtp_checkpoint(config.model)]


class TurboMind(_LMDeploy, name="turbomind"):
    """LMDeploy's TurboMind engine (C++): no speculation."""

    no_speculation_reason = TURBOMIND_HAS_NO_SPECULATION

    def preflight_checks(self, config: EngineConfig,
                         env: Mapping[str, str] | None = None) -> list[Callable[[], object]]:
        from orchestrator import preflight as pf

        return [lambda: pf.check_turbomind(env=env), lambda: pf.check_model_path(config.model)]


def _chooses_executor(flags: Sequence[str]) -> bool:
    return any(f.replace("_", "-").split("=", 1)[0] == "--distributed-executor-backend" for f in flags)
