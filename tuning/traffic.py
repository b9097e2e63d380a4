"""The traffic a routing table is judged on: which requests (output length x sampling temperature) in
which shares, and how the load moves over time.

Why: whether serving several configs pays depends on the user's traffic, not on the sweep's buckets in
equal parts. A :class:`TrafficMix` comes from a mix file the user writes or from a request log (one
OpenAI request body per line), and gives each routing-table cell (bucket x sampling band) its share of
the requests and of the output tokens. A :class:`LoadProfile` describes the concurrency over time
(steady phases, ramps, bursts) for a benchmark driver to follow. Both are pure data with validation
that names the bad field.

Mix file (YAML or JSON)::

    default_temperature: 0.7          # what a request without temperature gets (the engine's default)
    classes:
      - {max_tokens: 1024, temperature: 0.0, share: 0.5}
      - {max_tokens: 8192, temperature: 0.8, share: 0.5}

Load profile (YAML or JSON)::

    phases:
      - {seconds: 60, concurrency: 8}      # steady
      - {seconds: 30, ramp_to: 128}        # linear ramp from the previous level
      - {seconds: 10, concurrency: 256, name: burst}    # burst (``name``: optional, for reports)
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import ConfigError
from orchestrator.table import RoutingTable

__all__ = ["LoadPhase", "LoadProfile", "RequestClass", "TrafficError", "TrafficMix", "load_mix", "load_profile",
           "mix_from_request_log"]


class TrafficError(ConfigError):
    """A traffic mix, request log or load profile is invalid; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RequestClass(_Model):
    """Requests with this ``max_tokens`` and ``temperature`` (``None``: the mix's default) in ``share``."""

    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    share: float = Field(gt=0)


class TrafficMix(_Model):
    """Request classes and their shares (normalised to 1)."""

    classes: tuple[RequestClass, ...] = Field(min_length=1)
    default_temperature: float | None = Field(default=None, ge=0, le=2)

    @model_validator(mode="after")
    def _temperature_known(self) -> TrafficMix:
        if self.default_temperature is None and any(c.temperature is None for c in self.classes):
            raise ValueError("a class without temperature needs the mix's default_temperature "
                             "(the engine's default, e.g. 0.7 for LMDeploy's OpenAI endpoints)")
        return self

    def normalised(self) -> list[tuple[RequestClass, float]]:
        """Each class with its share of the requests, the shares summing to 1."""
        total = sum(c.share for c in self.classes)
        return [(c, c.share / total) for c in self.classes]

    def temperature_of(self, c: RequestClass) -> float:
        return c.temperature if c.temperature is not None else float(self.default_temperature or 0.0)

    def cell_shares(self, table: RoutingTable, *, by: str = "requests") -> dict[tuple[str, str], float]:
        """(bucket name, sampling band name) -> share of the requests (``by="requests"``) or of the
        output tokens, counting ``max_tokens`` per request (``by="tokens"``), routed as ``table`` routes."""
        if by not in ("requests", "tokens"):
            raise TrafficError(f"by={by!r}; allowed: requests, tokens")
        out: Counter[tuple[str, str]] = Counter()
        for c, share in self.normalised():
            band = table.band_for(self.temperature_of(c))
            if band is None:
                raise TrafficError(f"temperature {self.temperature_of(c)} falls in no sampling band of the table "
                                   f"({[b.name for b in table.sampling_bands]})")
            weight = share * (c.max_tokens if by == "tokens" else 1)
            out[(table.bucket_for(c.max_tokens).name, band.name)] += weight
        total = sum(out.values())
        return {k: v / total for k, v in out.items()}


def _read_structured(path: Path, what: str) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise TrafficError(f"cannot read {what} {path}: {e}") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise TrafficError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from None


def load_mix(path: str | Path) -> TrafficMix:
    """A mix file (YAML, or JSON by its suffix)."""
    data = _read_structured(Path(path), "traffic mix")
    try:
        return TrafficMix.model_validate(data)
    except ValidationError as e:
        raise TrafficError(f"{path}: invalid traffic mix: {e}") from None


