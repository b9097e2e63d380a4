"""Routing policy: pure functions from (request, routing table, live load, health) to a decision.

The router (:mod:`orchestrator.serve.router`) carries decisions out; nothing here touches Ray,
processes or the network, so every rule is unit-tested directly (``tests/unit/test_policy.py``).

Rules, in order:

1. **Bucket** — :meth:`RoutingTable.bucket_for` on the request's ``max_tokens`` (or
   ``max_completion_tokens``; the table's ``default_max_tokens`` when the request gives neither).
2. **Cell** — a bucket may carry cells keyed by sampling band and load level
   (:meth:`BucketRoute.cell_for`): the request's temperature (the table's ``default_temperature`` when it
   gives none) picks the band, the live load of the bucket's primary deployment — in-flight requests per
   replica — the level. A matching cell's config serves the request; otherwise the bucket's primary does.
   Cells exist only where the sweep measured another config better beyond noise (speculation pays less
   for sampled traffic and in full batches). Because requests that go to a load cell no longer count
   against the primary, the primary is held near the cell's level and the excess spills over to the
   cell's engine, rather than the whole bucket flapping between configs.
3. **Health** — if the chosen deployment has no healthy replica, the bucket's other configs are
   tried (the primary first, then its cells), then the nearest other bucket by position in the table
   (ties go to the larger bucket: its engine was configured for longer outputs). The decision then
   names the bucket it fell back from.
4. **Capacity** — when the chosen deployment's live load has reached its engines' batch limit
   (``max_batch_size``: a request beyond it waits in the engine's queue) and another deployment of the
   table has a healthy replica with room, the request goes to the one with the most room relative to
   its limit. Every engine of a table serves the same model, so any of them gives the same answer
   (speculation keeps the target distribution); a cell's config is the fastest for its part of the
   traffic, not the only one that can serve it, and a request waiting behind a full batch loses more
   than a config that is a few per cent slower for it. Deployments without a batch limit
   (``max_batch_size`` unset: the engine chooses) neither spill nor take spilled requests.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from orchestrator.errors import OrchestratorError
from orchestrator.table import BucketRoute, RoutingTable

__all__ = [
    "NoHealthyDeploymentError",
    "RouteDecision",
    "batch_limits",
    "bucket_deployments",
    "choose_route",
    "deployment_name",
    "requested_max_tokens",
]


T = TypeVar("T")


class NoHealthyDeploymentError(OrchestratorError, RuntimeError):
    """No deployment of the routing table has a healthy replica; the router answers 503."""


@dataclass(frozen=True)
class RouteDecision:
    """Where one request goes, and why.

    Attributes:
        bucket: name of the bucket whose config serves the request.
        deployment: Serve deployment name (= ``EngineConfig.key()`` of that config).
        config_key: the engine config key (equal to ``deployment``; kept separate so a future naming
            scheme for deployments does not change what the metrics call the config).
        fallback_from: name of the bucket the request *should* have gone to when health forced a
            different deployment, else ``None``.
        reason: short machine-readable explanation: ``bucket``, ``cell:BAND@N`` (``any@N`` for a cell of
            every band), ``fallback:...``, ``spill:DEPLOYMENT-full``.
        cell: the cell that chose the config (``BAND@N``), or ``primary`` for the bucket's own config.
    """

    bucket: str
    deployment: str
    config_key: str
    fallback_from: str | None = None
    reason: str = "bucket"
    cell: str = "primary"

    @property
    def fallback_header(self) -> str | None:
        """``x-route-fallback`` value, e.g. ``le4096->le1024``."""
        return None if self.fallback_from is None else f"{self.fallback_from}->{self.bucket}"


def deployment_name(config_key: str) -> str:
    """Serve deployment name of an engine config: its key (readable label + hash, unique per command)."""
    return config_key


_MEMO: dict[int, tuple[object, object]] = {}
"""id(obj) -> (obj, value) for :func:`_memoised`: config keys hash canonical JSON, too slow to redo per
request. The object is kept in the value so its id cannot be reused while cached; tables and buckets
are immutable."""


def _memoised(obj: object, compute: Callable[[], T]) -> T:
    hit = _MEMO.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]  # type: ignore[return-value]
    value = compute()
    if len(_MEMO) > 4096:  # tables are few; bound the memo anyway
        _MEMO.clear()
    _MEMO[id(obj)] = (obj, value)
    return value


def bucket_deployments(bucket: BucketRoute) -> tuple[tuple[str, int], ...]:
    """``((deployment, min_in_flight), ...)`` of a bucket: primary (level 0), then its cells (their load
    level; the band is decided in :func:`choose_route`)."""
    return _memoised(bucket, lambda: ((deployment_name(bucket.engine_config().key()), 0),) + tuple(
        (deployment_name(c.engine_config().key()), c.min_in_flight) for c in bucket.cells))


def requested_max_tokens(max_tokens: int | None, max_completion_tokens: int | None) -> int | None:
    """The output cap a request asks for: ``max_completion_tokens`` (the newer OpenAI name) wins over
    ``max_tokens`` when both are given, as in OpenAI's API; ``None`` when neither is."""
    return max_completion_tokens if max_completion_tokens is not None else max_tokens


