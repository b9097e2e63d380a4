"""Security properties of the serving path (real Ray Serve, a simulated engine).

Not repeated: ``tests/integration/test_serve_app.py`` checks 401 for a missing / wrong / non-Bearer key and that
an error body never echoes the key; ``tests/unit/test_clusters.py`` checks that cluster YAMLs and
manifests expose no public port and never set ``trust_remote_code``. Added here:

- keys on every endpoint that serves data (``/v1/models`` too), several keys at once, keys given as
  digests, and a key in a query string or another header not accepted;
- the key check is constant-time: ``hmac.compare_digest`` on fixed-length digests, once per
  configured key, no early exit (spied on through the standard library, not by mocking our code);
- keys never logged: after good and bad requests, neither the key nor a wrong guess appears in any
  log Ray or our engines wrote;
- engines inside replicas listen on 127.0.0.1 only (command line and the kernel's socket table);
- ``--trust-remote-code`` is never added unless a config asks for it.
"""
from __future__ import annotations

import hashlib
import hmac
import inspect
import json
import os
from pathlib import Path

import httpx
import pytest

from orchestrator.config import Backend, EngineConfig
from orchestrator.engine import engine_argv
from orchestrator import table as routing

MODEL = "intern-s2-preview-8xh200"
API_KEY = "sk-security-test-6f1c0e4b9a"
SECOND_KEY = "sk-second-key-only-as-digest-77aa"
WRONG_KEY = "sk-wrong-guess-3d2b1a"
APP = "mtp-security"
ENGINE = EngineConfig(backend="sim", model=MODEL, tp=8)

pytestmark = pytest.mark.timeout(240)


class Cluster:
    def __init__(self, base: str, log_dir: Path, session_dir: Path) -> None:
        self.base, self.log_dir, self.session_dir = base, log_dir, session_dir


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, write_sim_table, sim_app_args, serve_app):
    tmp = tmp_path_factory.mktemp("security")
    table = write_sim_table(tmp / "routing.json", [("le4096", 4096, ENGINE)], sweep_id="security")
    args = sim_app_args(table, tmp / "engine-logs", api_keys=[API_KEY],
                        api_key_sha256=[hashlib.sha256(SECOND_KEY.encode()).hexdigest()], sim_time_scale=4.0)
    with serve_app(args, app_name=APP) as base:
        import ray

        # This cluster's own session folder: /tmp/ray/session_latest may be another test run's.
        session_dir = Path(ray._private.worker._global_node.get_session_dir_path())
        yield Cluster(base, tmp / "engine-logs", session_dir)


def _chat(http: httpx.Client, base: str, headers: dict, url_suffix: str = "") -> httpx.Response:
    return http.post(base + "/v1/chat/completions" + url_suffix, headers=headers,
                     json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})


def test_keys_are_required_on_every_data_endpoint(cluster: Cluster):
    with httpx.Client(timeout=60) as http:
        # Both keys work: one given in clear (hashed at deploy), one given only as its digest.
        for key in (API_KEY, SECOND_KEY):
            assert _chat(http, cluster.base, {"authorization": f"Bearer {key}"}).status_code == 200
        assert http.get(cluster.base + "/v1/models", headers={"authorization": f"bearer {API_KEY}"}).status_code == 200
        refused = [
            ("no key on /v1/models", lambda: http.get(cluster.base + "/v1/models")),
            ("wrong key on /v1/models", lambda: http.get(cluster.base + "/v1/models",
                                                         headers={"authorization": f"Bearer {WRONG_KEY}"})),
            ("key in the query string", lambda: _chat(http, cluster.base, {}, f"?api_key={API_KEY}")),
            ("key in x-api-key", lambda: _chat(http, cluster.base, {"x-api-key": API_KEY})),
            ("key as Basic auth", lambda: _chat(http, cluster.base, {"authorization": f"Basic {API_KEY}"})),
            ("the key's digest as the key", lambda: _chat(
                http, cluster.base, {"authorization": f"Bearer {hashlib.sha256(API_KEY.encode()).hexdigest()}"})),
            ("a prefix of the key", lambda: _chat(http, cluster.base, {"authorization": f"Bearer {API_KEY[:-1]}"})),
            ("the key plus a suffix", lambda: _chat(http, cluster.base, {"authorization": f"Bearer {API_KEY}x"})),
            ("a completion without key", lambda: http.post(cluster.base + "/v1/completions",
                                                           json={"prompt": "x", "max_tokens": 2})),
        ]
        for what, call in refused:
            r = call()
            assert r.status_code == 401, (what, r.status_code, r.text[:200])
            assert r.headers.get("www-authenticate") == "Bearer", what
            assert r.json()["error"]["code"] == "invalid_api_key", what
            assert API_KEY not in r.text and WRONG_KEY not in r.text, what
        # Health stays open for load balancers, and says nothing about keys.
        r = http.get(cluster.base + "/health")
        assert r.status_code == 200 and "key" not in r.text.lower()


