"""Build the Serve application from a routing table: one engine deployment per distinct engine config,
plus the router as ingress.

:func:`build_app` is pure in the Ray-Serve-LLM sense: validated args in, ``Application`` out; it
starts nothing. :func:`app_builder` is the import path for ``serve run`` / ``serve deploy``
(``orchestrator.serve.app:app_builder`` with ``args: {routing_table: PATH, ...}``).

Deployment identity:

- an engine deployment is named by ``EngineConfig.key()`` and versioned by a hash of (key, replica
  arguments, the source of the engine/replica code). Serve keeps a deployment whose version did not
  change running untouched, so deploying a new table restarts only the engines whose config changed
  (an LMDeploy engine takes minutes to load);
- the router's version is a hash of its spec (the table JSON included) and its code, so a new table
  always rolls the router, and an identical redeploy touches nothing.

Serve's public API no longer takes ``version=``; it is set through ``Deployment.options(...,
_internal=True)`` (the path Serve's own declarative deploys use), in
:func:`orchestrator.raycompat.with_deployment_version`. Should that private path go away, it falls back to Serve's default (a random version per ``serve.run``: every
update then restarts every engine).
"""
from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.config import SHARED_GPU_HEADROOM, EngineConfig, gpus_needed
from orchestrator.errors import ConfigError
from orchestrator.raycompat import with_deployment_version
from orchestrator.serve.metrics import ESTIMATE_WINDOW_S
from orchestrator.serve.protocol import DEFAULT_MAX_BODY_BYTES
from orchestrator.serve.router import DEFAULT_BODY_TIMEOUT_S, RouterSpec, hash_api_key
from orchestrator.sim.resources import ENGINE_CPUS as SIM_ENGINE_CPUS
from orchestrator.table import RoutingTable, RoutingTableError, load

__all__ = [
    "ROUTER_DEPLOYMENT",
    "AppArgs",
    "EngineOptions",
    "RouterOptions",
    "RunningEngine",
    "ScalingSpec",
    "app_builder",
    "build_app",
    "check_free",
    "check_resources",
    "check_shared_gpu",
    "engine_gpu_request",
    "gpu_requests",
    "load_table",
    "resources_needed",
    "router_spec",
    "simulated_shared_gpu",
]

