"""`EngineConfig`: what engine to start, validated once at the edge; the engine family it names
(:mod:`orchestrator.backends`) turns it into a command line.

A config is frozen and hashable so it can key caches, dedupe search-space points and name Serve
deployments. Two configs that would start the same engine command are equal and have equal keys
(e.g. ``num_draft_tokens`` is normalised to 0 when speculation is off).

What an engine makes of a field (flags, the memory fraction's meaning, speculation support) is its
backend's fact, not this module's: a config asks :attr:`EngineConfig.engine` to refuse what that engine
would run as something else (e.g. speculation on LMDeploy's TurboMind) and to render its command.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.backends import get_backend, known_backends
from orchestrator.backends.lmdeploy import (
    FLAG_TABLE,
    TURBOMIND_HAS_NO_SPECULATION,
    FlagSpec,
)
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.backends import EngineBackend

__all__ = [
    "Backend",
    "EngineConfig",
    "FlagSpec",
    "SpeculativeAlgorithm",
    "FLAG_TABLE",
    "MAX_DRAFT_TOKENS",
    "SHARED_GPU_HEADROOM",
    "API_DEFAULT_TEMPERATURE",
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
    """Names of the engines this project ships, for code that spells one. A config's ``backend`` is a
    plain string, any name registered in :mod:`orchestrator.backends` (which is what knows engines)."""

    PYTORCH = "pytorch"
    TURBOMIND = "turbomind"
    VLLM = "vllm"
    SIM = "sim"


class _DefaultTemperatures(Mapping[str, float]):
    """Backend name -> the temperature its OpenAI endpoints use when a request gives none
    (:attr:`EngineBackend.default_temperature`): a request without ``temperature`` is sampled, not
    greedy, so the router must know which band it falls in."""

    def __getitem__(self, name: str) -> float:
        return get_backend(name).default_temperature

    def __iter__(self) -> Iterator[str]:
        return iter(known_backends())

    def __len__(self) -> int:
        return len(known_backends())


API_DEFAULT_TEMPERATURE: Mapping[str, float] = _DefaultTemperatures()


class SpeculativeAlgorithm(str, enum.Enum):
    QWEN3_5_MTP = "qwen3_5_mtp"


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration.

    Args:
        backend: a registered engine backend (:func:`orchestrator.backends.known_backends`):
            ``pytorch`` | ``turbomind`` (LMDeploy) | ``vllm`` | ``sim``.
        model: checkpoint path (a real engine) or simulator profile name / path (``sim``).
        tp: tensor-parallel degree = GPUs the engine needs.
        speculative_algorithm: ``qwen3_5_mtp`` or ``None`` (speculation off).
        num_draft_tokens: tokens drafted per step (LMDeploy ``--speculative-num-draft-tokens``);
            0 iff speculation is off.
        memory_fraction: the engine's memory flag (:attr:`EngineBackend.memory_flag`): LMDeploy's share
            of free GPU memory for KV cache, vLLM's share of the whole GPU.
        max_batch_size: concurrent sequences the engine schedules; ``None`` lets the engine choose.
        session_len: max tokens of one sequence (prompt + output); ``None`` = model's context.
        max_prefill_tokens: max tokens per prefill iteration (``--max-prefill-token-num``).
        extra_flags: further command-line flags passed through verbatim (kept in the key).
        simulated_backend: backend ``sim`` only: the engine the simulator stands in for (any
            registered real engine, e.g. ``turbomind`` or ``vllm``) or ``None`` (LMDeploy's PyTorch
            engine; ``"pytorch"`` is normalised to ``None``, so every sim config written before this
            field existed keeps its key). Rendered as the simulator's ``--backend``.
        draft_schedule: the draft length per batch size, ``((first, last, draft tokens), ...)`` from
            batch size 1 (0 = no drafting there; the longest is ``num_draft_tokens``), for engines that
            change it inside one engine (vLLM's ``num_speculative_tokens_per_batch_size``; the sweep
            writes it, :mod:`tuning.schedule`). ``None``: ``num_draft_tokens`` at every batch size.
    """

    backend: str = "pytorch"
    model: str = ""
    tp: int = 1
    speculative_algorithm: SpeculativeAlgorithm | None = None
    num_draft_tokens: int = 0
    memory_fraction: float = 0.8
    max_batch_size: int | None = None
    session_len: int | None = None
    max_prefill_tokens: int = 8192
    extra_flags: tuple[str, ...] = field(default_factory=tuple)
    simulated_backend: str | None = None
    draft_schedule: tuple[tuple[int, int, int], ...] | None = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("backend", get_backend(self.backend).name)  # unknown: an error listing the known ones
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
            real = known_backends(simulatable=True)
            if str(getattr(self.simulated_backend, "value", self.simulated_backend)) not in real:
                raise ConfigError(f"simulated_backend={self.simulated_backend!r} is invalid; allowed: {real} or None")
            simulated = get_backend(self.simulated_backend).name
            if not self.simulated:
                raise ConfigError(f"simulated_backend={simulated!r} applies to backend 'sim' only, not "
                                  f"{self.backend!r}")
            set_("simulated_backend", None if simulated == Backend.PYTORCH else simulated)

        if self.draft_schedule is not None:
            if self.speculative_algorithm is None:
                raise ConfigError("draft_schedule is set with speculation off; set speculative_algorithm too")
            set_("draft_schedule", tuple(tuple(int(x) for x in r) for r in self.draft_schedule))
        if self.speculative_algorithm is None:
            if self.num_draft_tokens not in (0,):
                # Normalise rather than reject: "spec off, 3 drafts" and "spec off" are one engine.
                set_("num_draft_tokens", 0)
        else:
            if not get_backend(self.engine_name).supports_speculation:
                where = f"backend={self.backend!r}" if not self.simulated else \
                    f"backend='sim', simulated_backend={self.simulated_backend!r}"
                reason = get_backend(self.engine_name).no_speculation_reason
                raise ConfigError(f"speculative_algorithm is set with {where}: {reason}")
            if self.num_draft_tokens < 1:
                raise ConfigError(
                    f"num_draft_tokens={self.num_draft_tokens} with speculative_algorithm="
                    f"{self.speculative_algorithm.value!r}; allowed: 1..{MAX_DRAFT_TOKENS}"
                )
        self.engine.check_config(self)

    # ----- identity -------------------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def engine(self) -> EngineBackend:
        """The backend that runs this config (the simulator for a simulated one)."""
        return get_backend(self.backend)

    @property
    def simulated(self) -> bool:
        """A simulated engine: no GPU, never a GPU figure."""
        return self.engine.simulated

    @property
    def engine_name(self) -> str:
        """The real engine this config runs, or stands in for when simulated (the ``engine`` of rows
        and tables)."""
        if self.simulated:
            return self.simulated_backend or Backend.PYTORCH.value
        return self.backend

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (enums as strings, tuples as lists). ``simulated_backend`` only when set: it
        came after keys were published, and a config without it must keep its key; so does
        ``draft_schedule``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("simulated_backend", "draft_schedule") and v is None:
                continue
            if isinstance(v, enum.Enum):
                v = v.value
            elif isinstance(v, tuple):
                v = [list(x) if isinstance(x, tuple) else x for x in v]
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
        spec = (f"mtp{self.num_draft_tokens}" + ("sched" if self.draft_schedule else "")) if self.speculative \
            else "nospec"
        bs = f"bs{self.max_batch_size}" if self.max_batch_size is not None else "bsauto"
        backend = self.backend + (f"-{self.simulated_backend}" if self.simulated_backend else "")
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
        return self.engine.gpu_request(self, share_gpu=share_gpu)

    # ----- command line ---------------------------------------------------------------------------
    def command(self, *, host: str, port: int, served_model_name: str | None = None) -> list[str]:
        """The engine's command line (:meth:`EngineBackend.command`)."""
        return self.engine.command(self, host=host, port=port, served_model_name=served_model_name)


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not (lo <= value <= hi):
        raise ConfigError(f"{name}={value!r} is out of range; allowed: integers {lo}..{hi}")