def choose_route(
    request_max_tokens: int | None,
    table: RoutingTable,
    live_load: Mapping[str, float],
    healthy: Iterable[str] | None = None,
    *,
    temperature: float | None = None,
) -> RouteDecision:
    """Pick the deployment for one request.

    Args:
        request_max_tokens: the request's output cap, ``None`` when it gave none.
        table: the routing table the router was deployed with.
        live_load: deployment name -> in-flight requests per healthy replica (missing = 0).
        healthy: deployment names with at least one healthy replica; ``None`` = all healthy.
        temperature: the request's sampling temperature, ``None`` when it gave none.

    Returns:
        The decision.

    Raises:
        NoHealthyDeploymentError: no deployment of the table is healthy.
    """
    healthy_set = None if healthy is None else frozenset(healthy)

    def is_healthy(name: str) -> bool:
        return healthy_set is None or name in healthy_set

    wanted = table.bucket_for(request_max_tokens)
    band = table.band_for(temperature)
    band_name = band.name if band is not None else None
    deployment, reason, cell = _by_cell(wanted, band_name, live_load)
    if is_healthy(deployment):
        roomier = _with_room(table, deployment, live_load, is_healthy)
        if roomier is not None:
            return RouteDecision(wanted.name, roomier, roomier, None, f"spill:{deployment}-full", cell)
        return RouteDecision(wanted.name, deployment, deployment, None, reason, cell)

    # Same bucket, another of its configs (primary first, then its cells).
    for name, _ in bucket_deployments(wanted):
        if name != deployment and is_healthy(name):
            return RouteDecision(
                wanted.name, name, name, wanted.name, f"fallback:{deployment}-unhealthy", cell
            )

    # Nearest other bucket; ties prefer the larger one.
    index = [b.name for b in table.buckets].index(wanted.name)
    order = sorted(
        (i for i in range(len(table.buckets)) if i != index),
        key=lambda i: (abs(i - index), -i),
    )
    for i in order:
        other = table.buckets[i]
        preferred, _, _ = _by_cell(other, band_name, live_load)
        candidates = [preferred, *(n for n, _ in bucket_deployments(other) if n != preferred)]
        for name in candidates:
            if is_healthy(name):
                return RouteDecision(
                    other.name, name, name, wanted.name, f"fallback:{wanted.name}-unhealthy", cell
                )
    raise NoHealthyDeploymentError(
        f"no healthy engine deployment for any bucket (wanted bucket {wanted.name!r}); "
        "check `serve status` and the replicas' engine logs"
    )


def batch_limits(table: RoutingTable) -> dict[str, int | None]:
    """Deployment -> its engines' ``max_batch_size`` (``None``: the engine chooses) for every config of
    the table."""
    return _memoised(table, lambda: {deployment_name(k): c.max_batch_size for k, c in table.distinct_configs().items()})


def _with_room(table: RoutingTable, chosen: str, live_load: Mapping[str, float], is_healthy) -> str | None:
    """Another healthy deployment with room when ``chosen`` is at its batch limit (rule 4), else ``None``."""
    limits = batch_limits(table)
    limit = limits.get(chosen)
    if limit is None or float(live_load.get(chosen, 0.0)) < limit:
        return None
    room = [(float(live_load.get(name, 0.0)) / cap, name) for name, cap in limits.items()
            if name != chosen and cap is not None and float(live_load.get(name, 0.0)) < cap and is_healthy(name)]
    return min(room)[1] if room else None


def _by_cell(bucket: BucketRoute, band: str | None, live_load: Mapping[str, float]) -> tuple[str, str, str]:
    """The bucket's deployment for the request's sampling band and the primary's live load (its matching
    cell's, else the primary), with the reason and the cell label."""
    primary = bucket_deployments(bucket)[0][0]
    load = float(live_load.get(primary, 0.0))
    cell = bucket.cell_for(band, max(1, int(load)))
    if cell is None:
        return primary, "bucket", "primary"
    return deployment_name(cell.engine_config().key()), f"cell:{cell.label}", cell.label
