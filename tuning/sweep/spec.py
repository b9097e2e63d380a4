"""What defines a sweep: :class:`SweepSpec`, validated when built, from ``defaults.yaml`` + ``--space`` +
CLI flags (:func:`build_spec`) or from a run dir's ``sweep.json`` (:func:`resumed_spec`).

The spec is saved as ``<run_dir>/sweep.json`` so ``--resume`` rebuilds it. Budgets are not in it
(``budget.json``, :mod:`tuning.sweep.budget`): a resumed sweep may get a larger one. How each config
is measured is one :class:`~tuning.sweep.measure.MeasurePlan` built from it (:meth:`SweepSpec.measure_plan`).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.sim.model import DEFAULT_PROFILE
from orchestrator.table import GpuBudget
from tuning.buckets import MIN_MEASURED_WAVES, Bucket, make_buckets
from tuning.choose.constraints import Constraints
from tuning.sweep.measure import MeasurePlan
from tuning.sweep.records import metric_name
from tuning.sweep.space import SearchSpace, load_space_file
from tuning.sweep.trial import TrialContext

__all__ = ["DEFAULTS_PATH", "GPU_BURN_IN_S", "GPU_ROUNDS", "GPU_WARMUP_REQUESTS", "SweepError", "SweepSpec", "build_spec",
           "default_space", "load_defaults", "new_sweep_id", "resumed_spec", "short_measurement_warnings"]

DEFAULTS_PATH = Path(__file__).resolve().parent.parent / "defaults.yaml"


class SweepError(OrchestratorError):
    """The sweep could not run (bad arguments, nothing to resume, Ray unavailable)."""


def load_defaults(path: str | Path = DEFAULTS_PATH) -> dict[str, Any]:
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SweepError(f"cannot read sweep defaults {path}: {e}") from None


GPU_ROUNDS = 3
"""Rounds of every bucket per engine on real engines (``--repeats``): one wave of a real engine moves
12-17 % from the next, so a figure measured once cannot tell configs a few per cent apart, and two
configs are called different only when their intervals over the rounds part — which needs at least two
rounds; three give an interval at all once one round is an outlier. The simulator's figures do not
scatter like that: one round there."""

GPU_BURN_IN_S = 60.0
"""Least seconds of unmeasured full-length load on a fresh real engine before its first measurement
(``--burn-in-s``): an engine can go on speeding up for tens of seconds of load after its first full
waves, and a round 0 still on that slope would be every config's slow round; a minute of load brought
a small model's engine to its steady speed."""

GPU_WARMUP_REQUESTS = 64
"""Warm-up requests per bucket on real engines (one batch at the default concurrency; output capped
by the bench client): measured on the H200, a fresh engine's first batch ran at ~2 s median TTFT vs
~0.7 s once warm (benchmarks/results/gpu_e2e_h200_2026-11-29)."""


