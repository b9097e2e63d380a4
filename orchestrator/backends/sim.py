"""The simulated engine (``python -m orchestrator.sim``): a performance model, no GPU, never a GPU figure.

It stands in for one real engine (``EngineConfig.simulated_backend``; LMDeploy's PyTorch engine when
unset) and presents itself as that engine: it takes that engine's flags (the real backend's
:meth:`~orchestrator.backends.base.EngineBackend.flags`, so a simulated vLLM runs vLLM's command-line
path), serves that engine's metric names, and refuses what that engine refuses. Its OpenAI endpoints
sample at temperature 1.0 when a request gives none.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends.base import EngineBackend, MetricNames, get_backend

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__ = ["Simulator"]

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""Folder holding the ``orchestrator`` package; put on the simulator's PYTHONPATH so
``python -m orchestrator.sim`` works from a source checkout that is not pip-installed."""


class Simulator(EngineBackend, name="sim"):
    memory_flag = "--cache-max-entry-count"
    default_temperature = 1.0
    supports_speculation = True
    simulated = True

    @staticmethod
    def stood_in(config: EngineConfig) -> EngineBackend:
        """The real engine this simulated config presents itself as."""
        return get_backend(config.engine_name)

    def metrics_for(self, config: EngineConfig) -> MetricNames:
        return self.stood_in(config).metrics

    def flags(self, config: EngineConfig) -> list[str]:
        return self.stood_in(config).flags(config)

    def command(self, config: EngineConfig, *, host: str, port: int,
                served_model_name: str | None = None) -> list[str]:
        argv = [sys.executable, "-m", "orchestrator.sim", "--profile", config.model,
                "--server-name", host, "--server-port", str(port)]
        if served_model_name:
            argv += ["--model-name", served_model_name]
        if config.simulated_backend is not None:
            argv += ["--backend", config.simulated_backend]
        return argv + self.flags(config) + list(config.extra_flags)

    def environment(self, config: EngineConfig, gpus: Sequence[int] | None,
                    inherited: Mapping[str, str]) -> dict[str, str]:
        """No GPU at all, and the checkout on the path."""
        path = os.pathsep.join(p for p in (str(_PROJECT_ROOT), inherited.get("PYTHONPATH", "")) if p)
        return {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}

    def check_config(self, config: EngineConfig) -> None:
        self.stood_in(config).check_config(config)

    def preflight_checks(self, config: EngineConfig,
                         env: Mapping[str, str] | None = None) -> list[Callable[[], object]]:
        from orchestrator import preflight as pf

        return [lambda: pf.check_sim_profile(config.model)]

    def gpu_request(self, config: EngineConfig, *, share_gpu: bool) -> float:
        return 0
