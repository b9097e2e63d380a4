"""Malformed and hostile input: against the running router (real Ray Serve, a simulated engine) and
fuzzed directly at the two parsers that take outside input.

Not repeated from ``tests/integration/test_serve_app.py`` (which checks a dozen bad chat bodies, 401s and a
5 MiB body) nor from ``tests/unit/test_policy.py`` (random bytes / random JSON into ``parse_request``).
Added here:

- a wider table of bad requests on *both* endpoints, each answered with an OpenAI-style 4xx and
  followed by a good request that must still succeed (the router keeps serving);
- a prompt longer than the engine's context (the engine's 400 reaches the client as is);
- a body sent without ``content-length`` (chunked) that grows past the limit;
- slow-loris clients (headers a byte at a time; a body that never finishes): other clients are
  served meanwhile, and a body that does not arrive within ``body_timeout_s`` gets a 408. Headers
  that never finish are *not* cut off: Serve's HTTP proxy (uvicorn) has no header-read timeout and
  Serve exposes none, so they only cost an idle socket each; put a proxy with a header timeout
  (nginx ``client_header_timeout``, a cloud load balancer) in front of a public endpoint;
- hypothesis: *structure-aware* mutations of valid requests (``parse_request``) and of a valid
  routing table (``orchestrator.table.parse``): every mutant is accepted with its invariants, or refused
  with the module's own error, never anything else.
"""
from __future__ import annotations

import copy
import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import EngineConfig
from orchestrator.serve.protocol import ApiError, encode_body, parse_request
from orchestrator import table as routing
from orchestrator.table import RoutingTableError

MODEL = "intern-s2-preview-8xh200"
API_KEY = "sk-bad-input-test"
APP = "mtp-bad-input"
SESSION_LEN = 2048
ENGINE = EngineConfig(backend="sim", model=MODEL, tp=8, session_len=SESSION_LEN)
MAX_BODY = 64 * 1024
BODY_TIMEOUT_S = 3.0

# ----- the running router ------------------------------------------------------------------------------


class Router:
    def __init__(self, base: str, port: int) -> None:
        self.base, self.port = base, port
        self.auth = {"authorization": f"Bearer {API_KEY}"}

    def good(self, http: httpx.Client) -> None:
        r = http.post(self.base + "/v1/completions", headers=self.auth, timeout=60,
                      json={"model": MODEL, "prompt": "still there?", "max_tokens": 4})
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def router(tmp_path_factory, write_sim_table, sim_app_args, serve_app):
    tmp = tmp_path_factory.mktemp("bad-input")
    table = write_sim_table(tmp / "routing.json", [("le4096", 4096, ENGINE)], sweep_id="bad-input")
    args = sim_app_args(table, tmp / "engine-logs", api_keys=[API_KEY], sim_time_scale=4.0,
                        max_body_bytes=MAX_BODY, body_timeout_s=BODY_TIMEOUT_S)
    with serve_app(args, app_name=APP, http_options={"keep_alive_timeout_s": 5}) as base:
        yield Router(base, int(base.rsplit(":", 1)[1]))