ROUTER_DEPLOYMENT = "router"
_PKG = Path(__file__).resolve().parent
_ENGINE_CODE = ("serve/replica.py", "serve/metrics.py", "engine.py", "config.py", "preflight.py")
_ROUTER_CODE = ("serve/router.py", "serve/policy.py", "serve/protocol.py", "serve/metrics.py")


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScalingSpec(_Args):
    """Replicas of one engine deployment: fixed (``num_replicas``) or autoscaled on ongoing requests
    (``min_replicas``/``max_replicas``/``target_ongoing_requests``, Serve's ``autoscaling_config``)."""

    num_replicas: int | None = Field(default=None, ge=0, le=1024)
    min_replicas: int | None = Field(default=None, ge=0, le=1024)
    max_replicas: int | None = Field(default=None, ge=1, le=1024)
    target_ongoing_requests: float | None = Field(default=None, gt=0)
    max_ongoing_requests: int = Field(default=1024, ge=1, description="per replica; above it Serve queues")
    upscale_delay_s: float | None = Field(default=None, ge=0)
    downscale_delay_s: float | None = Field(default=None, ge=0)
    look_back_period_s: float | None = Field(
        default=None, gt=0, description="the window Serve averages ongoing requests over (its default: 30 s); "
                                        "longer than Serve's metrics interval (serve_metrics_interval_s)")

    @model_validator(mode="after")
    def _consistent(self) -> ScalingSpec:
        auto = any(v is not None for v in (self.min_replicas, self.max_replicas, self.target_ongoing_requests))
        if auto and self.num_replicas is not None:
            raise ValueError("give either num_replicas or min_replicas/max_replicas/target_ongoing_requests, not both")
        if auto:
            lo, hi = self.min_replicas or 0, self.max_replicas or max(1, self.min_replicas or 1)
            if lo > hi:
                raise ValueError(f"min_replicas={lo} > max_replicas={hi}")
            interval = serve_metrics_interval_s()
            if self.look_back_period_s is not None and self.look_back_period_s <= interval:
                raise ValueError(
                    f"look_back_period_s={self.look_back_period_s:g} must be longer than Serve's metrics interval "
                    f"({interval:g} s): Ray warns about a shorter window today and will refuse it")
            if self.target_ongoing_requests is not None and self.target_ongoing_requests > self.max_ongoing_requests:
                raise ValueError(
                    f"target_ongoing_requests={self.target_ongoing_requests} exceeds max_ongoing_requests="
                    f"{self.max_ongoing_requests}; the target could never be reached"
                )
        return self

    def deployment_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"max_ongoing_requests": self.max_ongoing_requests}
        if any(v is not None for v in (self.min_replicas, self.max_replicas, self.target_ongoing_requests)):
            auto: dict[str, Any] = {
                "min_replicas": self.min_replicas if self.min_replicas is not None else 1,
                "max_replicas": self.max_replicas if self.max_replicas is not None else max(1, self.min_replicas or 1),
            }
            if self.target_ongoing_requests is not None:
                auto["target_ongoing_requests"] = self.target_ongoing_requests
            if self.upscale_delay_s is not None:
                auto["upscale_delay_s"] = self.upscale_delay_s
            if self.downscale_delay_s is not None:
                auto["downscale_delay_s"] = self.downscale_delay_s
            if self.look_back_period_s is not None:
                auto["look_back_period_s"] = self.look_back_period_s
            opts["autoscaling_config"] = auto
        else:
            opts["num_replicas"] = self.num_replicas if self.num_replicas is not None else 1
        return opts


def serve_metrics_interval_s() -> float:
    """The interval Ray Serve checks ``look_back_period_s`` against (``AutoscalingConfig.metrics_interval_s``,
    deprecated for the push-interval environment variables but still what its validator reads)."""
    from ray.serve.config import AutoscalingConfig

    return float(AutoscalingConfig.model_fields["metrics_interval_s"].default)


class EngineOptions(_Args):
    """How engine replicas are run and watched."""

    health_check_period_s: float = Field(default=10.0, gt=0)
    health_check_timeout_s: float = Field(default=30.0, gt=0)
    graceful_shutdown_timeout_s: float = Field(
        default=900.0, ge=0, description="how long a stopping replica may drain in-flight generations"
    )
    graceful_shutdown_wait_loop_s: float = Field(
        default=2.0, gt=0,
        description="how often a stopping replica checks for in-flight requests (Serve's default): it stops "
                    "at the first check after its last one; shorter stops sooner, longer leaves requests "
                    "still on their way to it more time to arrive",
    )
    ready_timeout_s: float = Field(default=1800.0, gt=0)
    health_timeout_s: float = Field(default=5.0, gt=0, description="timeout of one engine /health probe")
    metrics_poll_s: float = Field(default=5.0, gt=0)
    accept_length_low_threshold: float = Field(default=1.5, ge=1.0)
    accept_length_window_s: float = Field(
        default=ESTIMATE_WINDOW_S, gt=0,
        description="how far back the live accept-length estimate looks: shorter sees a change of traffic sooner, "
                    "longer is steadier",
    )
    num_cpus: float | None = Field(
        default=None, ge=0,
        description="CPUs each engine replica reserves; default: 1 for LMDeploy engines, a measured fraction for "
                    "simulated ones (orchestrator.sim.resources.ENGINE_CPUS)",
    )
    max_surge_percent: int = Field(
        default=0, ge=0, le=100,
        description="extra replicas while a code change restarts an engine deployment (needs spare GPUs)",
    )
    log_dir: str | None = None
    share_gpu: bool = Field(
        default=False,
        description="tp=1 engines reserve memory_fraction + headroom of a GPU instead of a whole one, so several "
                    "fit on one GPU (small models only; EngineConfig.gpu_request)",
    )

    def cpus_for(self, config: EngineConfig) -> float:
        """The CPUs one replica of ``config`` reserves: ``num_cpus`` when given, else by backend (a
        simulated engine uses a fraction of a core, an LMDeploy host process keeps one busy)."""
        if self.num_cpus is not None:
            return self.num_cpus
        return SIM_ENGINE_CPUS if config.simulated else 1.0

    @model_validator(mode="after")
    def _probe_fits(self) -> EngineOptions:
        if self.health_timeout_s >= self.health_check_timeout_s:
            raise ValueError(
                f"health_timeout_s={self.health_timeout_s} must be below health_check_timeout_s="
                f"{self.health_check_timeout_s} so the engine probe finishes before Serve gives up"
            )
        return self


