"""``python -m orchestrator.deploy`` as a new user runs it: a local deploy that stays up and prints a
first request that works (curl and the openai client), loopback by default, and a ``ray start
--head`` cluster with Ray's token authentication (real processes, simulated engines)."""
from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator.config import EngineConfig
from orchestrator.ports import find_free_port
from orchestrator.raycluster import auth_env, auth_help, is_this_host

pytest.importorskip("ray")
# The local deploy's plain ``ray.init()`` would join the cluster /tmp/ray/ray_current_cluster names. The
# ``ray start`` cluster here writes that file under its own ``--temp-dir``, and
# tests/integration/test_multinode.py keeps its ``Cluster``'s elsewhere, so the tests here can run side by side.

ROOT = Path(__file__).resolve().parents[2]
ENGINE = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8)


# ----- pure: when the token is sent --------------------------------------------------------------------
def test_token_mode_for_an_explicit_address_only_when_the_token_is_the_clusters(tmp_path: Path):
    home_with_token = tmp_path / "home"
    (home_with_token / ".ray").mkdir(parents=True)
    (home_with_token / ".ray" / "auth_token").write_text("t" * 32)
    no_token = tmp_path / "empty-home"
    token = {"RAY_AUTH_MODE": "token"}
    # a cluster on this machine: the local token file is its token
    assert auth_env("127.0.0.1:6379", {}, home_with_token) == token
    assert auth_env("localhost:6379", {}, home_with_token) == token
    assert auth_env("127.0.0.1:6379", {}, no_token) == {}
    # a token the user gave is sent wherever they point it
    assert auth_env("203.0.113.9:6379", {"RAY_AUTH_TOKEN": "x"}, no_token) == token
    assert auth_env("203.0.113.9:6379", {"RAY_AUTH_TOKEN_PATH": "/k"}, no_token) == token
    # never the local file to a remote cluster unasked; never over the user's own RAY_AUTH_MODE
    assert auth_env("203.0.113.9:6379", {}, home_with_token) == {}
    assert auth_env("127.0.0.1:6379", {"RAY_AUTH_MODE": "disabled"}, home_with_token) == {}
    # Ray finds the token itself for these
    assert auth_env(None, {}, home_with_token) == auth_env("auto", {}, home_with_token) == {}


def test_this_host_is_loopback_or_an_address_of_its_interfaces():
    import socket

    assert is_this_host("127.0.0.1") and is_this_host("localhost") and is_this_host("[::1]")
    assert not is_this_host("203.0.113.9")  # TEST-NET-3: nobody's address
    assert not is_this_host("no-such-host.invalid")
    try:
        own = socket.gethostbyname(socket.gethostname())
    except OSError:
        pytest.skip("this host's name does not resolve")
    assert is_this_host(own)


def test_the_auth_help_names_every_setting():
    text = auth_help("10.0.0.5:6379")
    for needle in ("10.0.0.5:6379", "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN=", "RAY_AUTH_TOKEN_PATH=",
                   "ray get-auth-token", "~/.ray/auth_token", "RAY_AUTH_MODE=disabled"):
        assert needle in text, needle