GOOD_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
GOOD_COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 4}


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# (endpoint, body bytes, extra headers, expected status, expected param or None)
CASES: list[tuple[str, bytes, dict[str, str], int, str | None]] = [
    # not JSON / not an object
    ("chat", b"", {}, 400, None),
    ("chat", b"   \n\t ", {}, 400, None),
    ("chat", b"null", {}, 400, None),
    ("chat", b'"a string"', {}, 400, None),
    ("completions", b"[" * 100_00 + b"]" * 100_00, {}, 400, None),  # nesting bomb (20 KB)
    ("completions", b'{"prompt": "x", "max_tokens": 4,}', {}, 400, None),  # trailing comma
    ("completions", b'{"prompt": "x"} trailing', {}, 400, None),
    # invalid UTF-8 anywhere, incl. inside a string and as an overlong / surrogate encoding
    ("completions", b'{"prompt": "\xc3\x28", "max_tokens": 4}', {}, 400, None),
    ("completions", b'{"prompt": "\xed\xa0\x80", "max_tokens": 4}', {}, 400, None),
    ("chat", b'{"messages": [{"role": "user", "content": "\xc0\xaf"}]}', {}, 400, None),
    # wrong types
    ("completions", _j({**GOOD_COMPLETION, "prompt": 42}), {}, 400, "prompt"),
    ("completions", _j({**GOOD_COMPLETION, "prompt": {"text": "x"}}), {}, 400, "prompt"),
    ("completions", _j({**GOOD_COMPLETION, "prompt": [1, "two", 3]}), {}, 400, "prompt"),
    ("completions", _j({**GOOD_COMPLETION, "max_tokens": True}), {}, 400, "max_tokens"),
    ("completions", _j({**GOOD_COMPLETION, "max_tokens": None, "max_completion_tokens": "8"}), {}, 400,
     "max_completion_tokens"),
    ("completions", _j({**GOOD_COMPLETION, "stream": 1}), {}, 400, "stream"),
    ("completions", _j({**GOOD_COMPLETION, "stream_options": "yes"}), {}, 400, "stream_options"),
    ("completions", _j({**GOOD_COMPLETION, "model": 7}), {}, 400, "model"),
    ("completions", _j({**GOOD_COMPLETION, "n": 10_000}), {}, 400, "n"),
    ("chat", _j({**GOOD_CHAT, "messages": [{"content": "no role"}]}), {}, 400, None),
    ("chat", _j({**GOOD_CHAT, "messages": ["just a string"]}), {}, 400, None),
    ("chat", _j({**GOOD_CHAT, "messages": {"role": "user", "content": "x"}}), {}, 400, "messages"),
    ("chat", _j({**GOOD_CHAT, "messages": [{"role": "user", "content": 12}]}), {}, 400, None),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', {}, 400, "temperature"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "top_p": Infinity}', {}, 400, "top_p"),
    # out of range
    ("completions", _j({**GOOD_COMPLETION, "max_tokens": -1}), {}, 400, "max_tokens"),
    ("completions", _j({**GOOD_COMPLETION, "max_tokens": 2**63}), {}, 400, "max_tokens"),
    ("completions", _j({**GOOD_COMPLETION, "max_tokens": 10**400}), {}, 400, "max_tokens"),
    ("completions", _j({**GOOD_COMPLETION, "max_completion_tokens": 0}), {}, 400, "max_completion_tokens"),
    ("chat", _j({**GOOD_CHAT, "temperature": -0.5}), {}, 400, "temperature"),
    # unknown model, empty model
    ("completions", _j({**GOOD_COMPLETION, "model": "../../etc/passwd"}), {}, 404, "model"),
    ("completions", _j({**GOOD_COMPLETION, "model": ""}), {}, 400, "model"),
    ("chat", _j({**GOOD_CHAT, "model": MODEL + "\x00"}), {}, 404, "model"),
    # lone UTF-16 surrogate escapes: valid JSON, not Unicode; a 400 naming the field, never a 5xx
    ("completions", b'{"prompt": "a\\ud800b", "max_tokens": 4}', {}, 400, "prompt"),
    ("completions", b'{"prompt": ["ok", "\\udc00"], "max_tokens": 4}', {}, 400, "prompt.1"),
    ("chat", b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 4}', {}, 400,
     "messages.0.content"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "model": "\\udfff", "max_tokens": 4}', {}, 400, "model"),
    ("chat", b'{"messages": [{"role": "user", "content": "x"}], "user": "\\ud83d", "max_tokens": 4}', {}, 400, "user"),
    # prompt + output beyond the engine's context (session_len 2048): the engine says so, as a 400
    ("completions", _j({**GOOD_COMPLETION, "prompt": "word " * 3000, "max_tokens": 16}), {}, 400, "max_tokens"),
    ("chat", _j({**GOOD_CHAT, "max_tokens": SESSION_LEN + 100}), {}, 400, "max_tokens"),
    # too large: declared, and real
    ("completions", _j({**GOOD_COMPLETION, "prompt": "x" * (MAX_BODY + 1)}), {}, 413, None),
]


