"""The search space over engine configs: conditional, finite, and deduplicated by engine command.

Knobs (one Optuna parameter each):

- ``speculative`` — MTP on/off.
- ``num_draft_tokens`` — only when ``speculative`` is on (a define-by-run space, so TPE never sees a
  draft value for a non-speculative trial). LMDeploy has ONE draft knob,
  ``--speculative-num-draft-tokens``: the MTP head drafts that many tokens per step. Guides written
  for sglang name two numbers, ``--speculative-num-steps k`` and ``--speculative-num-draft-tokens
  k+1`` (sglang counts the verified root token too). They describe the same engine: **sglang
  (steps=k, draft_tokens=k+1) == LMDeploy num_draft_tokens=k**; see :func:`from_sglang`.
- ``memory_fraction`` — LMDeploy ``--cache-max-entry-count``.
- ``max_batch_size``.
- ``backend`` — the engine with MTP off, only when more than one is allowed (``off_backends``:
  LMDeploy's ``pytorch`` and ``turbomind``, ``vllm``).
- ``spec_backend`` — the engine with MTP on, only when more than one is allowed (``spec_backends``: the
  engines that speculate, ``pytorch`` and ``vllm``). Together the two are the sweep's engine axis: a
  space holding both engine families measures both, and the table may mix them. With the simulator
  they pick the engine the simulator stands in for (``EngineConfig.simulated_backend``): its profile's
  constants for that engine, its flag and metric names.

Every knob is a finite tuple of values, so the space can be enumerated (:meth:`SearchSpace.grid`,
used by the Optuna-vs-grid benchmark) and two points that render the same engine command are
recognised by :meth:`EngineConfig.key`. Arithmetic progressions are offered to Optuna as stepped
int/float distributions (TPE then models their order); anything else as a categorical.

Named points (the baselines, and test points that carry ``extra_flags`` such as a simulator fault)
are enqueued into the Optuna study with ``user_attrs`` ``{"role": ..., "extra_flags": [...],
"fixed": {...}}``; the define-by-run function returns those attributes as constants so they reach
the trial's config. A space that offers TurboMind next to the PyTorch engine also gets one TurboMind
point after the baselines (:meth:`SearchSpace.with_baselines`), so the engine choice is measured in
every such sweep rather than left to the searcher's luck in a few trials. A named point's values that lie outside the space (say the static
recommendation's memory fraction 0.8 when the user searches 0.15-0.35) make the whole point
``fixed`` constants rather than suggestions: the baselines are reference points, and widening the searched space to
hold them would make the searcher propose their values too (on a shared GPU a 0.8 trial runs alone).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.backends import get_backend, known_backends
from orchestrator.config import (
    MAX_DRAFT_TOKENS,
    Backend,
    EngineConfig,
    SpeculativeAlgorithm,
)
from orchestrator.errors import ConfigError

__all__ = [
    "BASELINE_ROLES",
    "ROLE_MTP_OFF",
    "ROLE_SEARCH",
    "ROLE_STATIC",
    "NamedPoint",
    "SearchSpace",
    "from_sglang",
    "to_sglang",
]

ROLE_SEARCH = "search"
ROLE_MTP_OFF = "baseline_mtp_off"
ROLE_STATIC = "baseline_static"
BASELINE_ROLES = {ROLE_MTP_OFF: "mtp_off", ROLE_STATIC: "static"}
"""Trial role -> key used in the routing table's ``baselines`` / ``gains``."""

STATIC_NUM_DRAFT_TOKENS = 4
STATIC_MEMORY_FRACTION = 0.8
"""The published static recommendation: ``--speculative-algorithm qwen3_5_mtp
--speculative-num-draft-tokens 4 --cache-max-entry-count 0.8``."""

PARAM_NAMES = ("speculative", "backend", "spec_backend", "num_draft_tokens", "memory_fraction", "max_batch_size")


def from_sglang(num_steps: int, num_draft_tokens: int) -> int:
    """LMDeploy ``num_draft_tokens`` for an sglang-style (steps, draft tokens) pair.

    sglang (EAGLE/MTP, topk 1) verifies ``num_steps + 1`` tokens per step: the drafted ones plus the
    root. LMDeploy's single knob counts drafted tokens only, so the pair maps to ``num_steps``.
    """
    if num_draft_tokens != num_steps + 1:
        raise ConfigError(
            f"sglang-style speculation with num_steps={num_steps} expects num_draft_tokens={num_steps + 1} "
            f"(steps + 1, topk 1), got {num_draft_tokens}; LMDeploy has one knob, so give it num_steps"
        )
    if not 1 <= num_steps <= MAX_DRAFT_TOKENS:
        raise ConfigError(f"num_steps={num_steps} is out of range; allowed: 1..{MAX_DRAFT_TOKENS}")
    return num_steps


