"""The OpenAI request surface the router accepts: parse, validate, and say precisely what is wrong.

Pure (no I/O): bytes in, a :class:`ParsedRequest` or an :class:`ApiError` out, so the parser is
fuzzed directly (``tests/unit/test_policy.py``). The router must never crash on client input, so every
failure a client can cause is an :class:`ApiError` with an OpenAI-style body::

    {"error": {"message": ..., "type": "invalid_request_error", "param": "max_tokens", "code": ...}}

Only the fields the router acts on (``model``, ``messages``/``prompt``, ``max_tokens``,
``max_completion_tokens``, ``stream``, ``stream_options``) and the common sampling fields are
checked; other fields pass through to the engine untouched (engines differ in what they accept).
Types are strict: ``"max_tokens": "5"`` is an error, not 5.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from orchestrator.errors import OrchestratorError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "ApiError",
    "ParsedRequest",
    "encode_body",
    "parse_request",
]

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""Bodies above this are refused with 413: a chat request for a 16k-token context is ~100 KB."""

RequestKind = Literal["chat", "completions"]


@dataclass(frozen=True)
class ApiError(OrchestratorError):
    """An error answered to the client as an OpenAI-style body with ``status``."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Open(BaseModel):
    # Unknown fields pass through to the engine; the ones declared are validated strictly.
    model_config = ConfigDict(extra="allow", strict=True)


class _StreamOptions(_Open):
    include_usage: StrictBool | None = None


class _ChatMessage(_Open):
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: StrictStr | list[dict[str, Any]] | None = None


class _Common(_Open):
    model: StrictStr | None = Field(default=None, min_length=1, max_length=512)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    stream: StrictBool | None = False
    stream_options: _StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=-1)
    n: StrictInt | None = Field(default=None, ge=1, le=16)
    seed: StrictInt | None = None


class _ChatRequest(_Common):
    messages: list[_ChatMessage] = Field(min_length=1)


class _CompletionRequest(_Common):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


_MODELS: dict[str, type[_Common]] = {"chat": _ChatRequest, "completions": _CompletionRequest}


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request.

    Attributes:
        kind: ``chat`` or ``completions``.
        body: the JSON object to forward (the client's, with ``model`` set to the served name).
        max_tokens: the output cap the client asked for (``max_completion_tokens`` wins), or ``None``.
        stream: whether the client asked for a stream.
        client_wants_usage: ``stream_options.include_usage`` as the client sent it.
        temperature: the sampling temperature that decides the request's sampling band: the client's,
            0 when ``top_k`` is 1 (only the argmax can be drawn, as greedy), ``None`` when it gave none
            (the table's ``default_temperature`` then applies).
    """

    kind: RequestKind
    body: dict[str, Any]
    max_tokens: int | None
    stream: bool
    client_wants_usage: bool
    temperature: float | None = None


def parse_request(
    raw: bytes,
    kind: RequestKind,
    *,
    served_model_names: frozenset[str] | set[str],
    max_tokens_limit: int,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> ParsedRequest:
    """Validate one request body.

    Args:
        raw: the HTTP body as received.
        kind: which endpoint it was sent to.
        served_model_names: model names the deployment answers to; a request without ``model`` gets
            the first (sorted) one.
        max_tokens_limit: largest ``max_tokens`` accepted.
        max_body_bytes: larger bodies are refused with 413.

    Raises:
        ApiError: 400 (malformed / invalid), 404 (unknown model), 413 (too large).
    """
    if len(raw) > max_body_bytes:
        raise ApiError(
            413, f"request body is {len(raw)} bytes; the limit is {max_body_bytes} bytes",
            code="request_too_large",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {e.start})", code="invalid_encoding") from None
    if not text.strip():
        raise ApiError(400, "request body is empty; send a JSON object", code="invalid_json")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "nesting too deep"
        raise ApiError(400, f"request body is not valid JSON: {msg}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    _refuse_lone_surrogates(data, ())
    try:
        req = _MODELS[kind].model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    except (ValueError, TypeError, RecursionError) as e:  # pragma: no cover - pydantic wraps these
        raise ApiError(400, f"invalid request: {e}") from None

    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(req, name)
        if value is not None and not 1 <= value <= max_tokens_limit:
            raise ApiError(
                400, f"{name}={value} is out of range; allowed: 1..{max_tokens_limit}",
                param=name, code="invalid_value",
            )
    names = sorted(served_model_names)
    if req.model is not None and req.model not in served_model_names:
        raise ApiError(
            404, f"the model {req.model!r} does not exist; available: {names}",
            param="model", code="model_not_found",
        )
    body = dict(data)
    body["model"] = req.model if req.model is not None else names[0]
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return ParsedRequest(
        kind=kind,
        body=body,
        max_tokens=max_tokens,
        stream=bool(req.stream),
        client_wants_usage=bool(req.stream_options and req.stream_options.include_usage),
        temperature=0.0 if req.top_k == 1 else req.temperature,
    )


def encode_body(body: dict[str, Any]) -> bytes:
    """The JSON bytes the router forwards to an engine (UTF-8, non-ASCII kept as is).

    Every string in a body that :func:`parse_request` accepted is valid Unicode, so this never fails
    on client input.
    """
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def _refuse_lone_surrogates(value: Any, path: tuple[str, ...]) -> None:
    """400 naming the field when a string (or key) holds a lone UTF-16 surrogate escape (``"\\ud800"``).

    JSON allows such escapes, but they are not Unicode characters: the body cannot be re-encoded
    as UTF-8 for the engine, and an engine's tokenizer refuses them. Refused here so the client gets
    a 400 with the field's name instead of a 5xx from the router or the engine.
    """
    if isinstance(value, str):
        bad = _first_surrogate(value)
        if bad is not None:
            field = ".".join(path) or "body"
            raise ApiError(
                400, f"{field}: contains a lone UTF-16 surrogate escape (\\u{ord(value[bad]):04x} at character {bad}), "
                "which is not a Unicode character; send valid Unicode (pair \\ud800-\\udbff with \\udc00-\\udfff)",
                param=field, code="invalid_encoding",
            )
    elif isinstance(value, dict):
        for k, v in value.items():
            if _first_surrogate(k) is not None:
                field = ".".join(path) or "body"
                raise ApiError(400, f"{field}: the key {ascii(k)} contains a lone UTF-16 surrogate escape; "
                               "send valid Unicode", param=field, code="invalid_encoding")
            _refuse_lone_surrogates(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _refuse_lone_surrogates(v, (*path, str(i)))


def _first_surrogate(s: str) -> int | None:
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _validation_error(e: ValidationError) -> ApiError:
    errors = e.errors(include_url=False, include_input=False)
    first = errors[0] if errors else {"loc": (), "msg": str(e), "type": "invalid"}
    loc = [str(p) for p in first.get("loc", ())]
    # Union errors name the union member (e.g. "str", "list[...]") in loc; keep the field path.
    path = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "list")]
    param = ".".join(path) or None
    kind = first.get("type", "invalid")
    code = "missing_required_field" if kind == "missing" else "invalid_type" if kind.endswith("_type") else "invalid_value"
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    return ApiError(400, f"{param or 'body'}: {first.get('msg', 'invalid')}{more}", param=param, code=code)
