"""The simulated engine as a real process over real HTTP, driven by the official openai client."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.errors import OrchestratorError
from orchestrator.sim.model import DEFAULT_PROFILE
from orchestrator.sim.server import OpenAIError

ROOT = Path(__file__).resolve().parents[2]
MTP = ["--speculative-algorithm", "qwen3_5_mtp", "--speculative-num-draft-tokens", "3"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post_completion(base: str, max_tokens: int = 4) -> None:
    body = json.dumps({"prompt": "hello", "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


class Sim:
    def __init__(self, *flags: str, time_scale: float = 50.0) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "orchestrator.sim", "--profile", DEFAULT_PROFILE,
                "--server-name", "127.0.0.1", "--server-port", str(self.port), "--tp", "8",
                "--cache-max-entry-count", "0.8", "--max-prefill-token-num", "8192",
                "--time-scale", str(time_scale), *flags]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sim exited {self.proc.returncode}: {self.proc.stdout.read()}")
            try:
                if _get(self.base + "/v1/models", 0.5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("sim not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self, timeout: float = 30.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", timeout=timeout, max_retries=0)


@contextmanager
def running(*flags: str, time_scale: float = 50.0) -> Iterator[Sim]:
    sim = Sim(*flags, time_scale=time_scale)
    try:
        sim.wait_ready()
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def mtp_sim() -> Iterator[Sim]:
    with running(*MTP) as sim:
        yield sim


def _metrics(sim: Sim) -> dict[str, float]:
    status, body, headers = _get(sim.base + "/metrics")
    assert status == 200
    return {s.name: s.value for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def test_models_info_and_header(mtp_sim: Sim) -> None:
    status, body, headers = _get(mtp_sim.base + "/v1/models")
    data = json.loads(body)
    assert data["data"][0]["id"] == DEFAULT_PROFILE and data["data"][0]["owned_by"] == "simulator"
    assert headers.get("x-simulated-engine") == "true"
    info = json.loads(_get(mtp_sim.base + "/sim/info")[1])
    assert info["simulated"] is True and info["time_scale"] == 50.0 and info["config"]["num_draft_tokens"] == 3
    assert _get(mtp_sim.base + "/health")[0] == 200


def test_completions_and_chat_usage_streaming_and_not(mtp_sim: Sim) -> None:
    client = mtp_sim.client()
    extra = {"ignore_eos": True}
    r = client.completions.create(model=DEFAULT_PROFILE, prompt="The Zen of Python", max_tokens=40,
                                  temperature=0, extra_body=extra)
    assert r.usage.completion_tokens == 40 and r.usage.prompt_tokens == 4 and r.choices[0].finish_reason == "length"
    c = client.chat.completions.create(model=DEFAULT_PROFILE, max_tokens=33, temperature=0,
                                       messages=[{"role": "user", "content": "hello there"}], extra_body=extra)
    assert c.usage.completion_tokens == 33 and c.choices[0].message.content

    events, usage = [], None
    for chunk in client.completions.create(model=DEFAULT_PROFILE, prompt="x", max_tokens=200,
                                           temperature=0, stream=True, stream_options={"include_usage": True},
                                           extra_body=extra):
        if chunk.choices:
            events.append(len(chunk.choices[0].text.split()))
        if chunk.usage:
            usage = chunk.usage
    assert usage.completion_tokens == 200 == sum(events)
    assert max(events) > 1  # under MTP one SSE event carries several tokens
    chat_tokens = 0
    for chunk in client.chat.completions.create(model=DEFAULT_PROFILE, max_tokens=50, stream=True,
                                                messages=[{"role": "user", "content": "hi"}], extra_body=extra):
        if chunk.choices and chunk.choices[0].delta.content:
            chat_tokens += len(chunk.choices[0].delta.content.split())
    assert chat_tokens == 50


def test_created_is_the_wall_clock_while_the_simulated_clock_runs_ahead(mtp_sim: Sim) -> None:
    """``created`` is Unix time, as OpenAI's clients read it, not the simulated clock (50x faster here)."""
    while json.loads(_get(mtp_sim.base + "/sim/info")[1])["simulated_timestamp"] < time.time() + 30:
        time.sleep(0.1)  # the simulated clock is now half a minute ahead of the wall clock, and moving away
    client = mtp_sim.client()
    before = time.time()
    r = client.completions.create(model=DEFAULT_PROFILE, prompt="x", max_tokens=8, extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model=DEFAULT_PROFILE, max_tokens=8, stream=True,
                                                 messages=[{"role": "user", "content": "hi"}]))
    after = time.time()
    for created in (r.created, *(c.created for c in chunks)):
        assert int(before) <= created <= after, (before, created, after)