def to_sglang(num_draft_tokens: int) -> tuple[int, int]:
    """(steps, draft tokens) as sglang guides write them for LMDeploy ``num_draft_tokens``."""
    return num_draft_tokens, num_draft_tokens + 1


@dataclass(frozen=True)
class NamedPoint:
    """A point evaluated before the searcher's own suggestions (a baseline or a test point)."""

    role: str
    params: Mapping[str, Any]
    extra_flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "extra_flags", tuple(self.extra_flags))

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "params": dict(self.params), "extra_flags": list(self.extra_flags)}


def _tuple(name: str, values: Any) -> tuple:
    if isinstance(values, Mapping):  # {low, high, step}
        try:
            low, high, step = values["low"], values["high"], values.get("step", 1)
        except KeyError:
            raise ConfigError(f"space knob {name!r}: a range needs 'low' and 'high' (and optional 'step')") from None
        if step <= 0 or high < low:
            raise ConfigError(f"space knob {name!r}: need low <= high and step > 0, got {dict(values)}")
        n = int(math.floor((high - low) / step + 1e-9)) + 1
        vals = [low + i * step for i in range(n)]
        return tuple(round(v, 4) if isinstance(v, float) else v for v in vals)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        values = [values]
    out = tuple(values)
    if not out:
        raise ConfigError(f"space knob {name!r} has no values; give at least one")
    return out


