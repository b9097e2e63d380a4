"""`EngineConfig`: what engine to start, validated once at the edge, and the one table that turns it
into a command line.

A config is frozen and hashable so it can key caches, dedupe search-space points and name Serve
deployments. Two configs that would start the same engine command are equal and have equal keys
(e.g. ``num_draft_tokens`` is normalised to 0 when speculation is off).

LMDeploy 0.18 facts this module encodes:

- MTP (``--speculative-algorithm qwen3_5_mtp``) exists only in the PyTorch engine; TurboMind ignores
  speculation with a warning, so ``backend="turbomind"`` with speculation is rejected here rather
  than silently measured as a non-speculative engine. A simulated engine standing in for TurboMind
  (``backend="sim", simulated_backend="turbomind"``) is refused the same way.
- LMDeploy has one draft knob, ``--speculative-num-draft-tokens`` (the draft model runs that many
  steps), so "num steps" and "draft tokens" of other engines' guides collapse into it.
- ``--cache-max-entry-count`` is the fraction of *free* GPU memory (after weights) given to the KV
  cache.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ConfigError

__all__ = [
    "Backend",
    "EngineConfig",
    "FlagSpec",
    "SpeculativeAlgorithm",
    "FLAG_TABLE",
    "MAX_DRAFT_TOKENS",
    "SHARED_GPU_HEADROOM",
    "SIMULATED_BACKENDS",
    "TURBOMIND_HAS_NO_SPECULATION",
    "gpus_needed",
]

MAX_DRAFT_TOKENS = 8
"""Upper bound for ``num_draft_tokens``; acceptance past ~5 drafted tokens is negligible for MTP heads."""

SHARED_GPU_HEADROOM = 0.1
"""Share of a GPU a shared tp=1 engine reserves besides its KV fraction: weights, activations, CUDA
graphs and the MTP head of a *small* model (14 GiB of an H200). See :meth:`EngineConfig.gpu_request`."""


_GPU_UNITS = 10_000
"""Ray accounts a GPU in units of 1/10,000 (fractional requests are rounded to 4 decimals), so packing
in these integer units is exact where float sums are not (0.7 + 0.2 + 0.1 != 1.0)."""


def gpus_needed(requests: Iterable[float], *, placed_first: Iterable[float] = ()) -> int:
    """How many GPUs of capacity 1 hold these GPU requests, one per engine replica
    (:meth:`EngineConfig.gpu_request`); the requests fit ``N`` GPUs iff this is ``<= N``.

    A plain sum is wrong: three shared replicas of 0.6 sum to 1.8 but need 3 GPUs, because Ray places
    a fractional request (< 1) on a single GPU, never split across two, and gives a request of one or
    more GPUs only GPUs with nothing else on them. So whole requests take whole GPUs and fractional
    ones are bin-packed first-fit decreasing. That is a heuristic, on both sides: FFD may open a GPU
    more than an optimal packing (at most 11/9 of the optimum, + 1), and Ray fits each fractional
    request into a GPU with room as the replicas come, in no set order, which on awkward mixes can
    take more GPUs than FFD: a check before deploying, not a guarantee. Node boundaries
    are not modelled (a tp=2 request needs both GPUs on one node): ``N`` GPUs are one pool.

    ``placed_first``: requests already running (an update's old engines). They are packed first, FFD
    standing in for where they sit, and ``requests`` go into the room they leave: a new replica cannot
    use the better packing that moving a running one would allow.
    """
    whole_first, first = _split_units(placed_first)
    whole, fractions = _split_units(requests)
    free = _first_fit_decreasing(fractions, _first_fit_decreasing(first, []))
    return whole_first + whole + len(free)


def _split_units(requests: Iterable[float]) -> tuple[int, list[int]]:
    """(whole GPUs, fractional requests in Ray's 1/10,000 units) of GPU requests, validated."""
    whole = 0
    fractions: list[int] = []
    for r in requests:
        units = round(float(r) * _GPU_UNITS)
        if units < 0:
            raise ValueError(f"a GPU request must be >= 0, got {r!r}")
        if units >= _GPU_UNITS:
            if units % _GPU_UNITS:
                raise ValueError(f"a GPU request above 1 must be a whole number of GPUs (as in Ray), got {r!r}")
            whole += units // _GPU_UNITS
        elif units:
            fractions.append(units)
    return whole, fractions


def _first_fit_decreasing(fractions: list[int], free: list[int]) -> list[int]:
    """``free`` (units left on each GPU opened for fractional requests) after placing ``fractions``."""
    free = list(free)
    for units in sorted(fractions, reverse=True):
        for i, left in enumerate(free):
            if units <= left:
                free[i] = left - units
                break
        else:
            free.append(_GPU_UNITS - units)
    return free


class Backend(str, enum.Enum):
    """Which engine serves the model."""

    PYTORCH = "pytorch"
    """LMDeploy's PyTorch engine: the only one with MTP speculative decoding in 0.18."""
    TURBOMIND = "turbomind"
    """LMDeploy's TurboMind engine: no speculation."""
    SIM = "sim"
    """The simulated engine (:mod:`orchestrator.sim`): a performance model, no GPU, never a GPU figure."""


API_DEFAULT_TEMPERATURE: dict[Backend, float] = {Backend.PYTORCH: 0.7, Backend.TURBOMIND: 0.7, Backend.SIM: 1.0}
"""The sampling temperature an engine's OpenAI endpoints use when a request gives none (LMDeploy 0.18's
``ChatCompletionRequest`` / ``CompletionRequest`` default 0.7; the simulator's 1.0). A request without
``temperature`` is sampled, not greedy, so the router must know which band it falls in."""


TURBOMIND_HAS_NO_SPECULATION = (
    "LMDeploy 0.18's TurboMind engine ignores speculative decoding (it only logs a warning), so this config "
    "would silently run without MTP. Use backend='pytorch' for MTP, or speculative_algorithm=None for TurboMind."
)
"""Why speculation with TurboMind is refused: by :class:`EngineConfig` and by the simulated engine alike."""

SIMULATED_BACKENDS = (Backend.PYTORCH, Backend.TURBOMIND)
"""The LMDeploy engines the simulator can stand in for (``EngineConfig.simulated_backend``)."""


class SpeculativeAlgorithm(str, enum.Enum):
    QWEN3_5_MTP = "qwen3_5_mtp"


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration.

    Args:
        backend: ``pytorch`` | ``turbomind`` | ``sim``.
        model: checkpoint path (LMDeploy) or simulator profile name / path (``sim``).
        tp: tensor-parallel degree = GPUs the engine needs.
        speculative_algorithm: ``qwen3_5_mtp`` or ``None`` (speculation off).
        num_draft_tokens: tokens drafted per step (LMDeploy ``--speculative-num-draft-tokens``);
            0 iff speculation is off.
        memory_fraction: LMDeploy ``--cache-max-entry-count``: share of free GPU memory for KV cache.
        max_batch_size: concurrent sequences the engine schedules; ``None`` lets the engine choose.
        session_len: max tokens of one sequence (prompt + output); ``None`` = model's context.
        max_prefill_tokens: max tokens per prefill iteration (``--max-prefill-token-num``).
        extra_flags: further command-line flags passed through verbatim (kept in the key).
        simulated_backend: backend ``sim`` only: the LMDeploy engine the simulator stands in for,
            ``turbomind`` or ``None`` (the PyTorch engine; ``"pytorch"`` is normalised to ``None``, so
            every sim config written before this field existed keeps its key). Rendered as the
            simulator's ``--backend``, like LMDeploy's.
    """

    backend: Backend = Backend.PYTORCH
    model: str = ""
    tp: int = 1
    speculative_algorithm: SpeculativeAlgorithm | None = None
    num_draft_tokens: int = 0
    memory_fraction: float = 0.8
    max_batch_size: int | None = None
    session_len: int | None = None
    max_prefill_tokens: int = 8192
    extra_flags: tuple[str, ...] = field(default_factory=tuple)
    simulated_backend: Backend | None = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        try:
            set_("backend", Backend(self.backend))
        except ValueError:
            raise ConfigError(
                f"backend={self.backend!r} is invalid; allowed: {[b.value for b in Backend]}"
            ) from None
        if self.speculative_algorithm in (None, "", "none"):
            set_("speculative_algorithm", None)
        else:
            try:
                set_("speculative_algorithm", SpeculativeAlgorithm(self.speculative_algorithm))
            except ValueError:
                raise ConfigError(
                    f"speculative_algorithm={self.speculative_algorithm!r} is invalid; allowed: "
                    f"{[a.value for a in SpeculativeAlgorithm]} or None"
                ) from None
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("model must be a non-empty checkpoint path (or simulator profile for backend 'sim')")
        _check_int("tp", self.tp, 1, 64)
        _check_int("num_draft_tokens", self.num_draft_tokens, 0, MAX_DRAFT_TOKENS)
        if not isinstance(self.memory_fraction, (int, float)) or isinstance(self.memory_fraction, bool) or not (
            0.0 < float(self.memory_fraction) <= 0.99
        ):
            raise ConfigError(f"memory_fraction={self.memory_fraction!r} is out of range; allowed: (0, 0.99]")
        set_("memory_fraction", round(float(self.memory_fraction), 4))
        if self.max_batch_size is not None:
            _check_int("max_batch_size", self.max_batch_size, 1, 4096)
        if self.session_len is not None:
            _check_int("session_len", self.session_len, 64, 2_097_152)
        _check_int("max_prefill_tokens", self.max_prefill_tokens, 16, 1_048_576)
        if isinstance(self.extra_flags, str) or not all(isinstance(f, str) for f in self.extra_flags):
            raise ConfigError("extra_flags must be a sequence of strings, e.g. ['--eager-mode']")
        set_("extra_flags", tuple(self.extra_flags))
        if self.simulated_backend is not None:
            try:
                simulated = Backend(self.simulated_backend)
            except ValueError:
                simulated = None
            if simulated not in SIMULATED_BACKENDS:
                raise ConfigError(f"simulated_backend={self.simulated_backend!r} is invalid; allowed: "
                                  f"{[b.value for b in SIMULATED_BACKENDS]} or None")
            if self.backend is not Backend.SIM:
                raise ConfigError(f"simulated_backend={simulated.value!r} applies to backend 'sim' only, not "
                                  f"{self.backend.value!r}")
            set_("simulated_backend", None if simulated is Backend.PYTORCH else simulated)

        if self.speculative_algorithm is None:
            if self.num_draft_tokens not in (0,):
                # Normalise rather than reject: "spec off, 3 drafts" and "spec off" are one engine.
                set_("num_draft_tokens", 0)
        else:
            if self.engine_backend is Backend.TURBOMIND:
                where = "backend='turbomind'" if self.backend is Backend.TURBOMIND else \
                    "backend='sim', simulated_backend='turbomind'"
                raise ConfigError(f"speculative_algorithm is set with {where}: {TURBOMIND_HAS_NO_SPECULATION}")
            if self.num_draft_tokens < 1:
                raise ConfigError(
                    f"num_draft_tokens={self.num_draft_tokens} with speculative_algorithm="
                    f"{self.speculative_algorithm.value!r}; allowed: 1..{MAX_DRAFT_TOKENS}"
                )

    # ----- identity -------------------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def engine_backend(self) -> Backend:
        """The LMDeploy engine this config runs, or stands in for when simulated."""
        if self.backend is Backend.SIM:
            return self.simulated_backend or Backend.PYTORCH
        return self.backend

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (enums as strings, tuples as lists). ``simulated_backend`` only when set: it
        came after keys were published, and a config without it must keep its key."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "simulated_backend" and v is None:
                continue
            if isinstance(v, enum.Enum):
                v = v.value
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineConfig:
        """Build from a dict (e.g. JSON); unknown keys are an error naming them."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"an engine config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown engine config field(s) {unknown}; known: {sorted(known)}")
        kwargs = dict(data)
        if "extra_flags" in kwargs and isinstance(kwargs["extra_flags"], list):
            kwargs["extra_flags"] = tuple(kwargs["extra_flags"])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def key(self) -> str:
        """Stable identity: readable prefix + hash of the canonical JSON. Equal configs, equal keys."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canon.encode()).hexdigest()[:10]
        return f"{self.label()}-{digest}"

    def label(self) -> str:
        """Short human label, e.g. ``pytorch-mtp4-mem0.8-bs256-tp1``. Not unique; use :meth:`key`."""
        spec = f"mtp{self.num_draft_tokens}" if self.speculative else "nospec"
        bs = f"bs{self.max_batch_size}" if self.max_batch_size is not None else "bsauto"
        backend = self.backend.value + (f"-{self.simulated_backend.value}" if self.simulated_backend else "")
        return f"{backend}-{spec}-mem{self.memory_fraction:g}-{bs}-tp{self.tp}"

    # ----- resources ------------------------------------------------------------------------------
    def gpu_request(self, *, share_gpu: bool = False) -> float:
        """GPUs to reserve on the Ray cluster for this engine (Tune trials and Serve replicas alike).

        Normally ``tp`` whole GPUs. With ``share_gpu`` a tp=1 engine reserves
        ``memory_fraction + SHARED_GPU_HEADROOM`` of one GPU, so Ray co-schedules engines on a GPU
        only while their fractions fit together: engines that start at the same moment each see the
        whole GPU free and each take ``memory_fraction`` of it for KV, so the reservations must not
        add up to more than the GPU. Meant for models much smaller than the GPU (test checkpoints,
        capacity planning); a production model's weights alone exceed the headroom. The simulator
        needs no GPU.
        """
        if self.backend is Backend.SIM:
            return 0
        if share_gpu and self.tp == 1:
            return min(1.0, round(self.memory_fraction + SHARED_GPU_HEADROOM, 4))
        return self.tp

    # ----- command line ---------------------------------------------------------------------------
    def command(self, *, host: str, port: int, served_model_name: str | None = None) -> list[str]:
        """The engine's command line, built from :data:`FLAG_TABLE` (the one mapping of config to flags)."""
        if self.backend is Backend.SIM:
            argv = [sys.executable, "-m", "orchestrator.sim", "--profile", self.model]
        else:
            # ``python -m lmdeploy`` rather than the ``lmdeploy`` script: installs without console
            # scripts (``pip --target``, some images) have the module but not the executable.
            argv = [sys.executable, "-m", "lmdeploy", "serve", "api_server", self.model, "--backend", self.backend.value]
        argv += ["--server-name", host, "--server-port", str(port)]
        if served_model_name:
            argv += ["--model-name", served_model_name]
        for spec in FLAG_TABLE:
            if self.backend not in spec.backends:
                continue
            value = getattr(self, spec.field)
            argv += spec.render(value)
        argv += list(self.extra_flags)
        return argv


@dataclass(frozen=True)
class FlagSpec:
    """How one config field becomes command-line flags, and for which backends."""

    field: str
    flag: str
    backends: frozenset[Backend]
    format: Callable[[Any], str | None] = str
    """Value -> flag argument; ``None`` omits the flag (engine default)."""

    def render(self, value: Any) -> list[str]:
        if value is None:
            return []
        arg = self.format(value)
        return [] if arg is None else [self.flag, arg]


_ALL = frozenset(Backend)
_LMDEPLOY = frozenset({Backend.PYTORCH, Backend.TURBOMIND})
_SPEC = frozenset({Backend.PYTORCH, Backend.SIM})
_SIM = frozenset({Backend.SIM})

FLAG_TABLE: tuple[FlagSpec, ...] = (
    # LMDeploy's own --backend comes first in EngineConfig.command(); the simulator gets the engine it
    # stands in for, and only when that is not the PyTorch engine (its default), so commands stay as they were.
    FlagSpec("simulated_backend", "--backend", _SIM, lambda v: v.value),
    FlagSpec("tp", "--tp", _ALL),
    FlagSpec("memory_fraction", "--cache-max-entry-count", _ALL, lambda v: f"{v:g}"),
    FlagSpec("max_batch_size", "--max-batch-size", _ALL),
    FlagSpec("session_len", "--session-len", _ALL),
    FlagSpec("max_prefill_tokens", "--max-prefill-token-num", _ALL),
    FlagSpec("speculative_algorithm", "--speculative-algorithm", _SPEC, lambda v: v.value),
    # Only rendered when speculation is on: num_draft_tokens is normalised to 0 otherwise.
    FlagSpec("num_draft_tokens", "--speculative-num-draft-tokens", _SPEC, lambda v: str(v) if v else None),
)
"""The single mapping of config fields to engine flags (LMDeploy ``serve api_server`` names; the
simulated engine accepts the same names so one table serves both)."""


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not (lo <= value <= hi):
        raise ConfigError(f"{name}={value!r} is out of range; allowed: integers {lo}..{hi}")