# ----- the real CLI ------------------------------------------------------------------------------------
class Cli:
    """The deploy command as a subprocess in its own session, its stdout read line by line. With
    ``sigint_ignored`` it starts as ``cmd &`` from a script starts it: SIGINT inherited ignored (POSIX
    shells without job control do that to background commands; so did this suite whenever it was itself
    started that way)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, *, sigint_ignored: bool = False) -> None:
        self.stderr = log.open("w")
        self.log = log
        command = [sys.executable, "-m", "orchestrator.deploy", *argv]
        if sigint_ignored:  # the shell ignores SIGINT, and exec keeps an ignored signal ignored
            command = ["sh", "-c", 'trap "" INT; exec "$0" "$@"', *command]
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, start_new_session=True)
        self.out: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=lambda: ([self._lines.put(ln) for ln in self.proc.stdout], self._lines.put(None)),
                         daemon=True).start()

    def read_until(self, prefix: str, timeout_s: float = 240) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while not any(ln.startswith(prefix) for ln in self.out):
            line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                break
            self.out.append(line.rstrip("\n"))
        return self.out

    def first_request(self) -> tuple[str, str]:
        """The printed curl command and openai snippet, as a user would copy them."""
        text = "\n".join(self.out)
        curl = re.search(r"^  (curl .*?)\n  python - ", text, re.S | re.M)
        snippet = re.search(r"^  python - <<'PY'\n(.*?)\nPY$", text, re.S | re.M)
        assert curl and snippet, text
        return curl.group(1), snippet.group(1)

    def close(self) -> None:
        _stop_group(self.proc)
        self.stderr.close()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group ``proc`` leads (it was started in a new session), SIGKILL after 60 s."""
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _stop_head(head: subprocess.Popen) -> None:
    """Stop ``ray start --block`` as Ray expects: SIGTERM to that process alone, which stops the GCS,
    raylet and workers it started in order; then whatever is left of its group. (SIGTERM to the whole
    group at once kills the GCS first, and the head then waits ~30 s on a GCS that is gone.)"""
    head.terminate()
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    _stop_group(head)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                                                          "RAY_AUTH_TOKEN_PATH")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _run_first_request(curl: str, snippet: str, env: dict[str, str]) -> None:
    r = subprocess.run(["bash", "-c", curl.replace("\\\n", " ")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and '"choices"' in r.stdout, (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip(), (r.stdout, r.stderr)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_local_deploy_stays_up_on_loopback_serves_the_printed_first_request_and_stops_on_ctrl_c(
        tmp_path: Path, write_sim_table, listening):
    table = write_sim_table(tmp_path / "routing.json", [("all", 4096, ENGINE)], sweep_id="deploy-cli")
    (tmp_path / "keys.txt").write_text("sk-deploy-cli-test\n")
    port = find_free_port()
    env = _env()
    # Started as a script's `cmd &` starts it (SIGINT ignored on entry): Ctrl-C must still stop it.
    cli = Cli(["--routing-table", str(table), "--http-port", str(port), "--sim-time-scale", "20",
               "--api-key-file", str(tmp_path / "keys.txt"), "--engine-log-dir", str(tmp_path / "engine-logs")],
              env, tmp_path / "cli.stderr", sigint_ignored=True)
    try:
        out = cli.read_until("serving until Ctrl-C")
        assert any(ln.startswith("serving until Ctrl-C") for ln in out), (out, cli.log.read_text()[-3000:])
        assert f"OpenAI API at http://127.0.0.1:{port}/v1" in out
        assert listening(port) == ["0100007F"], listening(port)  # loopback only: nothing public by default
        assert any("export OPENAI_API_KEY" in ln for ln in out)  # keys are on: the output says which variable
        curl, snippet = cli.first_request()
        assert "Authorization: Bearer $OPENAI_API_KEY" in curl and 'os.environ["OPENAI_API_KEY"]' in snippet
        _run_first_request(curl, snippet, {**env, "OPENAI_API_KEY": "sk-deploy-cli-test"})
        assert cli.proc.poll() is None  # seconds after the deploy, still serving: not exiting after it

        os.killpg(cli.proc.pid, signal.SIGINT)  # Ctrl-C
        assert cli.proc.wait(timeout=120) == 0
        cli.read_until("stopping the app", timeout_s=5)
        assert any(ln.startswith("stopping the app and the local Ray cluster") for ln in cli.out), cli.out
        deadline = time.monotonic() + 30
        while listening(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert listening(port) == [], "Serve's proxy outlived the command that started its cluster"
    finally:
        cli.close()


@pytest.fixture
def token_cluster(tmp_path: Path):
    """``ray start --head --block`` as a new user runs it, in a home of its own that holds a token
    (Ray turns token authentication on); stopped with its process group."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0123456789abcdef" * 4)
    gcs_port = find_free_port()
    env = _env(HOME=str(home))
    log = (tmp_path / "ray-start.log").open("w")
    temp_dir = tempfile.mkdtemp(prefix="mtp-ray-", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    # No drain on SIGTERM (Ray's default waits up to 30 s for Serve to move replicas off the node; a
    # one-node cluster has nowhere to move them): the fixture's stop is a teardown, not under test.
    head = subprocess.Popen(["ray", "start", "--head", "--block", f"--port={gcs_port}", "--num-cpus=2",
                             f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats"],
                            env={**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in (tmp_path / "ray-start.log").read_text():
            assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "ray-start.log").read_text()
            time.sleep(0.5)
        assert "Token authentication is enabled" in (tmp_path / "ray-start.log").read_text()
        yield f"127.0.0.1:{gcs_port}", env
    finally:
        _stop_head(head)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.timeout(300)
def test_deploy_to_a_ray_start_cluster_with_token_auth(tmp_path: Path, write_sim_table, token_cluster):
    address, env = token_cluster
    table = write_sim_table(tmp_path / "routing.json", [("all", 4096, ENGINE)], sweep_id="deploy-token")
    port = find_free_port()
    argv = ["--routing-table", str(table), "--address", address, "--http-port", str(port),
            "--sim-time-scale", "20", "--engine-log-dir", str(tmp_path / "engine-logs")]

    # The user opted out of token mode: the cluster refuses, and the command says exactly what to set.
    # Ray's driver retries a refused GCS connect once a second for 20 s (``RAY_gcs_server_port_wait_time_s``
    # sets that budget); the refusal is the same at the first try, so two tries show it.
    refused = subprocess.run([sys.executable, "-m", "orchestrator.deploy", *argv], cwd=ROOT,
                             env={**env, "RAY_AUTH_MODE": "disabled", "RAY_gcs_server_port_wait_time_s": "2"},
                             capture_output=True, text=True, timeout=180)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "RAY_AUTH_MODE=token" in refused.stderr and "RAY_AUTH_TOKEN" in refused.stderr, refused.stderr[-3000:]
    assert "Nothing was deployed" in refused.stderr

    # As `ray start --head` then `--address ...` on one machine: the head's token is found and sent.
    cli = Cli(argv, env, tmp_path / "cli.stderr")
    try:
        cli.read_until("PY")
        assert cli.proc.wait(timeout=60) == 0, cli.log.read_text()[-3000:]  # returns: the cluster keeps the app
        assert not any(ln.startswith("serving until") for ln in cli.out), cli.out
        curl, snippet = cli.first_request()
        assert "Authorization" not in curl and '"not-needed"' in snippet  # no keys: the placeholder
        _run_first_request(curl, snippet, env)  # the app outlived the command
    finally:
        cli.close()


@pytest.mark.timeout(400)
@pytest.mark.xdist_group("test_deploy_cli-after-a-sweep")  # no cluster shared with the file's others: runs beside them
@pytest.mark.slow
def test_the_deploy_line_a_sweep_prints_serves_its_first_request_on_this_machine(tmp_path: Path):
    """A new user's path: ``python -m tuning.sweep``, then the deploy command it printed, then the first
    request deploy printed. On the 2-core CI machine this is the check that simulated engines reserve
    little enough CPU for the swept table to fit: its two engines and the router took 3 CPUs when each
    engine reserved a whole one. The sweep is a small one (one bucket, the two baselines, greedy and
    sampled): MTP-4 serves greedy requests (~1.3x MTP off at output 4096; at 1024 the margin was within
    a busy host's noise) and MTP off the sampled cell (~2x MTP-4). Its deploy line is printed by the same
    code as the default sweep's. The one change to the printed line is a free ``--http-port``
    (8000 may be taken on a shared host)."""
    env = _env()
    sweep = subprocess.run([sys.executable, "-m", "tuning.sweep", "--num-trials", "2", "--buckets", "4096",
                            "--temperatures", "0,1.0", "--num-prompts", "32", "--no-live", "--run-dir", str(tmp_path / "run")],
                           check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert sweep.returncode == 0, (sweep.stdout[-3000:], sweep.stderr[-3000:])
    (line,) = [ln for ln in sweep.stdout.splitlines() if ln.strip().startswith("deploy table:")]
    printed = shlex.split(line.split("deploy table:", 1)[1])
    assert printed[:3] == ["python", "-m", "orchestrator.deploy"], printed
    from orchestrator.table import load

    assert len(load(Path(printed[printed.index("--routing-table") + 1])).distinct_configs()) == 2, sweep.stdout[-2500:]
    port = find_free_port()
    cli = Cli([*printed[3:], "--http-port", str(port)], env, tmp_path / "cli.stderr")
    try:
        out = cli.read_until("serving until Ctrl-C")
        assert any(ln.startswith("serving until Ctrl-C") for ln in out), (out, cli.log.read_text()[-3000:])
        curl, snippet = cli.first_request()
        _run_first_request(curl, snippet, env)
        os.killpg(cli.proc.pid, signal.SIGINT)  # Ctrl-C stops the app and the cluster the command started
        assert cli.proc.wait(timeout=120) == 0
    finally:
        cli.close()