def _ids() -> list[str]:
    return [f"{i}-{kind}-{status}" for i, (kind, _, _, status, _) in enumerate(CASES)]


@pytest.mark.timeout(300)
def test_bad_requests_get_openai_4xx_and_the_router_keeps_serving(router: Router):
    paths = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
    failures = []
    with httpx.Client(timeout=60) as http:
        for i, (kind, body, headers, status, param) in enumerate(CASES):
            r = http.post(router.base + paths[kind], content=body,
                          headers={**router.auth, "content-type": "application/json", **headers})
            ok = r.status_code == status
            try:
                err = r.json()["error"]
                ok = ok and set(err) == {"message", "type", "param", "code"} and bool(err["message"])
                ok = ok and (param is None or err["param"] == param)
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                failures.append((i, r.status_code, r.text[:300]))
            router.good(http)
        # Methods and paths that don't exist are errors too, never a crash.
        assert http.get(router.base + "/v1/completions", headers=router.auth).status_code == 405
        assert http.put(router.base + "/v1/chat/completions", headers=router.auth).status_code == 405
        r = http.get(router.base + "/v1/" + "a" * 5000, headers=router.auth)
        assert 400 <= r.status_code < 500
        router.good(http)
    assert not failures, failures


def _raw_exchange(port: int, data: bytes, timeout_s: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while True:  # until the whole answer (headers + content-length bytes) is in, or the server closes
            head, sep, body = out.partition(b"\r\n\r\n")
            if sep:
                lengths = [int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")
                           if ln.lower().startswith(b"content-length:")]
                if lengths and len(body) >= lengths[0]:
                    return out
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


@pytest.mark.timeout(120)
def test_declared_huge_body_is_refused_before_it_is_read(router: Router):
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {API_KEY}\r\n"
            f"content-type: application/json\r\ncontent-length: {10**12}\r\n\r\n{{}}").encode()
    started = time.monotonic()
    answer = _raw_exchange(router.port, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"request_too_large" in answer
    assert time.monotonic() - started < 10  # answered at once, not after waiting for 1 TB
    with httpx.Client(timeout=30) as http:
        router.good(http)


@pytest.mark.timeout(120)
def test_chunked_body_growing_past_the_limit_is_cut_off(router: Router):
    def chunks():
        for _ in range(64):  # 64 x 4 KiB = 256 KiB > MAX_BODY, no content-length
            yield b" " * 4096

    with httpx.Client(timeout=60) as http:
        try:
            r = http.post(router.base + "/v1/completions", content=chunks(),
                          headers={**router.auth, "content-type": "application/json"})
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
        except httpx.HTTPError:
            pass  # the server may answer 413 and close before the client finished sending
        router.good(http)


def _slow_client(port: int, payload: bytes, delay_s: float, stop: threading.Event, result: dict) -> None:
    """Send ``payload`` one byte every ``delay_s`` (stop when told); record how it ended."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.settimeout(0.05)
    started = time.monotonic()
    try:
        for b in payload:
            if stop.is_set():
                result["ended"] = "stopped by the test"
                return
            try:
                s.sendall(bytes([b]))
            except OSError as e:
                result["ended"] = f"server closed while sending: {e!r}"
                result["after_s"] = time.monotonic() - started
                return
            t_end = time.monotonic() + delay_s
            while time.monotonic() < t_end:
                try:
                    data = s.recv(4096)
                except TimeoutError:
                    continue
                except OSError as e:
                    result["ended"] = f"reset: {e!r}"
                    result["after_s"] = time.monotonic() - started
                    return
                result["ended"] = "closed" if not data else data.decode(errors="replace")[:200]
                result["after_s"] = time.monotonic() - started
                return
        # Everything sent (a body that is shorter than declared): wait for the server to give up.
        s.settimeout(60)
        try:
            data = s.recv(4096)
            result["ended"] = "closed" if not data else data.decode(errors="replace")[:200]
        except OSError as e:
            result["ended"] = f"reset: {e!r}"
        result["after_s"] = time.monotonic() - started
    finally:
        s.close()


@pytest.mark.timeout(180)
def test_slow_loris_clients_dont_block_others_and_are_cut_off(router: Router):
    body = _j(GOOD_COMPLETION)
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {API_KEY}\r\n"
            "content-type: application/json\r\n")
    slow_headers = (head + "x-pad: " + "a" * 400 + "\r\n" + f"content-length: {len(body)}\r\n\r\n").encode() + body
    # Headers complete, then a body that declares 1000 bytes and sends 10 (never finishes).
    stalled_body = (head + "content-length: 1000\r\n\r\n").encode() + body[:10]
    stop = threading.Event()
    results: list[dict] = [{} for _ in range(6)]
    clients = [threading.Thread(target=_slow_client, args=(router.port, slow_headers, 0.2, stop, results[i]), daemon=True)
               for i in range(3)]
    clients += [threading.Thread(target=_slow_client, args=(router.port, stalled_body, 0.0, stop, results[i]), daemon=True)
                for i in range(3, 6)]
    for t in clients:
        t.start()
    try:
        # Others are served normally meanwhile.
        time.sleep(1.0)
        with httpx.Client(timeout=30) as http:
            for _ in range(5):
                started = time.monotonic()
                router.good(http)
                assert time.monotonic() - started < 10
        # The stalled bodies are cut off by the router's body timeout with a 408.
        for t in clients[3:]:
            t.join(timeout=BODY_TIMEOUT_S + 30)
        for r in results[3:]:
            assert "408" in r.get("ended", ""), results
            assert r["after_s"] < BODY_TIMEOUT_S + 15, results
        # The byte-a-byte headers are still trickling in (Serve's proxy, uvicorn, has no header
        # timeout: a known limit, see the module docstring) and are not holding anyone up.
        assert all(t.is_alive() for t in clients[:3]) and not any(results[:3]), results
        with httpx.Client(timeout=30) as http:
            router.good(http)
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=5)
    with httpx.Client(timeout=30) as http:
        router.good(http)


# ----- structure-aware fuzzing of the request parser --------------------------------------------------
NAMES = frozenset({MODEL})
LIMIT = 100_000

_weird = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
).map(copy.deepcopy)  # drawn values are mutated later: never share one between examples


def _valid_chat() -> st.SearchStrategy[dict]:
    msg = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": st.text(max_size=40)})
    return st.fixed_dictionaries(
        {"messages": st.lists(msg, min_size=1, max_size=3)},
        optional={"model": st.just(MODEL), "max_tokens": st.integers(1, LIMIT),
                  "max_completion_tokens": st.integers(1, LIMIT), "stream": st.booleans(),
                  "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
                  "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "n": st.integers(1, 16),
                  "seed": st.integers(0, 2**31), "ignore_eos": st.booleans()},
    )


def _valid_completion() -> st.SearchStrategy[dict]:
    prompt = st.one_of(st.text(max_size=40), st.lists(st.text(max_size=10), max_size=3),
                       st.lists(st.integers(0, 50_000), max_size=5))
    return st.fixed_dictionaries(
        {"prompt": prompt},
        optional={"model": st.just(MODEL), "max_tokens": st.integers(1, LIMIT), "stream": st.booleans(),
                  "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})},
    )


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def _mutated(draw: st.DrawFn, base: st.SearchStrategy[dict]) -> dict:
    """A valid document with 0-3 mutations at random places: replace a value, delete a key, add a
    key, or wrap a value in a list."""
    doc = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "delete", "add", "wrap"]))
        if not path:
            if op == "add":
                doc[draw(st.sampled_from(["max_tokens", "prompt", "messages", "model", "stream", "zz"]))] = draw(_weird)
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        key = path[-1]
        if op == "replace":
            parent[key] = draw(_weird)
        elif op == "delete":
            del parent[key]
        elif op == "wrap":
            parent[key] = [parent[key]]
        elif isinstance(parent[key], dict):
            parent[key][draw(st.text(max_size=8))] = draw(_weird)
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_mutated(_valid_chat()).map(lambda d: ("chat", d)),
                 _mutated(_valid_completion()).map(lambda d: ("completions", d))))
def test_mutated_valid_requests_parse_or_get_a_4xx(kind_doc):
    kind, doc = kind_doc
    raw = json.dumps(doc, allow_nan=True).encode()
    try:
        p = parse_request(raw, kind, served_model_names=NAMES, max_tokens_limit=LIMIT)
    except ApiError as e:
        assert 400 <= e.status < 500
        body = e.body()
        json.dumps(body)  # serialisable: no raw objects in the message
        assert body["error"]["message"] and body["error"]["type"]
        return
    # Accepted: the invariants the router relies on.
    assert p.kind == kind and p.body["model"] == MODEL
    assert p.max_tokens is None or (isinstance(p.max_tokens, int) and 1 <= p.max_tokens <= LIMIT)
    assert isinstance(p.stream, bool) and isinstance(p.client_wants_usage, bool)
    json.dumps(p.body, allow_nan=True)
    assert ("messages" in p.body) if kind == "chat" else ("prompt" in p.body)


_odd_text = st.text(
    alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"]),  # lone surrogates: Cs
                       st.sampled_from(["\x00", "\ufeff", "\u202e", "\U0001f600", "\ud83d", "\ude00", "\\", '"'])),
    max_size=12,
)


def _string_paths(obj: Any) -> list[tuple]:
    return [p for p in _paths(obj) if isinstance(_at(obj, p), str)]


def _at(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


@st.composite
def _with_odd_strings(draw: st.DrawFn, base: st.SearchStrategy[dict]) -> dict:
    """A valid document whose string fields (any of them, and a pass-through field) hold odd strings:
    lone surrogates, NUL, BOM, bidi overrides, astral characters, quotes and backslashes."""
    doc = copy.deepcopy(draw(base))
    doc["user"] = "someone"  # a field the router passes through untouched
    for path in draw(st.lists(st.sampled_from(_string_paths(doc)), min_size=1, max_size=3, unique=True)):
        parent = _at(doc, path[:-1])
        parent[path[-1]] = draw(_odd_text)
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_with_odd_strings(_valid_chat()).map(lambda d: ("chat", d)),
                 _with_odd_strings(_valid_completion()).map(lambda d: ("completions", d))))
def test_odd_strings_in_any_string_field_are_forwarded_or_named_in_a_4xx(kind_doc):
    """What the router does with a body: parse it, then re-encode it for the engine (accepted) or answer
    the error as a JSON response (refused). Neither step may fail on any string a client can send
    (``json.dumps`` escapes lone surrogates as ``\\ud800``, which JSON allows)."""
    from starlette.responses import JSONResponse

    kind, doc = kind_doc
    raw = json.dumps(doc).encode()
    try:
        p = parse_request(raw, kind, served_model_names=NAMES | {doc.get("model") or MODEL}, max_tokens_limit=LIMIT)
    except ApiError as e:
        assert 400 <= e.status < 500
        JSONResponse(e.body(), status_code=e.status)  # the router's error response renders
        if e.code == "invalid_encoding":  # names the field the client sent, which holds a lone surrogate
            bad = [q for q in _paths(doc) if ".".join(map(str, q)) == e.param]
            assert bad and any(0xD800 <= ord(c) <= 0xDFFF for c in _at(doc, bad[0])), e
        return
    assert json.loads(encode_body(p.body)) == p.body  # the engine gets the client's strings unchanged


def test_a_paired_surrogate_escape_is_one_character_and_is_forwarded():
    p = parse_request(b'{"prompt": "\\ud83d\\ude00", "max_tokens": 4}', "completions",
                      served_model_names=NAMES, max_tokens_limit=LIMIT)
    assert p.body["prompt"] == "\U0001f600" and encode_body(p.body) == json.dumps(p.body, ensure_ascii=False).encode()


# ----- structure-aware fuzzing of routing-table loading --------------------------------------------------
def _valid_table() -> dict:
    cfg = lambda d: {"backend": "sim", "model": MODEL, "tp": 8, **(  # noqa: E731
        {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": d} if d else {})}
    return {
        "schema_version": routing.SCHEMA_VERSION,
        "version": 3,
        "provenance": {"model": MODEL, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "fuzz",
                       "created_at": "2026-11-29T00:00:00+00:00", "simulated": True},
        "buckets": [
            {"name": "le1024", "max_output_len": 1024, "config": cfg(0), "figures": {"output_throughput": 4600.0}},
            {"name": "le16384", "max_output_len": 16384, "config": cfg(3),
             "figures": {"output_throughput": 12000.0, "accept_length": 3.6},
             "load_variants": [{"min_concurrency": 64, "config": cfg(1), "figures": {"output_throughput": 9000.0}}],
             "baselines": {"mtp_off": {"output_throughput": 6100.0}}, "gains": {"mtp_off": 0.97}},
        ],
        "default_max_tokens": 1024,
    }


_finite_weird = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30).filter(
        lambda t: t.strip().lower().lstrip("+-") not in ("nan", "inf", "infinity")),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
# Non-finite numbers are left out here: the schema accepts them today (a known bug, pinned by the
# strict xfail below); every other mutation must load with the invariants or be refused.
_table_values = st.one_of(
    _finite_weird, st.sampled_from(["sim", "pytorch", "turbomind", "qwen3_5_mtp", "le1024", ""]),
    st.integers(-3, 20), st.floats(-1, 2), st.builds(list), st.builds(dict),
).map(copy.deepcopy)


@st.composite
def _mutated_table(draw: st.DrawFn) -> dict:
    doc = _valid_table()
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        key = path[-1]
        op = draw(st.sampled_from(["replace", "delete", "duplicate", "swap", "add"]))
        if op == "replace":
            parent[key] = draw(_table_values)
        elif op == "delete":
            del parent[key]
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        elif op == "swap" and isinstance(parent, list) and len(parent) > 1:
            parent.reverse()
        elif op == "add" and isinstance(parent[key], dict):
            parent[key][draw(st.sampled_from(["extra", "version", "tp", "name", "max_output_len"]))] = draw(_table_values)
    return doc


def _check_table_invariants(t: routing.RoutingTable) -> None:
    bounds = [b.max_output_len for b in t.buckets]
    assert bounds == sorted(set(bounds)) and all(b > 0 for b in bounds)
    assert len({b.name for b in t.buckets}) == len(t.buckets)
    for b in t.buckets:
        b.engine_config()  # every config builds an engine command
        for c in b.cells:  # the valid table's load_variants are read as cells
            c.engine_config()
    for n in (None, 1, bounds[-1], bounds[-1] + 1, 10**9):
        assert t.bucket_for(n) in t.buckets
    # What loads is written as standard JSON (no NaN/Infinity: jq, browsers and Go refuse them) and
    # round-trips (the router re-parses the JSON it was built with).
    text = t.to_json()
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"non-standard JSON: {c}")))
    assert routing.parse(text) == t


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_table())
def test_mutated_valid_tables_load_with_invariants_or_raise_routing_table_error(doc):
    for candidate in (doc, json.dumps(doc, allow_nan=True)):
        try:
            t = routing.parse(candidate)
        except RoutingTableError as e:
            assert str(e)
            continue
        _check_table_invariants(t)


def test_the_unmutated_table_is_valid():
    _check_table_invariants(routing.parse(_valid_table()))


@pytest.mark.parametrize("where, value", [("gains", "nan"), ("gains", float("inf")), ("figures", float("inf"))])
def test_non_finite_numbers_are_refused(where, value):
    doc = _valid_table()
    target = doc["buckets"][1]["gains"] if where == "gains" else doc["buckets"][1]["figures"]
    target["mtp_off" if where == "gains" else "output_throughput"] = value
    with pytest.raises(RoutingTableError):
        routing.parse(doc)