class RouterOptions(_Args):
    num_replicas: int = Field(default=1, ge=1, le=256)
    num_cpus: float = Field(default=1.0, ge=0)
    max_ongoing_requests: int = Field(default=4096, ge=1)
    graceful_shutdown_timeout_s: float = Field(default=900.0, ge=0)
    graceful_shutdown_wait_loop_s: float = Field(default=2.0, gt=0, description="as the engine option's")
    status_refresh_s: float = Field(default=1.0, gt=0)
    max_surge_percent: int = Field(default=100, ge=0, le=100, description="new router replicas start before old ones stop")
    engine_transport: Literal["grpc", "object_ref"] = Field(
        default="grpc",
        description="how engine streams reach the router: Serve's inter-deployment gRPC (default) or Ray "
        "object references per chunk (Serve's own default); see orchestrator.serve.router.ENGINE_TRANSPORTS",
    )


class AppArgs(_Args):
    """Arguments of :func:`app_builder` (the ``args:`` of a Serve config) and of the deploy CLI."""

    routing_table: str = Field(description="path of the routing table JSON (orchestrator.table format)")
    routing_table_sha256: str | None = Field(
        default=None,
        description="pin: refuse to build when the file's SHA-256 differs (written by --write-serve-config, "
        "so `serve deploy` sees a changed table as a changed config)",
    )
    served_model_name: str | None = Field(default=None, description="default: the table's provenance.model")
    api_keys: tuple[str, ...] = Field(default=(), repr=False, description="accepted Bearer keys (prefer api_key_sha256)")
    api_key_sha256: tuple[str, ...] = Field(default=(), description="SHA-256 hex digests of accepted keys")
    sim_time_scale: float | None = Field(default=None, gt=0, description="simulated engines run this much faster")
    default_max_tokens: int | None = Field(default=None, ge=1, description="overrides the table's default")
    max_tokens_limit: int | None = Field(default=None, ge=1, description="default: max(131072, last bucket bound)")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    body_timeout_s: float = Field(default=DEFAULT_BODY_TIMEOUT_S, gt=0,
                                  description="a request body must arrive within this long (else 408)")
    scaling: dict[str, ScalingSpec] = Field(
        default_factory=dict,
        description="keys: 'default', a bucket name (its primary config) or an engine config key",
    )
    engine: EngineOptions = Field(default_factory=EngineOptions)
    router: RouterOptions = Field(default_factory=RouterOptions)

    @model_validator(mode="after")
    def _keys_hex(self) -> AppArgs:
        for h in self.api_key_sha256:
            if len(h) != 64 or any(c not in "0123456789abcdef" for c in h.lower()):
                raise ValueError("api_key_sha256 entries must be 64 hex characters (sha256 of the key)")
        return self

    @classmethod
    def parse(cls, data: Mapping[str, Any] | AppArgs) -> AppArgs:
        if isinstance(data, AppArgs):
            return data
        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise ConfigError(f"invalid serve app args: {e}") from None

    def public_dict(self) -> dict[str, Any]:
        """JSON-ready args with cleartext keys replaced by their digests (for configs and logs)."""
        d = self.model_dump(mode="json", exclude_defaults=True)
        keys = d.pop("api_keys", None)
        if keys:
            d["api_key_sha256"] = sorted(set(d.get("api_key_sha256", [])) | {hash_api_key(k) for k in keys})
        return d