def test_metrics_parse_and_move(mtp_sim: Sim) -> None:
    before = _metrics(mtp_sim)
    for name in ("lmdeploy:spec_decode_num_drafts_total", "lmdeploy:spec_decode_num_draft_tokens_total",
                 "lmdeploy:spec_decode_num_accepted_tokens_total", "lmdeploy:num_requests_running",
                 "lmdeploy:num_requests_waiting", "sim_time_scale", "sim_generation_tokens_total",
                 "sim_requests_total"):
        assert name in before, name
    mtp_sim.client().completions.create(model=DEFAULT_PROFILE, prompt="a b c", max_tokens=300,
                                        extra_body={"ignore_eos": True}, temperature=0)
    after = _metrics(mtp_sim)
    drafts = after["lmdeploy:spec_decode_num_drafts_total"] - before["lmdeploy:spec_decode_num_drafts_total"]
    drafted = after["lmdeploy:spec_decode_num_draft_tokens_total"] - before["lmdeploy:spec_decode_num_draft_tokens_total"]
    accepted = (after["lmdeploy:spec_decode_num_accepted_tokens_total"]
                - before["lmdeploy:spec_decode_num_accepted_tokens_total"])
    assert drafts > 0 and drafted == 3 * drafts and 0 < accepted <= drafted
    assert after["sim_generation_tokens_total"] - before["sim_generation_tokens_total"] == 300
    assert after["sim_requests_total"] - before["sim_requests_total"] == 1
    assert drafts + accepted == 299  # every decode step emits 1 + accepted; the first token is prefill's


