"""The one interface every engine family implements, and the registry that finds one by name.

An engine family is everything the orchestrator must know to start, watch and describe one kind of
engine server: its command line, its environment, how it says it is ready, the names of its Prometheus
metrics (the speculative-decoding counters that give the accept length included), the checks before it
starts, its installed version, which flag takes the memory fraction, the temperature its OpenAI
endpoints use when a request gives none, and whether it speculates at all. Process handling stays in
:class:`orchestrator.engine.EngineProcess`, which asks the backend; config validation stays in
:class:`orchestrator.config.EngineConfig`, which asks it too.

Backends register by name when their class is defined (``class VLLM(EngineBackend, name="vllm")``,
as SkyPilot's load-balancing policies do), so a new engine is one module in this package (every module
here is imported by the package) plus its test. An unknown name is an error listing the known ones.
"""
from __future__ import annotations

import abc
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.config import EngineConfig

__all__ = ["EngineBackend", "MetricNames", "get_backend", "known_backends"]

_REGISTRY: dict[str, EngineBackend] = {}


@dataclass(frozen=True)
class MetricNames:
    """An engine's Prometheus *sample* names (counters with their ``_total``) for what the orchestrator
    reads: the load gauges the Serve replicas export and the spec-decode counters the accept length
    comes from (``1 + Δaccepted / Δdrafts``, one draft = one sequence's decode step that drafted)."""

    running: str
    waiting: str
    drafts: str
    draft_tokens: str
    accepted_tokens: str

    def spec_counters(self) -> dict[str, str]:
        """Our counter name -> this engine's sample name (``tuning.bench.counters`` keys)."""
        return {"num_drafts": self.drafts, "num_draft_tokens": self.draft_tokens,
                "num_accepted_tokens": self.accepted_tokens}

    @staticmethod
    def family(sample: str) -> str:
        """The metric family a counter sample belongs to (what a Prometheus client registers)."""
        return sample.removesuffix("_total")


class EngineBackend(abc.ABC):
    """One engine family. Stateless: one instance per name, shared (:func:`get_backend`).

    Subclasses set the class attributes and implement :meth:`flags`, :meth:`command` and
    :meth:`preflight_checks`; ``name=`` in the class statement registers them.
    """

    name: ClassVar[str]
    package: ClassVar[str | None] = None
    """The Python distribution whose version is the engine's version (``None``: no package)."""
    memory_flag: ClassVar[str]
    """The flag :attr:`EngineConfig.memory_fraction` becomes (its meaning differs between engines:
    see each backend)."""
    default_temperature: ClassVar[float]
    """The temperature the engine's OpenAI endpoints sample at when a request gives none: the router
    must know which sampling band such a request falls in."""
    supports_speculation: ClassVar[bool] = False
    no_speculation_reason: ClassVar[str] = "this engine has no speculative decoding"
    supports_draft_schedule: ClassVar[bool] = False
    """Whether the draft length can change with the batch size inside one engine
    (:attr:`EngineConfig.draft_schedule`; vLLM's ``num_speculative_tokens_per_batch_size``)."""
    metrics: ClassVar[MetricNames]
    readiness_path: ClassVar[str] = "/v1/models"
    """``GET`` answers 200 once the engine serves (the model is loaded)."""
    health_path: ClassVar[str] = "/health"
    simulated: ClassVar[bool] = False
    """True only for the simulator: no GPU, never a GPU figure."""

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is None:
            return
        if name in _REGISTRY:
            raise ConfigError(f"engine backend {name!r} is registered twice "
                              f"({type(_REGISTRY[name]).__module__} and {cls.__module__})")
        cls.name = name
        _REGISTRY[name] = cls()

    # ----- what to run ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def flags(self, config: EngineConfig) -> list[str]:
        """The engine flags a config becomes: parallelism, memory, batch, lengths, speculation. The
        simulator standing in for this engine takes the same flags, so its path is this one.

        Args:
            config: a validated config whose :attr:`EngineConfig.engine_name` is this backend.
        Returns:
            argv items, without the program, the model, host, port or served name.
        """

    @abc.abstractmethod
    def command(self, config: EngineConfig, *, host: str, port: int,
                served_model_name: str | None = None) -> list[str]:
        """The whole command line that serves ``config`` on ``host:port`` (``extra_flags`` last)."""

    def environment(self, config: EngineConfig, gpus: Sequence[int] | None,
                    inherited: Mapping[str, str]) -> dict[str, str]:
        """Variables to set for the engine process on top of the environment it inherits.

        Args:
            gpus: the GPU indices the engine may use; ``None`` inherits ``CUDA_VISIBLE_DEVICES``.
            inherited: the environment the engine gets otherwise (the caller's and the extra one).
        """
        return {} if gpus is None else {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}

    # ----- before it runs ------------------------------------------------------------------------------
    @abc.abstractmethod
    def preflight_checks(self, config: EngineConfig,
                         env: Mapping[str, str] | None = None) -> list[Callable[[], object]]:
        """Checks that raise :class:`~orchestrator.errors.PreflightError` saying what to do, run before
        the engine starts (its own failures come minutes later and say less)."""

    def check_config(self, config: EngineConfig) -> None:
        """Refuse, with :class:`ConfigError`, a config this engine would run as something else (e.g.
        speculation it would silently ignore). Called by :class:`EngineConfig` itself."""
        if config.speculative and not self.supports_speculation:
            raise ConfigError(f"speculative_algorithm is set for engine {self.name!r}: {self.no_speculation_reason}")
        if config.draft_schedule is not None and not self.supports_draft_schedule:
            raise ConfigError(f"draft_schedule is set for engine {self.name!r}, which has one draft length per engine; "
                              "a schedule needs an engine that changes it with the batch size (vllm)")

    # ----- what it is ----------------------------------------------------------------------------------
    def metrics_for(self, config: EngineConfig) -> MetricNames:
        """The metric names the engine serving ``config`` exposes (:attr:`metrics`; the simulator
        serves those of the engine it stands in for)."""
        return self.metrics

    def version(self) -> str | None:
        """The installed engine's version on this node, ``None`` when it is not installed."""
        from orchestrator.hostinfo import package_version

        return package_version(self.package) if self.package else None

    def gpu_request(self, config: EngineConfig, *, share_gpu: bool) -> float:
        """GPUs to reserve for one engine (Tune trials and Serve replicas alike): ``tp`` whole GPUs,
        or with ``share_gpu`` (tp = 1 only) the share of one GPU the engine may fill."""
        from orchestrator.config import SHARED_GPU_HEADROOM

        if share_gpu and config.tp == 1:
            return min(1.0, round(config.memory_fraction + SHARED_GPU_HEADROOM, 4))
        return config.tp

    def __repr__(self) -> str:
        return f"<engine backend {self.name!r}>"


def get_backend(name: str) -> EngineBackend:
    """The backend registered as ``name``; an unknown name is a :class:`ConfigError` listing the known."""
    try:
        return _REGISTRY[str(getattr(name, "value", name))]
    except KeyError:
        raise ConfigError(f"unknown engine backend {name!r}; known: {known_backends()}") from None


def known_backends(*, simulatable: bool | None = None) -> list[str]:
    """Registered backend names, sorted; ``simulatable=True``: only the engines (not the simulator)."""
    return sorted(n for n, b in _REGISTRY.items() if simulatable is None or b.simulated is not simulatable)


def compact_json(value: Any) -> str:
    """JSON as engines take it on a command line: no spaces, keys in their given order."""
    return json.dumps(value, separators=(",", ":"))