def load_table(args: AppArgs) -> RoutingTable:
    """Load and validate the table the args name (checking the pin); raises RoutingTableError."""
    path = Path(args.routing_table)
    table = load(path)
    if args.routing_table_sha256 is not None:
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != args.routing_table_sha256.lower():
            raise RoutingTableError(
                f"{path} changed since the Serve config was written (sha256 {actual[:12]}… != pinned "
                f"{args.routing_table_sha256[:12]}…); regenerate it: python -m orchestrator.deploy "
                f"--routing-table {path} --write-serve-config FILE"
            )
    return table


def router_spec(args: AppArgs, table: RoutingTable) -> RouterSpec:
    served = args.served_model_name or table.provenance.model
    limit = args.max_tokens_limit or max(131072, table.buckets[-1].max_output_len)
    keys = sorted(set(args.api_key_sha256) | {hash_api_key(k) for k in args.api_keys})
    return RouterSpec(
        table_json=table.to_json(),
        served_model_names=(served,),
        api_key_sha256=tuple(k.lower() for k in keys),
        max_tokens_limit=limit,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        default_max_tokens=args.default_max_tokens,
        status_refresh_s=args.router.status_refresh_s,
        engine_transport=args.router.engine_transport,
    )


def scaling_for(args: AppArgs, table: RoutingTable, key: str) -> ScalingSpec:
    """Scaling of one engine deployment: by config key, else by the bucket whose primary config it
    is (buckets sharing a config must agree), else ``default``, else the replicas the sweep planned for
    the table's GPU budget (``provenance.gpu_budget.replicas``), else one replica."""
    if key in args.scaling:
        return args.scaling[key]
    by_bucket = {
        b.name: args.scaling[b.name] for b in table.buckets if b.name in args.scaling and b.engine_config().key() == key
    }
    if len(set(by_bucket.values())) > 1:
        raise ConfigError(
            f"buckets {sorted(by_bucket)} share engine config {key} but have different scaling; give one "
            f"scaling entry keyed by the config key {key!r}"
        )
    if by_bucket:
        return next(iter(by_bucket.values()))
    planned = table.provenance.gpu_budget.replicas.get(key) if table.provenance.gpu_budget else None
    if planned is not None and "default" not in args.scaling:
        return ScalingSpec(num_replicas=planned)
    return args.scaling.get("default", ScalingSpec())


def _min_replicas(spec: ScalingSpec) -> int:
    opts = spec.deployment_options()
    return max(1, int(opts.get("num_replicas") or opts.get("autoscaling_config", {}).get("min_replicas", 1)))


def engine_gpu_request(args: AppArgs, table: RoutingTable, key: str, cfg: EngineConfig) -> float:
    """GPUs one replica of engine ``key`` reserves: a share of one GPU with ``--share-gpu`` or where the
    table's plan put it on a shared GPU (``provenance.gpu_budget.shared``), else ``tp`` whole GPUs."""
    budget = table.provenance.gpu_budget
    return cfg.gpu_request(share_gpu=args.engine.share_gpu or (budget is not None and key in budget.shared))


def gpu_requests(args: AppArgs, table: RoutingTable, keys: Collection[str] | None = None) -> list[float]:
    """One GPU request per engine replica with every deployment at its minimum replica count (a
    deployment of ``r`` replicas needs ``r`` placements, not one of ``r`` times the size); only the
    engines named in ``keys`` when given."""
    return [engine_gpu_request(args, table, key, cfg)
            for key, cfg in table.distinct_configs().items() if keys is None or key in keys
            for _ in range(_min_replicas(scaling_for(args, table, key)))]