def test_metrics_gzipped_only_when_the_client_accepts_it(mtp_sim: Sim) -> None:
    import gzip

    plain = _metrics(mtp_sim)
    req = urllib.request.Request(mtp_sim.base + "/metrics", headers={"Accept-Encoding": "deflate, gzip;q=0.5"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.headers["Content-Encoding"] == "gzip" and r.headers["Content-Type"].startswith("text/plain")
        text = gzip.decompress(r.read()).decode()
    zipped = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert set(zipped) == set(plain)
    status, _, headers = _get(mtp_sim.base + "/metrics")
    assert status == 200 and "Content-Encoding" not in headers


def test_closed_loop_hold_lasts_only_while_the_client_has_requests_queued() -> None:
    """A finishing ``sim_hold`` request stops the simulated clock until the client's next request,
    but not once the client said nothing is queued behind it (no next request will come)."""
    import asyncio

    from orchestrator.sim.model import EngineParams, load_profile
    from orchestrator.sim.server import SimEngine

    async def clock_advance_after_finish(queued: int) -> float:
        engine = SimEngine(load_profile(DEFAULT_PROFILE), EngineParams(tp=8), time_scale=50.0)
        engine.start()
        try:
            req = engine.submit(16, 8, temperature=0.0, ignore_eos=True, seed=1, hold_on_finish=True,
                                client_queued=queued)
            done = False
            while not done:
                _, done, _ = await req.payload.get()
            before = engine.now()
            await asyncio.sleep(0.02)
            return engine.now() - before
        finally:
            await engine.stop()

    assert asyncio.run(clock_advance_after_finish(1)) == 0.0
    assert asyncio.run(clock_advance_after_finish(0)) > 0.0


def test_a_runs_opening_burst_holds_the_clock_until_it_has_arrived() -> None:
    """A run's first request says how many more the client sends at once (``sim_burst``): the clock stands
    still until they came, so they join at the first one's time however long the client took to send
    them; without the field the clock runs on."""
    import asyncio

    from orchestrator.sim.model import EngineParams, load_profile
    from orchestrator.sim.server import SimEngine

    async def clock_advance_before_the_rest(burst: int | None) -> float:
        engine = SimEngine(load_profile(DEFAULT_PROFILE), EngineParams(tp=8), time_scale=50.0)
        engine.start()
        try:
            first = engine.submit(16, 8, temperature=0.0, ignore_eos=True, seed=1, client_burst=burst)
            await asyncio.sleep(0.05)  # a client slow to send the rest of its burst
            rest = [engine.submit(16, 8, temperature=0.0, ignore_eos=True, seed=2 + i) for i in range(2)]
            return max(r.arrival_time for r in rest) - first.arrival_time
        finally:
            await engine.stop()

    assert asyncio.run(clock_advance_before_the_rest(2)) < 0.005 * 50  # not the 0.05 s the client took
    assert asyncio.run(clock_advance_before_the_rest(None)) >= 0.04 * 50


def test_a_closed_loop_client_later_than_the_hold_is_counted_late() -> None:
    """A hold lasts at most ``HOLD_MAX_S`` of wall time; a next request that comes after it is late by the
    simulated time since, in ``client_lateness_s`` (a starved client lowers the figure while the engine
    keeps its schedule). One in time counts nothing, and a debt older than ``CLIENT_LATE_FORGET_S`` is
    a client that stopped, not a late one."""
    import asyncio

    from orchestrator.sim import server
    from orchestrator.sim.model import EngineParams, load_profile

    async def lateness_after(gap_s: float) -> float:
        engine = server.SimEngine(load_profile(DEFAULT_PROFILE), EngineParams(tp=8), time_scale=50.0)
        engine.start()
        try:
            req = engine.submit(16, 8, temperature=0.0, ignore_eos=True, seed=1, hold_on_finish=True, client_queued=1)
            done = False
            while not done:
                _, done, _ = await req.payload.get()
            await asyncio.sleep(gap_s)
            engine.submit(16, 8, temperature=0.0, ignore_eos=True, seed=2)
            return engine.info()["client_lateness_s"]
        finally:
            await engine.stop()

    assert asyncio.run(lateness_after(0.05)) == 0.0
    late = asyncio.run(lateness_after(server.HOLD_MAX_S + 0.3))
    assert 0.25 * 50 <= late < 0.3 * 50 + 10, late  # ~0.3 wall s past the hold, at time scale 50
    forget = server.CLIENT_LATE_FORGET_S
    server.CLIENT_LATE_FORGET_S = 0.1
    try:
        assert asyncio.run(lateness_after(server.HOLD_MAX_S + 0.3)) == 0.0
    finally:
        server.CLIENT_LATE_FORGET_S = forget


def test_request_errors_are_project_errors() -> None:
    assert issubclass(OpenAIError, OrchestratorError)


@pytest.mark.parametrize("body, param", [
    ({"prompt": 3, "max_tokens": 5}, "prompt"),
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 5, "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "max_tokens": 10**7}, "max_tokens"),
])
def test_bad_request_is_openai_error_json(mtp_sim: Sim, body: dict, param: str) -> None:
    req = urllib.request.Request(mtp_sim.base + "/v1/completions", data=json.dumps(body).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400
    error = json.loads(err.value.read())["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    req = urllib.request.Request(mtp_sim.base + "/v1/chat/completions", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400 and "error" in json.loads(err.value.read())


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "word " * 200_000}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 200_000}]}, "messages"),
])
def test_a_prompt_over_the_context_without_max_tokens_names_the_prompt(mtp_sim: Sim, path: str, body: dict,
                                                                          param: str) -> None:
    """The client sent no max_tokens, so the error must not be about one ("must be >= 1, got -167232")."""
    req = urllib.request.Request(mtp_sim.base + path, data=json.dumps(body).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    error = json.loads(err.value.read())["error"]
    assert err.value.code == 400 and error["param"] == param and error["code"] == "context_length_exceeded"
    assert "max_tokens" not in error["message"] and "shorten" in error["message"]


def test_eos_may_stop_early_without_ignore_eos(mtp_sim: Sim) -> None:
    client = mtp_sim.client()
    counts = [client.completions.create(model=DEFAULT_PROFILE, prompt="p", max_tokens=3000, seed=i,
                                        temperature=0).usage.completion_tokens for i in range(4)]
    assert all(1 <= c <= 3000 for c in counts) and min(counts) < 3000


@pytest.mark.parametrize("fault, code, says", [
    ("crash-at-start", 3, "crash-at-start"),
    ("oom-at-start", 1, "CUDA out of memory"),
])
def test_start_faults_exit_with_code(fault: str, code: int, says: str) -> None:
    sim = Sim("--fault", fault)
    assert sim.proc.wait(15) == code
    assert says in sim.proc.stdout.read()


def test_real_oom_when_memory_fraction_unsafe() -> None:
    sim = Sim(*MTP, "--cache-max-entry-count", "0.95")
    assert sim.proc.wait(15) == 1
    assert "CUDA out of memory" in sim.proc.stdout.read()


def test_never_ready_stays_alive_without_answering() -> None:
    sim = Sim("--fault", "never-ready")
    try:
        time.sleep(1.5)
        assert sim.proc.poll() is None
        with pytest.raises(OSError):
            _get(sim.base + "/v1/models", 0.5)
    finally:
        sim.stop()


def test_crash_after_and_hang_after() -> None:
    crash = Sim("--fault", "crash-after:50", time_scale=50.0)  # 50 simulated s = 1 wall s
    hang = Sim("--fault", "hang-after:50", time_scale=50.0)
    try:
        crash.wait_ready()
        hang.wait_ready()
        # Timed faults count from the first request (start-up time on a loaded machine varies).
        for sim in (crash, hang):
            _post_completion(sim.base)
        assert crash.proc.wait(15) == 137
        assert "crash-after" in crash.proc.stdout.read()
        time.sleep(0.3)
        assert hang.proc.poll() is None
        with pytest.raises(OSError):  # accepted but never answered: a timeout
            _get(hang.base + "/v1/models", 1.0)
        assert hang.proc.poll() is None
    finally:
        crash.stop()
        hang.stop()


def test_a_client_closing_its_stream_early_frees_the_request_without_a_traceback() -> None:
    """Benchmarks stop reading streams early (a steady-state stop, a timeout): the simulated engine
    cancels the request (its running gauge drops back) and logs no traceback for it — an error log per
    closed stream buried real errors under noise."""
    with running(*MTP, time_scale=20.0) as sim:
        stream = sim.client().completions.create(model=DEFAULT_PROFILE, prompt="hello", max_tokens=4000, stream=True,
                                                 extra_body={"ignore_eos": True})
        for i, _chunk in enumerate(stream):
            if i == 2:
                break
        stream.close()
        deadline = time.monotonic() + 20
        while _metrics(sim).get("lmdeploy:num_requests_running", 1.0) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metrics(sim)["lmdeploy:num_requests_running"] == 0
        _post_completion(sim.base)  # still serving
        time.sleep(0.5)
        sim.stop()
        out = sim.proc.stdout.read()
    assert "Traceback" not in out and "Error handling request" not in out, out[-3000:]
