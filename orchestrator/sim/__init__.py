"""The simulated engine: an OpenAI-compatible server whose timing comes from a calibrated model.

Never a GPU figure: every number it produces is simulated (responses carry ``x-simulated-engine: true``,
``/sim/info`` says ``simulated: true``). Modules: :mod:`.model` (pure performance and acceptance model,
profiles as JSON), :mod:`.scheduler` (continuous batching; ``simulate_workload`` drives it on a virtual
clock), :mod:`.server` (aiohttp front, drives the same scheduler on a scaled wall clock),
:mod:`.tokenizer` (word-level tokenizer over the shipped corpus), :mod:`.textmodel` (the text a request
gets: from its prompt, temperature and seed only), :mod:`.resources` (the CPU a simulated engine's Serve
replica reserves, measured). A profile describes LMDeploy's PyTorch engine and,
where it has a ``turbomind`` section, TurboMind too (``--backend turbomind``; no speculation).

Limits: the wall-clock driver is exact while the event loop keeps up with each iteration's wall
budget (iteration time / time scale); on 2 CPU cores at concurrency 64 the figures stay within 5% of
the virtual-clock model up to the time scale stated in ``orchestrator/sim/README.md``. Acceptance is
sampled, not computed from text; generated text is corpus words, not model output.
"""
from __future__ import annotations

from orchestrator.sim.model import (
    DEFAULT_PROFILE,
    EngineParams,
    PerformanceModel,
    Profile,
    SimModelError,
    SimOutOfMemory,
    load_profile,
    list_profiles,
)
from orchestrator.sim.scheduler import Scheduler, SimSummary, simulate_workload

__all__ = [
    "DEFAULT_PROFILE",
    "EngineParams",
    "PerformanceModel",
    "Profile",
    "Scheduler",
    "SimModelError",
    "SimOutOfMemory",
    "SimSummary",
    "list_profiles",
    "load_profile",
    "simulate_workload",
]