def simulated_shared_gpu(table: RoutingTable, key: str) -> str | None:
    """The directory through which the simulated engines the table's plan put on one GPU slow each other
    (:mod:`orchestrator.sim.gpu_share`), one per table and host; ``None`` for an engine that shares no GPU,
    and on a plan of several GPUs, whose replicas Serve places without saying which GPU each stands for."""
    budget = table.provenance.gpu_budget
    if budget is None or key not in budget.shared or budget.gpus != 1:
        return None
    digest = hashlib.sha256(json.dumps(sorted(budget.shared)).encode()).hexdigest()[:12]
    return str(Path(tempfile.gettempdir()) / "mtp-autotune" / "shared-gpu" / digest)


def check_shared_gpu(table: RoutingTable) -> None:
    """Refuse a table whose plan puts engines on one GPU (``provenance.gpu_budget.shared``) that are not
    its own tp=1 configs, or whose reservations (memory fraction + headroom each) add up to more than one
    GPU: Ray would place them on separate GPUs, or leave one pending. Raises :class:`ConfigError`."""
    budget = table.provenance.gpu_budget
    if budget is None or not budget.shared:
        return
    configs = table.distinct_configs()
    unknown = sorted(k for k in budget.shared if k not in configs)
    if unknown:
        raise ConfigError(f"the table's plan shares a GPU between engines it does not route to: {unknown}; "
                          f"its engines are {sorted(configs)}")
    wide = sorted(k for k in budget.shared if configs[k].tp != 1)
    if wide:
        raise ConfigError(f"only tp=1 engines can share a GPU; the table's plan shares one with {wide}")
    real = {k: configs[k] for k in budget.shared if not configs[k].simulated}
    reserved = {k: c.gpu_request(share_gpu=True) for k, c in real.items()}
    if sum(reserved.values()) > 1.0 + 1e-9:
        each = " + ".join(f"{real[k].label()} {r:g}" for k, r in sorted(reserved.items()))
        raise ConfigError(
            f"the table's plan puts {len(reserved)} engines on one GPU, but together they reserve {each} = "
            f"{sum(reserved.values()):g} of it (memory fraction + {SHARED_GPU_HEADROOM:g} headroom each): they do "
            "not fit. Re-run the sweep with smaller --memory-fraction values, or commit a table without the "
            "shared GPU (--serve-gpus N without --share-gpu)")


def resources_needed(args: AppArgs, table: RoutingTable) -> dict[str, float]:
    """GPUs and CPUs the app reserves with every deployment at its minimum replica count, summed
    (what fits GPUs is :func:`check_resources`'s question)."""
    cpus = args.router.num_cpus * args.router.num_replicas + sum(
        args.engine.cpus_for(cfg) * _min_replicas(scaling_for(args, table, key))
        for key, cfg in table.distinct_configs().items())
    return {"GPU": round(sum(gpu_requests(args, table)), 4), "CPU": round(cpus, 4)}


@dataclass(frozen=True)
class RunningEngine:
    """An engine deployment of the app being updated, as it runs now (its replicas hold their GPUs)."""

    config: EngineConfig
    replicas: int = 1