@dataclass(frozen=True)
class SweepSpec:
    """Everything that defines a sweep; saved as ``<run_dir>/sweep.json`` so ``--resume`` rebuilds it.

    Budgets are not here (``budget.json``): a resumed sweep may get a larger one.
    """

    sweep_id: str
    run_dir: str
    space: SearchSpace
    buckets: tuple[Bucket, ...]
    objective: str = "scalar"
    seed: int = 0
    max_concurrent_trials: int = 1
    trial_resources: Mapping[str, float] = field(default_factory=lambda: {"cpu": 1, "gpu": 0})
    sim_time_scale: float | None = None
    steady_state: Mapping[str, Any] | None = field(default_factory=lambda: {"rel_tolerance": 0.02})
    steady_state_min_output_len: int = 4096
    constraints: Constraints = Constraints()
    routing_table: str | None = None
    ready_timeout_s: float = 900.0
    request_timeout_s: float = 3600.0
    tokenizer: str | None = None
    n_startup_trials: int = 8
    share_gpu: bool = False
    serve_gpus: int | None = None
    """GPUs the committed table must be servable on (one replica per engine, sharing per
    ``share_gpu``); ``None``: no limit. Decides only the choice, never what is measured."""
    repeats: int = 1
    """Runs of each bucket on the same engine; the lower-median run is kept, all runs are recorded."""
    burn_in: bool = False
    """Run the first bucket's workload once, unmeasured, before measuring (real engines: the first
    full-load run after start-up is slower than the ones after it)."""
    burn_in_s: float = 0.0
    """With ``burn_in``, repeat those runs until they have lasted this long (:data:`GPU_BURN_IN_S`)."""
    decide_rounds: int = 0
    """Rounds each config of a cell comparison left within noise gets on a fresh engine before the table
    is committed (:mod:`tuning.sweep.decide`); 0: none."""
    decide_starts: int = 1
    """Fresh engines per config the ``decide_rounds`` are split over (``decide_rounds / decide_starts``
    rounds on each, the starts of the configs in alternation), so the comparison holds the variation
    between engine starts."""

    def __post_init__(self) -> None:
        if self.share_gpu and self.space.tp != 1:
            raise ConfigError(f"share_gpu needs tp=1 engines (got tp={self.space.tp}): a tp>1 engine owns its GPUs")
        if self.serve_gpus is not None and (not isinstance(self.serve_gpus, int) or self.serve_gpus < 1):
            raise ConfigError(f"serve_gpus={self.serve_gpus!r} must be a whole number of GPUs >= 1")
        if self.serve_gpus is not None and not self.simulated and self.serve_gpus < self.space.tp:
            # Found out only after the whole sweep otherwise.
            raise ConfigError(f"serve_gpus={self.serve_gpus} cannot hold even one engine of tp={self.space.tp}")
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ConfigError(f"repeats={self.repeats!r} must be a whole number >= 1")
        if not isinstance(self.decide_rounds, int) or self.decide_rounds < 0:
            raise ConfigError(f"decide_rounds={self.decide_rounds!r} must be a whole number >= 0")
        if not isinstance(self.decide_starts, int) or isinstance(self.decide_starts, bool) or self.decide_starts < 1:
            raise ConfigError(f"--decide-starts {self.decide_starts!r}: must be a whole number >= 1")
        if self.decide_rounds and self.decide_rounds % self.decide_starts:
            k = self.decide_starts
            raise ConfigError(f"--decide-rounds {self.decide_rounds} does not split evenly over --decide-starts {k}: "
                              f"use a multiple of {k} (e.g. --decide-rounds {max(k, self.decide_rounds // k * k)})")
        if not 0 <= self.burn_in_s < math.inf:
            raise ConfigError(f"burn_in_s={self.burn_in_s!r} must be a finite number of seconds >= 0")
        if self.objective not in ("scalar", "multi"):
            raise ConfigError(f"objective={self.objective!r} is invalid; allowed: 'scalar', 'multi'")
        if self.max_concurrent_trials < 1:
            raise ConfigError(f"max_concurrent_trials={self.max_concurrent_trials} must be >= 1")
        if not self.buckets:
            raise ConfigError("a sweep needs at least one bucket")

    @property
    def simulated(self) -> bool:
        return self.space.engine == "sim"

    def metrics(self) -> list[str]:
        return [metric_name(b.name) for b in self.buckets]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id, "run_dir": self.run_dir, "space": self.space.describe(),
            "buckets": [b.to_dict() for b in self.buckets], "objective": self.objective, "seed": self.seed,
            "max_concurrent_trials": self.max_concurrent_trials, "trial_resources": dict(self.trial_resources),
            "sim_time_scale": self.sim_time_scale,
            "steady_state": dict(self.steady_state) if self.steady_state else None,
            "steady_state_min_output_len": self.steady_state_min_output_len,
            "constraints": self.constraints.to_dict(), "routing_table": self.routing_table,
            "ready_timeout_s": self.ready_timeout_s, "request_timeout_s": self.request_timeout_s,
            "tokenizer": self.tokenizer, "n_startup_trials": self.n_startup_trials,
            "share_gpu": self.share_gpu, "serve_gpus": self.serve_gpus, "repeats": self.repeats,
            "burn_in": self.burn_in, "burn_in_s": self.burn_in_s, "decide_rounds": self.decide_rounds,
            "decide_starts": self.decide_starts,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SweepSpec:
        d = dict(d)
        d["space"] = SearchSpace.from_mapping({k: v for k, v in d["space"].items() if k != "points"}).replace(
            points=tuple(d["space"].get("points", [])))
        d["buckets"] = tuple(Bucket.from_dict(b) for b in d["buckets"])
        d["constraints"] = Constraints(**d.get("constraints", {}))
        return cls(**d)

    def measure_plan(self) -> MeasurePlan:
        """How every trial measures its config (the same for all), whole."""
        return MeasurePlan(time_scale=self.sim_time_scale, steady_state=self.steady_state,
                           steady_state_min_output_len=self.steady_state_min_output_len,
                           ready_timeout_s=self.ready_timeout_s, request_timeout_s=self.request_timeout_s,
                           tokenizer=self.tokenizer, repeats=self.repeats, burn_in=self.burn_in,
                           burn_in_s=self.burn_in_s)

    def trial_context(self, cache_actor: str | None, cache_namespace: str | None) -> TrialContext:
        return TrialContext(sweep_id=self.sweep_id, run_dir=self.run_dir, space=self.space, buckets=self.buckets,
                            plan=self.measure_plan(), cache_actor=cache_actor, cache_namespace=cache_namespace,
                            measure_lease_actor=self.measure_lease_name() if self.share_gpu else None)

    def gpu_budget(self) -> GpuBudget | None:
        """What :func:`~tuning.choose.pick.pick_best` must fit the table into (``None``: no limit)."""
        return None if self.serve_gpus is None else GpuBudget(gpus=self.serve_gpus, share_gpu=self.share_gpu)

    def measure_lease_name(self) -> str:
        return f"mtp-sweep-measure-lease-{self.sweep_id}"

    def resources_for(self, trial_config: Mapping[str, Any]) -> Any:
        """Tune's per-trial resource request: a fixed bundle, or with ``share_gpu`` the share of a
        GPU the trial's engine config asks for (:meth:`EngineConfig.gpu_request`). One bundle, as Tune
        makes of a plain resource dict, so both paths request alike."""
        from ray import tune

        resources = dict(self.trial_resources)
        if self.share_gpu and not self.simulated:
            try:
                resources["gpu"] = self.space.config_from_trial_config(trial_config).gpu_request(share_gpu=True)
            except ConfigError:
                pass  # the trial reports the invalid config itself; it keeps the fixed request
        return tune.PlacementGroupFactory([{"CPU": float(resources.get("cpu", 0)),
                                            "GPU": float(resources.get("gpu", 0))}])