@dataclass(frozen=True)
class SearchSpace:
    """A finite, conditional space of :class:`EngineConfig` for one model.

    Args:
        engine: ``"sim"`` (simulated engine; backend ``sim``) or ``"lmdeploy"``.
        model: checkpoint path (LMDeploy) or simulator profile.
        tp: tensor-parallel degree (fixed: the node decides it, not the search).
        speculative: allowed MTP switch values, from ``(False, True)``.
        num_draft_tokens: LMDeploy draft tokens tried when MTP is on (sglang steps).
        memory_fraction: ``--cache-max-entry-count`` values.
        max_batch_size: ``--max-batch-size`` values.
        off_backends: engines tried with MTP off, of :func:`orchestrator.backends.known_backends` (for
            ``"sim"``: the engine the simulator stands in for). Default: ``pytorch`` and ``turbomind``
            for real engines, ``pytorch`` for the simulator.
        spec_backends: engines tried with MTP on (those that speculate: ``pytorch``, ``vllm``).
            Default: ``pytorch``.
        session_len, max_prefill_tokens, extra_flags: fixed for every point.
        baseline_memory_fraction: the baselines' ``--cache-max-entry-count`` (LMDeploy's default, 0.8,
            unless a small model shares a GPU: at 0.8 a baseline's engine takes the GPU alone, so neither it
            nor a decide phase's fresh engines of it can start beside another).
        points: named points evaluated first (baselines are added by :meth:`with_baselines`).
    """

    engine: str = "lmdeploy"
    model: str = ""
    tp: int = 8
    speculative: tuple[bool, ...] = (False, True)
    num_draft_tokens: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    memory_fraction: tuple[float, ...] = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
    max_batch_size: tuple[int, ...] = (64, 128, 256)
    off_backends: tuple[str, ...] | None = None
    spec_backends: tuple[str, ...] = ("pytorch",)
    session_len: int | None = None
    max_prefill_tokens: int = 8192
    extra_flags: tuple[str, ...] = ()
    baseline_memory_fraction: float = STATIC_MEMORY_FRACTION
    points: tuple[NamedPoint, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        set_ = lambda n, v: object.__setattr__(self, n, v)  # noqa: E731 (frozen)
        if self.engine not in ("sim", "lmdeploy"):
            raise ConfigError(f"engine={self.engine!r} is invalid; allowed: 'sim', 'lmdeploy'")
        if not self.model:
            raise ConfigError("the search space needs a model (checkpoint path, or simulator profile for 'sim')")
        if self.off_backends is None:
            set_("off_backends", ("pytorch",) if self.engine == "sim" else ("pytorch", "turbomind"))
        for name in ("speculative", "num_draft_tokens", "memory_fraction", "max_batch_size", "off_backends",
                     "spec_backends"):
            set_(name, _tuple(name, getattr(self, name)))
        spec = tuple(_as_bool(v) for v in self.speculative)
        if not set(spec) <= {False, True}:
            raise ConfigError(f"speculative values must be booleans, got {self.speculative}")
        set_("speculative", tuple(sorted(set(spec))))
        set_("num_draft_tokens", tuple(sorted(set(int(v) for v in self.num_draft_tokens))))
        set_("memory_fraction", tuple(sorted(set(round(float(v), 4) for v in self.memory_fraction))))
        set_("max_batch_size", tuple(sorted(set(int(v) for v in self.max_batch_size))))
        real = known_backends(simulatable=True)
        backs = tuple(dict.fromkeys(str(b) for b in self.off_backends))
        bad = [b for b in backs if b not in real]
        if bad:
            raise ConfigError(f"off_backends {bad} invalid; allowed: {real} (for the simulator: the engine it "
                              "stands in for)")
        set_("off_backends", backs)
        specs = tuple(dict.fromkeys(str(b) for b in self.spec_backends))
        speculating = [b for b in real if get_backend(b).supports_speculation]
        bad = [b for b in specs if b not in speculating]
        if bad:
            raise ConfigError(f"spec_backends {bad} invalid; allowed: the engines that speculate, {speculating}")
        set_("spec_backends", specs)
        if self.engine == "sim":
            for name in self.engines:
                _require_sim_constants(self.model, name)
        set_("extra_flags", tuple(self.extra_flags))
        try:
            set_("baseline_memory_fraction", round(float(self.baseline_memory_fraction), 4))
        except (TypeError, ValueError):
            raise ConfigError(f"baseline_memory_fraction={self.baseline_memory_fraction!r} is not a number") from None
        if not 0.0 < self.baseline_memory_fraction <= 1.0:
            raise ConfigError(f"baseline_memory_fraction={self.baseline_memory_fraction}; allowed: 0 < fraction <= 1")
        set_("points", tuple(p if isinstance(p, NamedPoint) else NamedPoint(**p) for p in self.points))
        # Validate every knob value once by building the extreme configs (clear ConfigError on bad input).
        for cfg in self._corner_configs():
            _ = cfg.key()
        for p in self.points:
            self.to_engine_config(p.params, extra_flags=p.extra_flags)

    @property
    def engines(self) -> tuple[str, ...]:
        """Every engine this space can run (the engine axis): MTP-on engines, then MTP-off ones."""
        on = self.spec_backends if True in self.speculative else ()
        off = self.off_backends if False in self.speculative else ()
        return tuple(dict.fromkeys((*on, *off)))

    # ----- construction ------------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], **overrides: Any) -> SearchSpace:
        """Build from a YAML-like mapping (``space:`` section of ``defaults.yaml`` or ``--space FILE``)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"points"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown search-space key(s) {unknown}; known: {sorted(known)}")
        kwargs = {k: v for k, v in data.items() if v is not None}
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        if "extra_flags" in kwargs:
            kwargs["extra_flags"] = tuple(kwargs["extra_flags"])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> SearchSpace:
        return dataclasses.replace(self, **changes)

    def with_baselines(self) -> SearchSpace:
        """This space plus the two baselines as named points (first in the queue):

        - MTP off: the PyTorch engine, memory fraction ``baseline_memory_fraction`` (0.8 by default,
          LMDeploy's default ``--cache-max-entry-count``) and the largest batch size.
        - static recommendation: ``qwen3_5_mtp``, 4 draft tokens, the same memory fraction.

        The searched space is left as it is: values of a baseline outside it become the point's
        fixed constants (:meth:`split_point`), not new choices for the searcher.

        Where the space offers TurboMind next to the PyTorch engine (and MTP off), one TurboMind
        point follows: a search point inside the space (the memory fraction nearest the baselines', the
        largest batch size), so the engine choice is always measured and TPE learns from it.
        """
        bs = max(self.max_batch_size)
        mem = self.baseline_memory_fraction
        off: dict[str, Any] = {"speculative": False, "memory_fraction": mem, "max_batch_size": bs}
        if self.engine != "sim" or self.off_backends != ("pytorch",):
            off["backend"] = "pytorch"
        static = {"speculative": True, "num_draft_tokens": STATIC_NUM_DRAFT_TOKENS, "memory_fraction": mem,
                  "max_batch_size": bs}
        if self.spec_backends != ("pytorch",):
            static = {"speculative": True, "spec_backend": "pytorch", **static}  # the published recommendation's engine
        named = [NamedPoint(ROLE_MTP_OFF, off), NamedPoint(ROLE_STATIC, static)]
        if "turbomind" in self.off_backends and len(self.off_backends) > 1 and False in self.speculative:
            near = min(self.memory_fraction, key=lambda m: (abs(m - mem), m))
            named.append(NamedPoint(ROLE_SEARCH, {"speculative": False, "backend": "turbomind",
                                                  "memory_fraction": near, "max_batch_size": bs}))
        others = tuple(p for p in self.points if p.role not in BASELINE_ROLES and p not in named)
        return self.replace(points=(*named, *others))

    def split_point(self, params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A named point's params as (suggested, fixed). A point inside the space is enqueued whole for
        the searcher (TPE learns from it). A point with any value outside the space is all constants:
        suggesting only its in-space values would credit a score measured at, say, memory fraction
        0.8 to them, and a trial lacking a knob makes Optuna's group decomposition split the knobs
        TPE models jointly; a trial with no parameters is left out of both."""
        return (dict(params), {}) if self._contains(params) else ({}, dict(params))

    def _contains(self, params: Mapping[str, Any]) -> bool:
        """Is every value of ``params`` one the define-by-run function could suggest for this point?"""
        spec = _as_bool(params.get("speculative", False))
        for name, value in params.items():
            if name == "speculative":
                ok = spec in self.speculative
            elif name == "num_draft_tokens":
                ok = spec and int(value) in self.num_draft_tokens
            elif name == "backend":
                ok = not spec and len(self.off_backends) > 1 and value in self.off_backends
            elif name == "spec_backend":
                ok = spec and len(self.spec_backends) > 1 and value in self.spec_backends
            elif name == "memory_fraction":
                ok = round(float(value), 4) in self.memory_fraction
            elif name == "max_batch_size":
                ok = int(value) in self.max_batch_size
            else:
                ok = False
            if not ok:
                return False
        return True

    # ----- points -> configs ---------------------------------------------------------------------------
    def to_engine_config(self, params: Mapping[str, Any], *, extra_flags: Sequence[str] = ()) -> EngineConfig:
        """The engine config for a point (``params`` as the define-by-run function suggests them)."""
        unknown = sorted(set(params) - set(PARAM_NAMES))
        if unknown:
            raise ConfigError(f"unknown search parameter(s) {unknown}; known: {list(PARAM_NAMES)}")
        spec = _as_bool(params.get("speculative", False))
        engine = params.get("spec_backend", self.spec_backends[0]) if spec else \
            params.get("backend", self.off_backends[0])
        return EngineConfig(
            backend=Backend.SIM if self.engine == "sim" else engine,
            simulated_backend=engine if self.engine == "sim" else None,
            model=self.model,
            tp=self.tp,
            speculative_algorithm=SpeculativeAlgorithm.QWEN3_5_MTP if spec else None,
            num_draft_tokens=int(params.get("num_draft_tokens", 0)) if spec else 0,
            memory_fraction=float(params.get("memory_fraction", STATIC_MEMORY_FRACTION)),
            max_batch_size=(int(params["max_batch_size"]) if params.get("max_batch_size") is not None else None),
            session_len=self.session_len,
            max_prefill_tokens=self.max_prefill_tokens,
            extra_flags=(*self.extra_flags, *extra_flags),
        )

    def config_from_trial_config(self, trial_config: Mapping[str, Any]) -> EngineConfig:
        """The engine config for a Tune trial's config (search params + ``extra_flags`` constant)."""
        params = {k: v for k, v in trial_config.items() if k in PARAM_NAMES}
        return self.to_engine_config(params, extra_flags=tuple(trial_config.get("extra_flags") or ()))

    def grid(self) -> list[tuple[dict[str, Any], EngineConfig]]:
        """Every distinct engine config of the space (deduplicated by key), with one params dict each."""
        seen: dict[str, tuple[dict[str, Any], EngineConfig]] = {}
        for spec in self.speculative:
            drafts: Sequence[int | None] = self.num_draft_tokens if spec else (None,)
            choices = self.spec_backends if spec else self.off_backends
            backends: Sequence[str | None] = (None,) if len(choices) == 1 else choices
            for d, b, mem, bs in itertools.product(drafts, backends, self.memory_fraction, self.max_batch_size):
                params: dict[str, Any] = {"speculative": spec}
                if b is not None:
                    params["spec_backend" if spec else "backend"] = b
                if d is not None:
                    params["num_draft_tokens"] = d
                params.update(memory_fraction=mem, max_batch_size=bs)
                cfg = self.to_engine_config(params)
                seen.setdefault(cfg.key(), (params, cfg))
        return list(seen.values())

    def _corner_configs(self) -> list[EngineConfig]:
        out = [self.to_engine_config({"speculative": False, "memory_fraction": m, "max_batch_size": bs, "backend": b})
               for m in (self.memory_fraction[0], self.memory_fraction[-1])
               for bs in (self.max_batch_size[0], self.max_batch_size[-1])
               for b in self.off_backends]
        if True in self.speculative:
            out += [self.to_engine_config({"speculative": True, "num_draft_tokens": d, "memory_fraction": 0.8,
                                           "spec_backend": b})
                    for d in (self.num_draft_tokens[0], self.num_draft_tokens[-1]) for b in self.spec_backends]
        return out

    # ----- Optuna define-by-run ------------------------------------------------------------------------
    def __call__(self, trial: Any) -> dict[str, Any] | None:
        """Define-by-run space for an Optuna trial (:mod:`tuning.sweep.searcher`): suggests only the knobs that apply.

        Returns the named point's constants (``role``, ``extra_flags``) from the trial's user
        attributes, so a baseline or fault-test point keeps its tag in the Tune trial config.
        """
        attrs = getattr(trial, "user_attrs", None) or {}
        fixed = attrs.get("fixed") or {}

        def value(name: str, choices: tuple) -> Any:
            return fixed[name] if name in fixed else _suggest(trial, name, choices)

        values: dict[str, Any] = {"speculative": _as_bool(value("speculative", self.speculative))}
        if values["speculative"]:
            if len(self.spec_backends) > 1 or "spec_backend" in fixed:
                values["spec_backend"] = value("spec_backend", self.spec_backends)
            values["num_draft_tokens"] = value("num_draft_tokens", self.num_draft_tokens)
        elif len(self.off_backends) > 1 or "backend" in fixed:
            values["backend"] = value("backend", self.off_backends)
        values["memory_fraction"] = value("memory_fraction", self.memory_fraction)
        values["max_batch_size"] = value("max_batch_size", self.max_batch_size)
        # Returned values override the raw suggestions in the Tune config (rounded floats read better).
        return {**values, "role": attrs.get("role", ROLE_SEARCH), "extra_flags": list(attrs.get("extra_flags", []))}

    def size(self) -> int:
        return len(self.grid())

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (written to the run folder)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "points"}
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
        d["points"] = [p.to_dict() for p in self.points]
        return d


def _require_sim_constants(profile_name: str, engine: str) -> None:
    """A simulated engine other than LMDeploy's PyTorch one needs the profile's section for it (e.g.
    ``turbomind``, ``vllm``); say so before any trial starts rather than fail every such trial. A profile
    that does not load is left to the preflight, which lists the shipped ones."""
    from orchestrator.sim.model import SimModelError, load_profile

    try:
        profile = load_profile(profile_name)
    except SimModelError:
        return
    if engine not in profile.backends:
        raise ConfigError(
            f"simulator profile {profile.name!r} has no {engine} constants (its engines: {list(profile.backends)}), "
            f"so it cannot stand in for {engine}; leave {engine} out of the searched engines (--backends, "
            f"--spec-backends) or use a profile with a '{engine}' section"
        )


def _as_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("on", "true", "yes", "1", "off", "false", "no", "0"):
        return v.lower() in ("on", "true", "yes", "1")
    if isinstance(v, (int,)) and v in (0, 1):
        return bool(v)
    raise ConfigError(f"speculative value {v!r} is not a boolean; use true/false (or on/off)")


def _arithmetic_step(values: tuple) -> float | int | None:
    if len(values) < 2 or isinstance(values[0], (bool, str)):
        return None
    steps = {round(b - a, 6) for a, b in zip(values, values[1:])}
    if len(steps) != 1:
        return None
    step = steps.pop()
    return int(step) if all(isinstance(v, int) for v in values) else step


def _suggest(trial: Any, name: str, values: tuple) -> Any:
    """Ordered numeric progressions as stepped distributions (TPE uses their order); else categorical."""
    if len(values) == 1:
        return trial.suggest_categorical(name, list(values))
    step = _arithmetic_step(values)
    if step is not None and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return trial.suggest_int(name, values[0], values[-1], step=step)
    if step is not None:
        v = trial.suggest_float(name, values[0], values[-1], step=step)
        return round(v, 4)
    return trial.suggest_categorical(name, list(values))


def load_space_file(path: str | Path) -> dict[str, Any]:
    """Read a ``--space`` YAML file: either a bare mapping of knobs or one under a ``space:`` key."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read search-space file {path}: {e}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"search-space file {path} must hold a mapping of knobs, got {type(data).__name__}")
    return dict(data)
