"""`RoutingTable`: per output-length bucket, the engine config the sweep measured best, and the cells
(sampling band x load level) where another config measured better beyond noise.

The sweep writes it (:func:`commit`), the Serve app reads it (:func:`load`). It is validated on both
sides with one pydantic schema, so a table that loads is a table the router can use: buckets have
unique names and strictly increasing upper bounds, every config is a valid :class:`EngineConfig`.

Writes are atomic (temp file in the same folder + ``os.replace``) and every committed version is
kept under ``<name>.history/``; an invalid table never replaces a good one.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.config import EngineConfig, gpus_needed
from orchestrator.errors import ConfigError
from orchestrator.fsutil import atomic_write_text

__all__ = [
    "SCHEMA_VERSION",
    "READABLE_SCHEMA_VERSIONS",
    "BucketFigures",
    "BucketRoute",
    "Cell",
    "DEFAULT_SAMPLING_BANDS",
    "SamplingBand",
    "band_of",
    "cells_of_load_variants",
    "select_cell",
    "GpuBudget",
    "Provenance",
    "RoutingTable",
    "RoutingTableError",
    "commit",
    "gpus_for_engines",
    "load",
    "parse",
]

SCHEMA_VERSION = 3
#: Version 1 tables (output-length buckets and load variants, no cells) and version 2 ones (cells, no
#: ``engine`` / ``engine_version`` on the routes) load; their routes' engine is their config's. A bucket's
#: ``load_variants`` (the form before load was a cell dimension) are read as the cells that route every
#: request the same way (:func:`cells_of_load_variants`); a version-1 table that has them reads as version 2.
READABLE_SCHEMA_VERSIONS = (1, 2, 3)

_ENGINE_FIELDS = ("engine", "engine_version")


class _EngineRoute:
    """Where a config is named (a bucket or a cell): which engine serves it and its version.

    ``engine`` is the engine family member the config runs or simulates (``pytorch``, ``turbomind``,
    ``vllm``: :attr:`EngineConfig.engine_name`), written from schema version 3 on so a reader of a table
    mixing engine families sees them without parsing configs; ``engine_version`` the version that
    engine was measured with (the table's ``provenance.engine_versions``; ``None`` for a simulated one)."""

    @property
    def engine_name(self) -> str:
        return self.engine or self.engine_config().engine_name  # type: ignore[attr-defined]

    def _engine_matches_config(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None and engine != self.engine_config().engine_name:  # type: ignore[attr-defined]
            raise ValueError(f"engine {engine!r} does not match its config's engine "
                             f"{self.engine_config().engine_name!r}")  # type: ignore[attr-defined]


class RoutingTableError(ConfigError):
    """A routing table is malformed, inconsistent, or could not be written."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _without_unset(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``data`` without ``keys`` whose value is unset (``None``) or empty. Fields added after a schema
    shipped are written only when set, so a table that does not use them stays byte-identical to one
    written before they existed, and builds that predate them (``extra="forbid"``) still read it."""
    for key in keys:
        if data.get(key) is None or data.get(key) in ([], (), {}):
            data.pop(key, None)
    return data


class BucketFigures(_Model):
    """What was measured for one config on one bucket's workload (medians unless named)."""

    output_throughput: float = Field(ge=0, description="output tokens/s")
    request_throughput: float | None = Field(default=None, ge=0)
    ttft_ms_median: float | None = Field(default=None, ge=0)
    ttft_ms_p99: float | None = Field(default=None, ge=0)
    tpot_ms_median: float | None = Field(default=None, ge=0)
    tpot_ms_p99: float | None = Field(default=None, ge=0)
    accept_length: float | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    completed: int | None = Field(default=None, ge=0)
    failed: int | None = Field(default=None, ge=0)
    output_throughput_ci: tuple[float, float] | None = Field(
        default=None, description="confidence interval of output_throughput over interleaved rounds (low, high)"
    )
    rounds: int | None = Field(default=None, ge=1, description="interleaved rounds behind the figure")

    @model_validator(mode="after")
    def _ci_holds_the_figure(self) -> BucketFigures:
        ci = self.output_throughput_ci
        if ci is not None and not (0 <= ci[0] <= ci[1]):
            raise ValueError(f"output_throughput_ci must be (low, high) with 0 <= low <= high, got {ci}")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_spread(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "output_throughput_ci", "rounds")


class SamplingBand(_Model):
    """Requests whose temperature is at most ``max_temperature`` (and above the previous band's bound).

    Speculation pays less as temperature rises (a sampled draft is accepted less often), so the best
    config of a bucket can differ between greedy and sampled traffic. ``max_temperature=None`` is the
    open last band."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    max_temperature: float | None = Field(default=None, ge=0)


#: Greedy (temperature 0) apart from everything sampled: the least a table distinguishes.
DEFAULT_SAMPLING_BANDS = (SamplingBand(name="greedy", max_temperature=0.0), SamplingBand(name="sampled"))


def band_of(temperature: float, bands: Iterable[SamplingBand] = DEFAULT_SAMPLING_BANDS) -> SamplingBand | None:
    """The first band that holds ``temperature`` (``None`` above a closed last band)."""
    for band in bands:
        if band.max_temperature is None or temperature <= band.max_temperature:
            return band
    return None


class Cell(_EngineRoute, _Model):
    """Where a bucket's primary config is not the best: requests of sampling band ``sampling`` (``None``:
    every band) arriving while the bucket's primary deployment has at least ``min_in_flight`` requests in
    flight per replica go to ``config``. The sweep writes a cell only when ``config`` beat the primary on
    that cell by more than the measured noise, so most buckets have none and cells share engines."""

    sampling: str | None = Field(default=None, min_length=1, max_length=64)
    min_in_flight: int = Field(default=1, ge=1)
    config: dict[str, Any]
    figures: BucketFigures
    primary_figures: BucketFigures | None = Field(
        default=None, description="the bucket's primary config measured on the same cell"
    )
    engine: str | None = None
    engine_version: str | None = None

    @model_validator(mode="after")
    def _engine_of_config(self) -> Cell:
        self._engine_matches_config()
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_engine(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), *_ENGINE_FIELDS)

    @field_validator("config")
    @classmethod
    def _valid_config(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _validated_config(v)

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_dict(self.config)

    @property
    def label(self) -> str:
        """``BAND@N``: the cell's sampling band (``any`` for a cell of every band) and its load level."""
        return f"{self.sampling or 'any'}@{self.min_in_flight}"

    def gain(self) -> float | None:
        """Relative output-throughput gain over the primary on this cell (0.15 = +15 %)."""
        if self.primary_figures is None or self.primary_figures.output_throughput <= 0:
            return None
        return self.figures.output_throughput / self.primary_figures.output_throughput - 1.0


def select_cell(cells: Iterable[Cell], sampling: str | None, in_flight: int) -> Cell | None:
    """The cell that serves sampling band ``sampling`` at ``in_flight`` requests in flight per replica of
    the primary (``None``: the primary). Among the cells whose band matches (or that hold for every band)
    and whose load level is reached, the one at the highest load level wins; at equal levels a band's own
    cell beats an every-band one."""
    fitting = [c for c in cells if (c.sampling is None or c.sampling == sampling) and c.min_in_flight <= in_flight]
    if not fitting:
        return None
    return max(fitting, key=lambda c: (c.min_in_flight, c.sampling is not None))


def cells_of_load_variants(cells: Iterable[Mapping[str, Any]], variants: Iterable[Mapping[str, Any]], *,
                           bucket: str = "?") -> list[dict[str, Any]]:
    """The cells that route a bucket's requests as its ``cells`` and ``load_variants`` did together
    (the form before load was a cell dimension): a matching cell decided first; else the variant with
    the highest ``min_concurrency`` the primary's live load reached.

    A variant becomes an every-band cell at its load level, except where an every-band cell already
    holds from a lower level on (that cell decided first: the variant was never reached). Where a band's
    own cell holds from a lower level, that band keeps it at the variant's level too (a cell of its own
    at that level, same config), so the variant's every-band cell, now winning on level, takes only the
    bands it took before. Tables the sweep wrote never had both (cells came with temperature cells,
    variants without); the exact reading is for tables written by hand."""
    original = [dict(c) for c in cells]
    out = list(original)
    parsed = []
    for v in variants:
        if not isinstance(v, Mapping) or not isinstance(v.get("min_concurrency"), int):
            raise ValueError(f"bucket {bucket!r}: a load variant needs an integer min_concurrency, got {v!r}")
        parsed.append(v)
    levels = [v["min_concurrency"] for v in parsed]
    if levels != sorted(set(levels)):
        raise ValueError(f"bucket {bucket!r}: load_variants must have strictly increasing min_concurrency, "
                         f"got {levels}")

    def level(c: Mapping[str, Any]) -> int:
        n = c.get("min_in_flight", 1)
        return n if isinstance(n, int) else 1

    for v in parsed:
        n = v["min_concurrency"]
        if any(c.get("sampling") is None and level(c) <= n for c in original):
            continue
        for band in sorted({c["sampling"] for c in original if c.get("sampling") is not None and level(c) <= n}):
            if any(c.get("sampling") == band and level(c) == n for c in out):
                continue
            held = max((c for c in original if c.get("sampling") == band and level(c) <= n), key=level)
            out.append({**held, "min_in_flight": n})
        out.append({"sampling": None, "min_in_flight": n,
                    **{k: v[k] for k in ("config", "figures", "engine", "engine_version") if k in v}})
    return out


class BucketRoute(_EngineRoute, _Model):
    """One output-length bucket: requests with ``max_tokens <= max_output_len`` (and above the
    previous bucket's bound) go to ``config``."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    max_output_len: int = Field(ge=1)
    config: dict[str, Any]
    figures: BucketFigures
    baselines: dict[str, BucketFigures] = Field(
        default_factory=dict, description="e.g. {'mtp_off': ..., 'static': ...} under the same workload"
    )
    gains: dict[str, float] = Field(
        default_factory=dict, description="relative output-throughput gain over each baseline, 0.15 = +15%"
    )
    cells: tuple[Cell, ...] = ()
    workload: dict[str, Any] = Field(default_factory=dict)
    engine: str | None = None
    engine_version: str | None = None

    @field_validator("config")
    @classmethod
    def _valid_config(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _validated_config(v)

    @model_validator(mode="after")
    def _cells_distinct(self) -> BucketRoute:
        keys = [(c.sampling, c.min_in_flight) for c in self.cells]
        if len(set(keys)) != len(keys):
            raise ValueError(f"bucket {self.name!r}: two cells for the same (sampling, min_in_flight): {keys}")
        self._engine_matches_config()
        return self

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_dict(self.config)

    def cell_for(self, sampling: str | None, in_flight: int) -> Cell | None:
        """The cell that serves a request of sampling band ``sampling`` at ``in_flight`` requests in flight
        per replica of the primary, or ``None`` for the primary itself.

        :func:`select_cell` over the bucket's cells."""
        return select_cell(self.cells, sampling, in_flight)

    def engine_configs(self) -> list[EngineConfig]:
        """The bucket's config and its cells'."""
        return [self.engine_config(), *(c.engine_config() for c in self.cells)]

    @model_serializer(mode="wrap")
    def _omit_empty_cells(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "cells", *_ENGINE_FIELDS)


class GpuBudget(_Model):
    """The GPUs a table was chosen to be served on (``tuning.sweep --serve-gpus``): one replica of
    every engine it uses must fit ``gpus`` GPUs, each engine reserving
    :meth:`EngineConfig.gpu_request` with ``share_gpu``. ``notes`` say what fitting cost (a bucket
    given its next-best config, a cell dropped); empty when nothing changed."""

    gpus: int = Field(ge=1)
    share_gpu: bool = False
    notes: tuple[str, ...] = ()
    replicas: dict[str, int] = Field(
        default_factory=dict,
        description="engine key -> whole replicas on the budget's GPUs, sized by each config's share of the "
                    "traffic's work (tuning.choose.replicas); empty: one replica each. Deploy's scaling overrides it",
    )

    shared: tuple[str, ...] = Field(
        default=(),
        description="engine keys that time-share each of the budget's GPUs, one replica of each per GPU, each "
                    "reserving its memory fraction + headroom of the GPU (EngineConfig.gpu_request with share_gpu); "
                    "empty: no engine shares a GPU unless share_gpu says so",
    )

    @field_validator("replicas")
    @classmethod
    def _whole_replicas(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {k: n for k, n in v.items() if not isinstance(n, int) or n < 1}
        if bad:
            raise ValueError(f"replicas must be whole numbers >= 1, got {bad}")
        return v

    @field_validator("shared")
    @classmethod
    def _several_distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if v and (len(v) < 2 or len(set(v)) != len(v)):
            raise ValueError(f"shared names the engines that share a GPU: two or more distinct keys, got {list(v)}")
        return v

    @model_serializer(mode="wrap")
    def _omit_unplanned(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "replicas", "shared")

    def shares_gpu(self, key: str) -> bool:
        """Does engine ``key`` reserve a share of a GPU rather than whole ones: every tp=1 engine with
        ``share_gpu``, and the engines the plan put on a shared GPU (:attr:`shared`)."""
        return self.share_gpu or key in self.shared

    def fits(self, configs: Iterable[EngineConfig]) -> bool:
        """Does one replica of each of ``configs`` fit the budget's GPUs? A simulated engine counts as the
        ``tp`` GPUs it stands for: it reserves none on the cluster, so by its reservation any number of
        simulated engines would fit and a simulated sweep's ``--serve-gpus`` would choose nothing."""
        configs = list(configs)
        simulated = sum(c.tp for c in configs if c.simulated)
        real = gpus_for_engines((c for c in configs if not c.simulated), share_gpu=self.share_gpu)
        return simulated + real <= self.gpus


def gpus_for_engines(configs: Iterable[EngineConfig], *, share_gpu: bool) -> int:
    """GPUs one replica of each config takes, placed as Ray places them (``orchestrator.config.gpus_needed``)."""
    return gpus_needed(c.gpu_request(share_gpu=share_gpu) for c in configs)


class Provenance(_Model):
    """Where the measurements came from; a table without it can't be trusted or compared."""

    model: str
    gpu_type: str
    gpu_count: int = Field(ge=0)
    engine_versions: dict[str, str] = Field(default_factory=dict)
    sweep_id: str
    created_at: str = Field(description="ISO-8601 UTC")
    simulated: bool
    workload: dict[str, Any] = Field(default_factory=dict)
    objective: str = "output_throughput"
    constraints: dict[str, float] = Field(default_factory=dict)
    gpu_budget: GpuBudget | None = Field(default=None, description="set when the sweep had --serve-gpus")
    notes: tuple[str, ...] = Field(
        default=(), description="how the choice was made where the best figure alone did not decide it")

    @model_serializer(mode="wrap")
    def _omit_unset_budget(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "gpu_budget", "notes")


class RoutingTable(_Model):
    schema_version: int = SCHEMA_VERSION
    version: int = Field(default=1, ge=1, description="incremented by every commit to the same path")
    provenance: Provenance
    buckets: tuple[BucketRoute, ...] = Field(min_length=1)
    default_max_tokens: int = Field(
        default=1024, ge=1, description="bucket key for requests that give no max_tokens"
    )
    sampling_bands: tuple[SamplingBand, ...] = Field(default=DEFAULT_SAMPLING_BANDS, min_length=1)
    default_temperature: float | None = Field(
        default=None, ge=0,
        description="the engines' temperature for requests that give none; None: such requests take the primary",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_older_forms_and_name_engines(cls, data: Any) -> Any:
        """Load variants read as cells first, then every route, those cells among them, named (one
        validator: pydantic runs several ``before`` validators last-defined first)."""
        return cls._routes_name_their_engine(cls._read_load_variants_as_cells(data))

    @staticmethod
    def _read_load_variants_as_cells(data: Any) -> Any:
        """A bucket's ``load_variants`` (tables written before load was a cell dimension) become the cells
        that route every request as the variants did (:func:`cells_of_load_variants`); a version-1 table
        that has them reads as version 2, the first with cells."""
        if not isinstance(data, Mapping) or not isinstance(data.get("buckets"), (list, tuple)):
            return data
        if not any(isinstance(b, Mapping) and "load_variants" in b for b in data["buckets"]):
            return data
        buckets = []
        for b in data["buckets"]:
            if isinstance(b, Mapping) and "load_variants" in b:
                b = {k: v for k, v in b.items() if k != "load_variants"} | {
                    "cells": cells_of_load_variants(b.get("cells") or (), b["load_variants"] or (),
                                                    bucket=str(b.get("name")))}
            buckets.append(b)
        version = data.get("schema_version", SCHEMA_VERSION)
        upgraded = max(version, 2) if isinstance(version, int) and any(b.get("cells") for b in buckets
                                                                       if isinstance(b, Mapping)) else version
        return {**data, "schema_version": upgraded, "buckets": buckets}

    @staticmethod
    def _routes_name_their_engine(data: Any) -> Any:
        """From schema version 3 on, every route (bucket, cell) says its engine and the version it was
        measured with: filled here from its config and the provenance where the writer left them out, so
        every writer of a table (the sweep's choosing code among them) gets them."""
        version = data.get("schema_version", SCHEMA_VERSION) if isinstance(data, Mapping) else None
        if not isinstance(version, int) or version < 3:
            return data
        provenance = data.get("provenance")
        versions = provenance.engine_versions if isinstance(provenance, Provenance) else \
            (provenance or {}).get("engine_versions", {}) if isinstance(provenance, Mapping) else {}
        if not isinstance(versions, Mapping):
            return data  # the field's own validation says what is wrong

        def named(route: Any) -> Any:
            if isinstance(route, BaseModel):  # built from the models, not read: name its engine too
                route = route.model_dump()
            if not isinstance(route, Mapping) or not isinstance(route.get("config"), Mapping):
                return route
            try:
                config = EngineConfig.from_dict(route["config"])
            except ConfigError:
                return route  # the config's own validation says what is wrong
            package = config.engine.package if not config.simulated else None
            return {**route, "engine": route.get("engine") or config.engine_name,
                    "engine_version": route.get("engine_version") or (versions.get(package) if package else None)}

        buckets = []
        for b in data.get("buckets") or ():
            if isinstance(b, BaseModel):
                b = b.model_dump()
            if isinstance(b, Mapping):
                b = named({**b, "cells": [named(c) for c in b.get("cells") or ()]})
            buckets.append(b)
        return {**data, "buckets": buckets}

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(f"schema_version {v} is not supported; this build reads {list(READABLE_SCHEMA_VERSIONS)}")
        return v

    @model_validator(mode="after")
    def _bands_ordered(self) -> RoutingTable:
        bands = self.sampling_bands
        names = [b.name for b in bands]
        if len(set(names)) != len(names):
            raise ValueError(f"sampling band names must be unique, got {names}")
        bounds = [b.max_temperature for b in bands]
        if any(b is None for b in bounds[:-1]):
            raise ValueError("only the last sampling band may be open (max_temperature null)")
        closed = [b for b in bounds if b is not None]
        if any(a >= b for a, b in zip(closed, closed[1:])):
            raise ValueError(f"sampling band max_temperature must be strictly increasing, got {bounds}")
        uses_v2 = any(b.cells for b in self.buckets) or bands != DEFAULT_SAMPLING_BANDS
        if self.schema_version < 2 and (uses_v2 or self.default_temperature is not None):
            raise ValueError("cells, sampling_bands and default_temperature need schema_version 2")
        routes = [r for b in self.buckets for r in (b, *b.cells)]
        if self.schema_version < 3 and any(r.engine is not None or r.engine_version is not None for r in routes):
            raise ValueError("engine and engine_version on routes need schema_version 3")
        for bucket in self.buckets:
            for cell in bucket.cells:
                if cell.sampling is not None and cell.sampling not in names:
                    raise ValueError(f"bucket {bucket.name!r}: cell names sampling band {cell.sampling!r}; "
                                     f"bands: {names}")
        return self

    @model_validator(mode="after")
    def _buckets_ordered(self) -> RoutingTable:
        names = [b.name for b in self.buckets]
        if len(set(names)) != len(names):
            raise ValueError(f"bucket names must be unique, got {names}")
        bounds = [b.max_output_len for b in self.buckets]
        if any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"bucket max_output_len must be strictly increasing, got {bounds}")
        return self

    # ----- queries (pure) --------------------------------------------------------------------------
    def bucket_for(self, max_tokens: int | None) -> BucketRoute:
        """The bucket whose range holds ``max_tokens``; above the last bound, the last bucket."""
        n = self.default_max_tokens if max_tokens is None else max_tokens
        for b in self.buckets:
            if n <= b.max_output_len:
                return b
        return self.buckets[-1]

    def band_for(self, temperature: float | None) -> SamplingBand | None:
        """The sampling band of a request's temperature (``default_temperature`` when it gives none);
        ``None`` when neither is known or the temperature is above a closed last band."""
        t = self.default_temperature if temperature is None else temperature
        return None if t is None else band_of(t, self.sampling_bands)

    def bucket(self, name: str) -> BucketRoute:
        for b in self.buckets:
            if b.name == name:
                return b
        raise KeyError(f"no bucket named {name!r}; buckets: {[b.name for b in self.buckets]}")

    def engines(self) -> dict[str, str | None]:
        """Every engine the table routes to -> the version it was measured with (a table may mix
        engine families; a simulated engine's version is ``None``)."""
        out: dict[str, str | None] = {}
        for b in self.buckets:
            for r in (b, *b.cells):
                out.setdefault(r.engine_name, r.engine_version)
        return out

    def distinct_configs(self) -> dict[str, EngineConfig]:
        """Every engine config the table uses (bucket configs and cells), by key."""
        out: dict[str, EngineConfig] = {}
        for b in self.buckets:
            for cfg in b.engine_configs():
                out.setdefault(cfg.key(), cfg)
        return out

    def gpus_needed(self, *, share_gpu: bool) -> int:
        """GPUs that hold one replica of every engine the table uses (bucket configs and cells), each
        reserving :meth:`EngineConfig.gpu_request` (``orchestrator.config.gpus_needed``)."""
        return gpus_for_engines(self.distinct_configs().values(), share_gpu=share_gpu)

    @model_serializer(mode="wrap")
    def _omit_default_sampling(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "default_temperature")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=False) + "\n"


def _validated_config(v: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return EngineConfig.from_dict(v).to_dict()
    except ConfigError as e:
        raise ValueError(str(e)) from None


def parse(data: Mapping[str, Any] | str | bytes) -> RoutingTable:
    """Validate a routing table from a dict or JSON text; raises :class:`RoutingTableError`."""
    try:
        if isinstance(data, (str, bytes)):
            return RoutingTable.model_validate_json(data)
        return RoutingTable.model_validate(data)
    except ValidationError as e:
        raise RoutingTableError(f"invalid routing table: {e}") from None
    except (ValueError, TypeError) as e:
        raise RoutingTableError(f"invalid routing table: {e}") from None


def load(path: str | os.PathLike[str]) -> RoutingTable:
    """Read and validate a routing table file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise RoutingTableError(f"cannot read routing table {p}: {e}") from None
    try:
        return parse(raw)
    except RoutingTableError as e:
        raise RoutingTableError(f"{p}: {e}") from None


def history_dir(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p.with_name(p.name + ".history")


def commit(table: RoutingTable | Mapping[str, Any], path: str | os.PathLike[str]) -> RoutingTable:
    """Validate ``table`` and atomically write it to ``path`` as the next version.

    The version becomes (previous valid version at ``path``) + 1; the new file is also copied to
    ``<path>.history/v<version>.json``. If validation or any write fails, ``path`` is untouched.
    """
    p = Path(path)
    candidate = table if isinstance(table, RoutingTable) else parse(table)
    candidate = parse(candidate.model_dump(mode="json"))  # re-validate: model_construct bypasses checks
    previous_version = 0
    if p.exists():
        try:
            previous_version = load(p).version
        except RoutingTableError:
            previous_version = _max_history_version(p)
    previous_version = max(previous_version, _max_history_version(p))
    final = candidate.model_copy(update={"version": previous_version + 1})
    text = final.to_json()
    parse(text)  # what we write must load
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        hist = history_dir(p)
        hist.mkdir(parents=True, exist_ok=True)
        atomic_write_text(hist / f"v{final.version}.json", text)
        atomic_write_text(p, text)
    except OSError as e:
        raise RoutingTableError(f"could not write routing table {p}: {e}; the previous table is unchanged") from None
    return final


def _max_history_version(p: Path) -> int:
    hist = history_dir(p)
    versions = []
    if hist.is_dir():
        for f in hist.glob("v*.json"):
            try:
                versions.append(int(f.stem[1:]))
            except ValueError:
                continue
    return max(versions, default=0)