def new_sweep_id() -> str:
    return f"sweep-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _has_vision_tower(model: str) -> bool:
    """Does the checkpoint at ``model`` (a local folder) declare a vision tower?"""
    try:
        with open(Path(model) / "config.json", encoding="utf-8") as f:
            return "vision_config" in json.load(f)
    except (OSError, ValueError):
        return False


def short_measurement_warnings(spec: SweepSpec) -> list[str]:
    """Real-engine buckets measured with fewer than :data:`~tuning.buckets.MIN_MEASURED_WAVES` waves:
    allowed (a quick check, a sweep that must fit a time slot), but their figures are not steady state
    and cannot rank close configs, which the person running the sweep should know before trusting the table."""
    if spec.simulated:
        return []
    return [f"{b.name}: {b.workload.num_prompts} prompts at concurrency {b.primary_concurrency} is "
            f"{b.waves:.3g} wave(s); fewer than {MIN_MEASURED_WAVES} is not a steady-state measurement (on an H200 "
            "one wave read 0.77-1.19x the four-wave figure, CV 12-17 %: docs/analyses/gpu_noise/gpu_noise_h200_2026-11-30.md)"
            for b in spec.buckets if b.waves < MIN_MEASURED_WAVES]


def default_space(defaults: Mapping[str, Any], *, simulated: bool) -> dict[str, Any]:
    """The space ``defaults.yaml`` gives before ``--space`` and flags: its ``space``, with its ``sim`` section's
    over it for a simulated sweep."""
    return {**defaults.get("space", {}), **(defaults.get("sim", {}).get("space", {}) if simulated else {})}