def check_resources(args: AppArgs, table: RoutingTable, cluster: Mapping[str, float], *,
                    running: Mapping[str, RunningEngine] | None = None) -> None:
    """Refuse an app that the cluster (``ray.cluster_resources()``) cannot place with every deployment
    at its minimum replica count: Serve would leave such a replica pending for ever, without a word.

    GPUs are checked by placement (``orchestrator.config.gpus_needed``), not by sum: shared replicas
    of 0.6 GPU each sum to 1.8 but take 3 GPUs, since a replica's share cannot span two GPUs. CPUs
    are divisible, so their sum is the check.

    ``running``: the engines of the app an update replaces, by deployment name. They keep their GPUs
    until the router has switched, so the update's first step must place the table's *new* engines
    in the room the running ones leave (a replica that cannot be placed would hang that step).
    Raises :class:`ConfigError`.
    """
    check_shared_gpu(table)
    need = resources_needed(args, table)
    have_gpus = float(cluster.get("GPU", 0.0))
    placed = gpus_needed(gpu_requests(args, table))
    if placed > have_gpus + 1e-9:
        shareable = any(c.tp == 1 and not c.simulated for c in table.distinct_configs().values())
        raise ConfigError(
            f"the app reserves {need['GPU']:g} GPUs with every deployment at its minimum replica count"
            + (f", {placed} once placed (a replica's share of a GPU cannot span two GPUs)"
               if placed > math.ceil(need["GPU"] - 1e-9) else "")
            + f", but the Ray cluster has {have_gpus:g}: add GPUs, lower replica counts (--scale)"
            + (", or for small models let tp=1 engines share GPUs (--share-gpu)" if shareable and not args.engine.share_gpu
               else ", or commit a table chosen to fit (python -m tuning.sweep ... --serve-gpus N)")
        )
    have_cpus = float(cluster.get("CPU", 0.0))
    if need["CPU"] > have_cpus + 1e-9:
        raise ConfigError(
            f"the app reserves {need['CPU']:g} CPUs with every deployment at its minimum replica count but the "
            f"Ray cluster has {have_cpus:g}: add nodes or lower replica counts (--scale)"
        )
    added = sorted(k for k in table.distinct_configs() if k not in (running or {}))
    if not running or not added:
        return
    now = [r.config.gpu_request(share_gpu=args.engine.share_gpu)
           for r in running.values() for _ in range(max(1, r.replicas))]
    new = gpu_requests(args, table, keys=added)
    peak = gpus_needed(new, placed_first=now)
    if peak > have_gpus + 1e-9:
        raise ConfigError(
            f"updating starts the new engines {added} while the running ones {sorted(running)} keep their "
            f"GPUs until the router switches: that takes {peak} GPUs once placed but the Ray cluster has "
            f"{have_gpus:g}: add GPUs for the update, or delete the running app first (serve.delete / "
            "`serve shutdown`) and accept the downtime"
        )
    configs = table.distinct_configs()
    peak_cpus = (args.router.num_cpus * args.router.num_replicas
                 + sum(args.engine.cpus_for(r.config) * max(1, r.replicas) for r in running.values())
                 + sum(args.engine.cpus_for(configs[k]) * _min_replicas(scaling_for(args, table, k)) for k in added))
    if peak_cpus > have_cpus + 1e-9:
        raise ConfigError(
            f"updating runs old and new engines side by side until the router switches: {peak_cpus:g} CPUs at "
            f"that peak but the Ray cluster has {have_cpus:g}: add nodes or delete the running app first"
        )


def check_free(needs: Sequence[Mapping[str, float]], free: Mapping[str, float], *, what: str = "the app") -> None:
    """Refuse new apps (their :func:`resources_needed`, summed) that the cluster has room for in total
    but not beside what already runs on it: other Serve apps, Tune trials (``free``:
    ``ray.available_resources()``). Serve would leave the replicas that do not fit pending for ever.
    GPUs are compared by sum: a share that no single GPU's free part can hold is not caught here.
    Raises :class:`ConfigError`."""
    cpus, gpus = sum(n["CPU"] for n in needs), sum(n["GPU"] for n in needs)
    free_cpus, free_gpus = float(free.get("CPU", 0.0)), float(free.get("GPU", 0.0))
    if cpus > free_cpus + 1e-9 or gpus > free_gpus + 1e-9:
        raise ConfigError(
            f"{what} reserve{'s' if what == 'the app' else ''} {cpus:g} CPU(s) and {gpus:g} GPU(s) but only "
            f"{free_cpus:g} CPU(s) and {free_gpus:g} GPU(s) are free: other Serve apps or jobs on the Ray cluster "
            "hold the rest (`serve status` lists the apps): delete one, or add nodes"
        )