def test_key_check_is_constant_time_over_digests(monkeypatch, tmp_path, write_sim_table):
    """Spy on the standard library's ``hmac.compare_digest`` while the real router code checks keys:
    it is called once per configured key whatever the token (no early exit on a match or on a length
    mismatch), always on 32-byte digests, and nothing else compares the token."""
    from starlette.requests import Request

    from orchestrator.serve import router as router_module
    from orchestrator.serve.protocol import ApiError
    from orchestrator.serve.router import Router, RouterSpec, hash_api_key

    keys = (API_KEY, SECOND_KEY, "sk-third")
    table = write_sim_table(tmp_path / "routing.json", [("le4096", 4096, ENGINE)], sweep_id="security")
    spec = RouterSpec(table_json=routing.load(table).to_json(), served_model_names=(MODEL,),
                      api_key_sha256=tuple(hash_api_key(k) for k in keys))
    router = Router(spec.to_dict(), engines={})  # outside Serve: no replica context, no engines needed
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(router_module.hmac, "compare_digest", spy)

    def check(token: str) -> bool:
        calls.clear()
        scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"authorization", f"Bearer {token}".encode())]}
        try:
            router._authorize(Request(scope))
            return True
        except ApiError as e:
            assert e.status == 401
            return False

    for token, accepted in [(API_KEY, True), ("sk-third", True), (WRONG_KEY, False), ("x", False),
                            ("y" * 10_000, False), (API_KEY[:-1], False)]:
        assert check(token) is accepted, token
        assert calls == [(32, 32)] * len(keys), (token, calls)  # every key, digests only
    # And the code path has no other comparison of the secret.
    source = inspect.getsource(Router._authorize)
    assert "compare_digest" in source and "token ==" not in source and "== token" not in source
    # Keys are stored only as digests.
    assert all(len(h) == 32 for h in router._key_hashes)
    assert API_KEY not in json.dumps(router.spec.to_dict())


def _files_containing(root: Path, needles: list[bytes]) -> list[str]:
    hits = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                if path.is_symlink() or path.stat().st_size > 200 * 1024 * 1024:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            for n in needles:
                if n in data:
                    hits.append(f"{path}: {n.decode()}")
    return hits


def test_keys_are_never_logged(cluster: Cluster):
    import ray

    with httpx.Client(timeout=60) as http:
        for key, status in ((API_KEY, 200), (WRONG_KEY, 401), (SECOND_KEY, 200)):
            assert _chat(http, cluster.base, {"authorization": f"Bearer {key}"}).status_code == status
            r = http.post(cluster.base + "/v1/completions", headers={"authorization": f"Bearer {key}"},
                          content=b"{not json")
            assert r.status_code in (400, 401)
        # A key sent where it doesn't belong (the URL) is refused; URLs do get logged by access logs,
        # which is why the router never accepts a key from one.
        assert _chat(http, cluster.base, {}, f"?api_key={WRONG_KEY}").status_code == 401
    # Let Ray flush its log files.
    import time

    time.sleep(2.0)
    assert ray.is_initialized()
    logs = cluster.session_dir / "logs"
    assert logs.is_dir() and any(logs.iterdir()), logs
    assert list(cluster.log_dir.glob("*.log")), cluster.log_dir
    # Every log Ray and the engines wrote; the key from the URL is excluded only from its own check.
    hits = _files_containing(logs, [API_KEY.encode(), SECOND_KEY.encode()])
    hits += _files_containing(cluster.log_dir, [API_KEY.encode(), SECOND_KEY.encode(), WRONG_KEY.encode()])
    assert not hits, hits
    wrong_in_ray = [h for h in _files_containing(logs, [WRONG_KEY.encode()]) if "api_key=" not in h]
    assert not wrong_in_ray, wrong_in_ray


def test_engines_listen_on_loopback_only(cluster: Cluster, listening):
    from ray import serve

    info = serve.get_deployment_handle(ENGINE.key(), app_name=APP).engine_info.remote().result(timeout_s=30)
    argv = Path(f"/proc/{info['pid']}/cmdline").read_bytes().decode().split("\0")
    i = argv.index("--server-name")
    assert argv[i + 1] == "127.0.0.1", argv
    assert info["base_url"].startswith("http://127.0.0.1:")
    port = int(info["base_url"].rsplit(":", 1)[1])
    assert listening(port) == ["0100007F"], listening(port)  # 127.0.0.1, and nothing else (no ::, no 0.0.0.0)
    assert "--trust-remote-code" not in argv


def test_trust_remote_code_only_when_asked():
    for backend in Backend:
        cfg = EngineConfig(backend=backend, model=MODEL if backend == Backend.SIM else "/models/m", tp=2)
        for argv in (cfg.command(host="127.0.0.1", port=1), engine_argv(cfg, host="127.0.0.1", port=1)):
            assert not [a for a in argv if "trust" in a.replace("_", "-").lower()], (backend, argv)
        argv = cfg.command(host="127.0.0.1", port=1)
        flag = "--host" if backend == Backend.VLLM else "--server-name"  # vLLM's serve names it --host
        assert argv[argv.index(flag) + 1] == "127.0.0.1", (backend, argv)
    asked = EngineConfig(backend="pytorch", model="/models/m", extra_flags=("--trust-remote-code",))
    assert "--trust-remote-code" in asked.command(host="127.0.0.1", port=1)
    # No code path of ours adds it on its own.
    root = Path(__file__).resolve().parents[2]
    for package in ("orchestrator", "tuning"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert "trust-remote-code" not in text and "trust_remote_code" not in text, path