def build_spec(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None,
               cluster_gpus: int = 0, cluster_cpus: int = 2) -> SweepSpec:
    """Defaults (``defaults.yaml``; its ``sim`` section when no ``--model``), then ``--space FILE``,
    then flags."""
    d = dict(defaults if defaults is not None else load_defaults())
    simulated = not args.model
    sim = d.get("sim", {}) if simulated else {}
    space_cfg = default_space(d, simulated=simulated)
    if args.space:
        space_cfg.update(load_space_file(args.space).get("space", None) or load_space_file(args.space))
    overrides = {
        "speculative": args.speculative, "num_draft_tokens": args.num_draft_tokens,
        "memory_fraction": args.memory_fraction, "max_batch_size": args.max_batch_size,
        "off_backends": args.backends, "spec_backends": args.spec_backends,
        "baseline_memory_fraction": args.baseline_memory_fraction,
    }
    space_cfg.update({k: v for k, v in overrides.items() if v is not None})
    tp = args.tp or sim.get("tp") or d.get("tp", 8)
    if simulated:
        space_cfg.update(engine="sim", model=args.sim_profile or sim.get("profile", DEFAULT_PROFILE), tp=tp)
    else:
        space_cfg.update(engine="lmdeploy", model=args.model, tp=tp)
        if _has_vision_tower(args.model) and "--language-model-only" not in space_cfg.get("extra_flags", ()):
            # Qwen3.5-family checkpoints carry a vision_config; LMDeploy then builds the vision tower
            # (memory, start-up) unless told the workload is text only, which ours is.
            space_cfg["extra_flags"] = [*space_cfg.get("extra_flags", ()), "--language-model-only"]
    if args.session_len:
        space_cfg["session_len"] = args.session_len
    space = SearchSpace.from_mapping(space_cfg).with_baselines()

    bcfg = {**d.get("buckets", {}), **sim.get("buckets", {})}
    if args.buckets:
        bcfg["bounds"] = [int(x) for x in args.buckets.split(",")]
    if args.concurrency:
        bcfg["concurrency_levels"] = [int(x) for x in args.concurrency.split(",")]
    if getattr(args, "temperatures", None):
        bcfg["temperatures"] = list(args.temperatures)
    if args.num_prompts:
        bcfg["num_prompts"] = args.num_prompts
    num_prompts = bcfg.get("num_prompts", 256)
    if isinstance(num_prompts, Mapping):
        num_prompts = {int(k): int(v) for k, v in num_prompts.items()}
        bounds = bcfg.get("bounds", [1024, 4096, 8192, 16384])
        missing = [b for b in bounds if b not in num_prompts]
        if missing:
            fallback = max(num_prompts.values())
            num_prompts = {**{b: fallback for b in missing}, **num_prompts}
    buckets = make_buckets(
        bcfg.get("bounds", (1024, 4096, 8192, 16384)), input_len=int(bcfg.get("input_len", 1024)),
        range_ratio=float(bcfg.get("range_ratio", 0.5)), concurrency_levels=bcfg.get("concurrency_levels", (64,)),
        num_prompts=num_prompts, temperature=float(bcfg.get("temperature", 0.0)),
        temperatures=tuple(float(t) for t in bcfg.get("temperatures", ())), seed=int(bcfg.get("seed", 0)),
        dataset=args.dataset or bcfg.get("dataset", "random"), sharegpt_path=args.dataset_path,
        warmup_requests=(args.warmup_requests if args.warmup_requests is not None
                         else int(bcfg.get("warmup_requests", 0 if simulated else GPU_WARMUP_REQUESTS))),
    )
    sweep_cfg = {**d.get("sweep", {}), **sim.get("sweep", {})}
    if simulated:
        resources = {"cpu": 1, "gpu": 0}
        max_conc = args.max_concurrent_trials or min(int(sweep_cfg.get("max_concurrent_trials", 2)),
                                                     max(1, cluster_cpus))
    elif args.share_gpu:
        resources = {"cpu": 1, "gpu": tp}
        # As many as the smallest reservations fit (the baselines' too: a decide phase starts several of
        # them at once); Ray holds back the ones that do not fit now.
        smallest = min(EngineConfig(model=args.model, memory_fraction=f).gpu_request(share_gpu=True)
                       for f in (*space.memory_fraction, space.baseline_memory_fraction))
        max_conc = args.max_concurrent_trials or max(1, int(cluster_gpus / smallest + 1e-9))
    else:
        resources = {"cpu": 1, "gpu": tp}
        max_conc = args.max_concurrent_trials or max(1, cluster_gpus // tp)
    sweep_id = args.sweep_id or new_sweep_id()
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / sweep_id
    steady = d.get("steady_state", {"rel_tolerance": 0.02})
    if args.no_early_stop:
        steady = None
    return SweepSpec(
        sweep_id=sweep_id, run_dir=str(run_dir.resolve()), space=space, buckets=buckets,
        objective=args.objective or sweep_cfg.get("objective", "scalar"),
        seed=args.seed if args.seed is not None else int(sweep_cfg.get("seed", 0)),
        max_concurrent_trials=max_conc, trial_resources=resources,
        sim_time_scale=(args.sim_time_scale or float(sim.get("time_scale", 50.0))) if simulated else None,
        steady_state=steady, steady_state_min_output_len=int(d.get("steady_state_min_output_len", 4096)),
        constraints=Constraints(max_tpot_ms=args.max_tpot_ms, max_ttft_ms=args.max_ttft_ms),
        routing_table=args.routing_table, tokenizer=args.tokenizer or (args.model if not simulated else None),
        n_startup_trials=int(sweep_cfg.get("n_startup_trials", 8)),
        ready_timeout_s=float(sweep_cfg.get("ready_timeout_s", 900.0)),
        share_gpu=bool(args.share_gpu) and not simulated,
        serve_gpus=args.serve_gpus if args.serve_gpus is not None else sweep_cfg.get("serve_gpus"),
        repeats=(args.repeats if args.repeats is not None
                 else int(sweep_cfg.get("repeats") or (1 if simulated else GPU_ROUNDS))),
        burn_in=not simulated and not args.no_burn_in,
        burn_in_s=0.0 if simulated or args.no_burn_in else (GPU_BURN_IN_S if args.burn_in_s is None else args.burn_in_s),
        decide_rounds=int(args.decide_rounds or 0),
        decide_starts=1 if args.decide_starts is None else args.decide_starts,
    )


def resumed_spec(run_dir: str | Path, *, serve_gpus: int | None = None) -> SweepSpec:
    """The spec saved in ``run_dir/sweep.json``, living in ``run_dir`` (a run dir copied off a
    GPU machine or moved resumes where it is now, not where it was made); ``serve_gpus`` (when
    given) replaces its serving budget, which decides only the choice from the results, so a
    resumed sweep may change it."""
    spec_path = Path(run_dir) / "sweep.json"
    try:
        spec = SweepSpec.from_dict(json.loads(spec_path.read_text()))
    except (OSError, ValueError, KeyError) as e:
        raise SweepError(f"cannot resume from {run_dir}: {spec_path} is missing or invalid ({e})") from None
    spec = dataclasses.replace(spec, run_dir=str(Path(run_dir)))
    return spec if serve_gpus is None else dataclasses.replace(spec, serve_gpus=serve_gpus)