def build_app(
    args: AppArgs | Mapping[str, Any],
    *,
    table: RoutingTable | None = None,
    router: RouterSpec | None = None,
    extra_engines: Mapping[str, EngineConfig] | None = None,
) -> Any:
    """The Serve ``Application`` for a routing table (starts nothing).

    Args:
        args: app args (validated here).
        table: the table; loaded from ``args.routing_table`` when ``None``.
        router: route with this router spec instead of one built from ``table`` (the deploy CLI
            keeps the running router while new engines come up).
        extra_engines: engine configs to deploy besides the table's (kept while an update drains).
    """
    from ray import serve

    from orchestrator.serve.replica import EngineReplica
    from orchestrator.serve.router import Router, api

    args = AppArgs.parse(args)
    table = table if table is not None else load_table(args)
    spec = router if router is not None else router_spec(args, table)
    routed_table = RoutingTable.model_validate_json(spec.table_json)
    served = spec.served_model_names[0]
    unknown = sorted(k for k in args.scaling if k != "default" and k not in {b.name for b in table.buckets}
                     and k not in table.distinct_configs())
    if unknown:
        raise ConfigError(
            f"scaling keys {unknown} match no bucket or engine config; use 'default', a bucket name "
            f"{[b.name for b in table.buckets]} or a config key {sorted(table.distinct_configs())}"
        )

    engines: dict[str, EngineConfig] = {}
    for source in (table.distinct_configs(), routed_table.distinct_configs(), extra_engines or {}):
        for key, cfg in source.items():
            engines.setdefault(key, cfg)

    opts = args.engine
    bound: dict[str, Any] = {}
    for key, cfg in sorted(engines.items()):
        kwargs = {
            "served_model_name": served,
            "log_dir": opts.log_dir,
            "sim_time_scale": args.sim_time_scale if cfg.simulated else None,
            "ready_timeout_s": opts.ready_timeout_s,
            "health_timeout_s": opts.health_timeout_s,
            "metrics_poll_s": opts.metrics_poll_s,
            "accept_length_low_threshold": opts.accept_length_low_threshold,
            "accept_length_window_s": opts.accept_length_window_s,
        }
        if cfg.simulated and (shared := simulated_shared_gpu(table, key)) is not None:
            kwargs["sim_shared_gpu"] = shared
        scaling = scaling_for(args, table, key)
        deployment = serve.deployment(EngineReplica).options(
            name=key,
            ray_actor_options={"num_gpus": engine_gpu_request(args, table, key, cfg), "num_cpus": opts.cpus_for(cfg)},
            health_check_period_s=opts.health_check_period_s,
            health_check_timeout_s=opts.health_check_timeout_s,
            graceful_shutdown_timeout_s=opts.graceful_shutdown_timeout_s,
            graceful_shutdown_wait_loop_s=opts.graceful_shutdown_wait_loop_s,
            max_surge_percent=opts.max_surge_percent,
            **scaling.deployment_options(),
        )
        version = _digest({"key": key, "kwargs": kwargs, "code": _code_digest(_ENGINE_CODE)})
        bound[key] = with_deployment_version(deployment, version).bind(cfg.to_dict(), **kwargs)

    ropts = args.router
    router_deployment = serve.deployment(serve.ingress(api)(Router)).options(
        name=ROUTER_DEPLOYMENT,
        num_replicas=ropts.num_replicas,
        ray_actor_options={"num_cpus": ropts.num_cpus},
        max_ongoing_requests=ropts.max_ongoing_requests,
        graceful_shutdown_timeout_s=ropts.graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=ropts.graceful_shutdown_wait_loop_s,
        max_surge_percent=ropts.max_surge_percent,
    )
    router_version = _digest({"spec": spec.to_dict(), "code": _code_digest(_ROUTER_CODE)})
    return with_deployment_version(router_deployment, router_version).bind(spec.to_dict(), bound)


def app_builder(args: dict[str, Any]) -> Any:
    """``serve run/deploy`` entry point: ``orchestrator.serve.app:app_builder``."""
    return build_app(AppArgs.parse(args or {}))


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _code_digest(files: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for rel in files:
        p = _PKG.parent / rel
        h.update(rel.encode())
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()[:16]