def mix_from_request_log(lines: Iterable[str], *, default_temperature: float | None,
                         default_max_tokens: int) -> TrafficMix:
    """The mix of a request log: one JSON object per line, an OpenAI request body or ``{"body": {...}}``.

    ``max_completion_tokens`` (else ``max_tokens``, else ``default_max_tokens``) and ``temperature``
    (else the default) of each request are counted; blank lines are skipped, anything else that is
    not such an object is an error naming its line."""
    counts: Counter[tuple[int, float | None]] = Counter()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise TrafficError(f"request log line {n}: not JSON ({e})") from None
        body = obj.get("body", obj) if isinstance(obj, dict) else None
        if not isinstance(body, dict):
            raise TrafficError(f"request log line {n}: expected a JSON object (a request body)")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max_tokens))
        temperature = body.get("temperature")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise TrafficError(f"request log line {n}: max_tokens={max_tokens!r} is not a positive integer")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                        or not 0 <= temperature <= 2):
            raise TrafficError(f"request log line {n}: temperature={temperature!r} is not a number in 0..2")
        counts[(max_tokens, None if temperature is None else float(temperature))] += 1
    if not counts:
        raise TrafficError("the request log holds no requests")
    try:
        return TrafficMix(classes=tuple(RequestClass(max_tokens=m, temperature=t, share=c)
                                        for (m, t), c in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1))),
                          default_temperature=default_temperature)
    except ValidationError as e:
        raise TrafficError(f"request log: {e}") from None


class LoadPhase(_Model):
    """``seconds`` at ``concurrency`` in-flight requests, or ramping linearly to ``ramp_to``; ``name``
    labels the phase in reports (default: its kind and level)."""

    seconds: float = Field(gt=0)
    concurrency: int | None = Field(default=None, ge=1)
    ramp_to: int | None = Field(default=None, ge=1)
    name: str | None = Field(default=None, min_length=1, max_length=40)

    @model_validator(mode="after")
    def _one_kind(self) -> LoadPhase:
        if (self.concurrency is None) == (self.ramp_to is None):
            raise ValueError("a phase has exactly one of concurrency (steady or burst) and ramp_to (ramp)")
        return self


class LoadProfile(_Model):
    """Concurrency over time, phase after phase."""

    phases: tuple[LoadPhase, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _starts_steady(self) -> LoadProfile:
        if self.phases[0].ramp_to is not None:
            raise ValueError("the first phase cannot be a ramp (it has no level to ramp from)")
        return self

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def windows(self) -> list[tuple[float, float]]:
        """``(start, end)`` seconds of each phase."""
        out, start = [], 0.0
        for p in self.phases:
            out.append((start, start + p.seconds))
            start += p.seconds
        return out

    def label(self, i: int) -> str:
        """Phase ``i``'s name, else its kind and level (``steady 64``, ``ramp 64->128``)."""
        p = self.phases[i]
        if p.name:
            return p.name
        if p.ramp_to is None:
            return f"steady {p.concurrency}"
        before = self.phases[i - 1]
        return f"ramp {before.concurrency if before.ramp_to is None else before.ramp_to}->{p.ramp_to}"

    def phase_at(self, t: float) -> int:
        """Index of the phase running at ``t`` seconds (the last one after the end)."""
        elapsed = 0.0
        for i, p in enumerate(self.phases):
            elapsed += p.seconds
            if t < elapsed:
                return i
        return len(self.phases) - 1

    def concurrency_at(self, t: float) -> int:
        """In-flight requests the driver keeps at ``t`` seconds from the start."""
        level = float(self.phases[0].concurrency or 1)
        start = 0.0
        for p in self.phases:
            if t < start + p.seconds:
                if p.ramp_to is None:
                    return int(p.concurrency or 1)
                return max(1, round(level + (p.ramp_to - level) * (t - start) / p.seconds))
            level = float(p.concurrency if p.ramp_to is None else p.ramp_to)
            start += p.seconds
        return max(1, round(level))


def load_profile(source: str | Path | Mapping[str, Any]) -> LoadProfile:
    """A load profile from a file (YAML, or JSON by its suffix) or an already-parsed mapping."""
    data = source if isinstance(source, Mapping) else _read_structured(Path(source), "load profile")
    try:
        return LoadProfile.model_validate(data)
    except ValidationError as e:
        raise TrafficError(f"invalid load profile: {e}") from None
