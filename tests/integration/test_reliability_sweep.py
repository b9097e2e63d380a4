"""Sweep reliability under injected faults (real Ray Tune, real simulated engines, no mocks).

What ``tests/integration/test_sweep.py`` already proves is not repeated here (an engine that crashes at start
fails its trial; an in-process ``resume=True`` neither loses nor re-runs trials; an incomplete sweep
keeps the previous table; ``routing.commit`` survives a failed fsync / a file in the way). This file
adds:

- the other engine faults, during a sweep: killed mid-benchmark (``crash-after``), never ready,
  stops answering mid-benchmark (``hang-after``), out of memory at start. Each fails its own trial
  with the reason, leaves no engine process or Ray resource behind, and the sweep finishes;
- the *sweep process itself* SIGKILLed mid-run (``python -m tuning.sweep``) and restarted with
  ``--resume``: finished trials keep their ids and rows and are not measured again;
- an output folder that cannot be written (the run dir, the ``--routing-table`` target, a full
  disk): a clear error from the CLI and the previous routing table unchanged.

Processes are found through ``/proc`` (no psutil dependency): an engine belongs to a run when its
stdout (fd 1) is a log file under that run's ``engine-logs`` folder.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from orchestrator import table as routing
from orchestrator.fsutil import utc_now_iso
from tuning.buckets import make_buckets
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_STATIC, NamedPoint, SearchSpace
from tuning.sweep import SweepSpec, run_sweep
from tuning.sweep.records import reported_trial_ids

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "intern-s2-preview-8xh200"
FAST = ("--startup-delay", "1")

pytestmark = pytest.mark.timeout(420)


# ----- /proc helpers -------------------------------------------------------------------------------------
def _live(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def engines_logging_under(folder: Path) -> dict[int, str]:
    """Live ``orchestrator.sim`` processes whose stdout is a file under ``folder``: pid -> log path."""
    folder = folder.resolve()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if "orchestrator.sim" not in _cmdline(pid) or not _live(pid):
            continue
        try:
            out = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        if out.startswith(str(folder)):
            found[pid] = out
    return found


def wait_no_engines(folder: Path, timeout_s: float = 30.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    left = engines_logging_under(folder)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = engines_logging_under(folder)
    return left


# ----- in-process sweeps -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


def _point(role: str, drafts: int, fault: str) -> NamedPoint:
    return NamedPoint(role, {"speculative": True, "num_draft_tokens": drafts, "memory_fraction": 0.8,
                             "max_batch_size": 64}, ("--fault", fault))


READY_TIMEOUT_S = 15
"""What the never-ready engine is given; a healthy one answers in 1-3 s on 2 idle cores, and took more
than 8 s on a loaded 2-core machine (another test file beside it under pytest-xdist, or other work)."""


REQUEST_TIMEOUT_S = 10
"""The bench's per-request limit, which ends the hung engine's requests: a healthy one's 256-token request
takes under a second on idle cores, and took more than 4 s with the suite's slowest files beside it."""


@pytest.mark.slow  # ~45-70 s on 2 busy cores; in the default run (< 90 s)
def test_engine_faults_fail_their_trial_free_resources_and_the_sweep_finishes(tmp_path, ray_local):
    """Four faulty engines plus the two baselines: each fault is its own trial's failure, with the
    reason; no engine survives its trial; the CPUs are free again; the healthy trials still win."""
    # Distinct draft counts: each fault point is its own engine config (no dedupe between them).
    faults = {
        "crash_mid_bench": _point("crash_mid_bench", 1, "crash-after:0.5"),
        "never_ready": _point("never_ready", 2, "never-ready"),
        "hang_mid_bench": _point("hang_mid_bench", 5, "hang-after:0.5"),
        "oom_at_start": _point("oom_at_start", 6, "oom-at-start"),
    }
    space = SearchSpace(engine="sim", model=PROFILE, tp=8, num_draft_tokens=(1, 2, 5, 6), memory_fraction=(0.8,),
                        max_batch_size=(64,), extra_flags=FAST).with_baselines()
    space = space.replace(points=(*space.points, *faults.values()))
    # 8 requests x up to 256 tokens at concurrency 8 take ~3 simulated s: the timed faults (0.5 s
    # after the first request) land mid-benchmark.
    buckets = make_buckets((256,), input_len=256, concurrency_levels=(8,), num_prompts=8)
    spec = SweepSpec(sweep_id="faults", run_dir=str(tmp_path / "faults"), space=space, buckets=buckets,
                     sim_time_scale=4.0, steady_state=None, max_concurrent_trials=2, n_startup_trials=6,
                     ready_timeout_s=READY_TIMEOUT_S, request_timeout_s=REQUEST_TIMEOUT_S)
    started = time.monotonic()
    out = run_sweep(spec, num_trials=6, live=False)
    wall = time.monotonic() - started

    df = pd.read_parquet(Path(spec.run_dir) / "results.parquet")
    assert df.trial_id.nunique() == 6, df[["trial_id", "role", "status"]]
    by_role = {role: g for role, g in df.groupby("role")}
    assert set(by_role) == {ROLE_MTP_OFF, ROLE_STATIC, *faults}
    for role in (ROLE_MTP_OFF, ROLE_STATIC):
        assert (by_role[role].status == "ok").all(), by_role[role].failure_reason.tolist()
    expected_reason = {
        # Seen as dead (exit code) or, caught between closing its socket and exiting, as not answering;
        # either way the engine's last log line says what happened.
        "crash_mid_bench": ("engine failed during bucket le256", "crash-after:0.5: engine process dies now"),
        "never_ready": ("engine failed to start", "EngineNotReadyError",
                        f"did not answer GET /v1/models within {READY_TIMEOUT_S} s"),
        "hang_mid_bench": ("engine failed during bucket le256", "EngineNotReadyError", "hung"),
        # The engine's own last words (the log tail) survive the reason's length limit.
        "oom_at_start": ("engine failed to start", "EngineDiedError", "exit code 1", "OutOfMemoryError"),
    }
    for role, needles in expected_reason.items():
        rows = by_role[role]
        assert (rows.status == "failed").all(), (role, rows.status.tolist())
        reason = rows.failure_reason.iloc[0]
        for needle in needles:
            assert needle in reason, (role, reason)
    # A table from the healthy trials; the faulty configs are never chosen.
    assert out.error is None and out.table is not None, out.error
    chosen = out.table.bucket("le256").engine_config()
    assert not any(f in chosen.extra_flags for f in ("--fault",)), chosen

    # Resources: no engine from this sweep is alive, every CPU is back, ports are free.
    assert wait_no_engines(Path(spec.run_dir)) == {}
    deadline = time.monotonic() + 20
    while ray_local.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray_local.available_resources().get("CPU", 0) == 2
    # The hang must cost about request_timeout_s, not the default hour.
    assert wall < 180, f"sweep with faults took {wall:.0f} s"


# ----- the sweep process killed and resumed --------------------------------------------------------------
OWN_CLUSTER = pytest.mark.xdist_group("test_reliability_sweep-cli")
"""These sweeps run the CLI, which starts a Ray cluster of its own (not the module's): with pytest-xdist
they need not wait for this file's other tests (a group apart from the file's own)."""

def _sweep_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tuning.sweep", "--no-live", "--num-cpus", "2", *extra]


def _finished_trials(run_dir: Path) -> set[str]:
    """Trials Tune has a reported result for (``result.json`` non-empty in the trial's folder)."""
    exp = run_dir / "tune"
    if not exp.is_dir():
        return set()
    return {p.parent.name.removeprefix("trial_") for p in exp.glob("trial_*/result.json") if p.stat().st_size > 0}


def _procs_with_env_marker(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (everything the sweep CLI started inherits it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in env and _live(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reported(run_dir: Path) -> set[str]:
    """Trials whose report reached the run dir (it lands there before Tune's own record of it)."""
    return set(reported_trial_ids(run_dir))


def _unreported_engines(run_dir: Path) -> dict[int, str]:
    """Live engines of trials that have not reported (an engine logs under engine-logs/<trial id>/)."""
    done = _reported(run_dir)
    return {pid: log for pid, log in engines_logging_under(run_dir).items() if Path(log).parent.name not in done}


def _running_in_tune_state(run_dir: Path) -> set[str]:
    """Trials Tune's newest experiment checkpoint saved as RUNNING (a restore runs them again)."""
    states = sorted((run_dir / "tune").glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    try:
        trials = [json.loads(t[0]) for t in json.loads(states[-1].read_text())["trial_data"]] if states else []
    except (OSError, ValueError, KeyError):  # replaced while being read
        return set()
    return {t["trial_id"] for t in trials if t.get("status") == "RUNNING"}


def _sweep_killed_mid_trial(tmp_path: Path, *, with_ray: bool = False
                            ) -> tuple[Path, dict[str, str], str, set[str], dict[str, dict]]:
    """A CLI sweep (budget 4, one trial at a time) SIGKILLed while a third trial's engine is up.
    ``with_ray``: its Ray cluster, trial workers and engines too, at the same moment (a device call's
    time limit: nothing of the cut trial runs on to report). Else the driver alone (its orphaned trial
    may still report). Returns (run dir, env, env marker, trials finished before the kill, their Tune
    results)."""
    run_dir = tmp_path / "killed"
    space_file = tmp_path / "space.yaml"
    space_file.write_text("speculative: [false, true]\nnum_draft_tokens: [1, 2, 3, 4]\nmemory_fraction: [0.8]\n"
                          "max_batch_size: [64]\nextra_flags: ['--startup-delay', '3']\n")
    common = ["--buckets", "256", "--concurrency", "4", "--num-prompts", "8", "--sim-time-scale", "4",
              "--max-concurrent-trials", "1"]
    marker = f"MTP_RELIABILITY_RUN={tmp_path.name}"
    # Tune saves its experiment state every second (default: adaptive, often tens of seconds), so the
    # kill below can wait for the running trial to be in it, as a GPU trial's minutes-long run always is.
    env = {**os.environ, "MTP_RELIABILITY_RUN": tmp_path.name, "PYTHONPATH": str(ROOT), "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    log = open(tmp_path / "first.log", "wb")
    proc = subprocess.Popen(_sweep_cmd(run_dir, "--space", str(space_file), "--run-dir", str(run_dir),
                                       "--sweep-id", "killed", "--num-trials", "4", *common),
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # Kill while the engine of a trial that has not reported yet is up and Tune's saved state
        # knows that trial, after two results: results to keep, one trial to lose.
        while proc.poll() is None and time.monotonic() < deadline and not (
                len(_finished_trials(run_dir)) >= 2
                and {Path(log).parent.name for log in _unreported_engines(run_dir).values()}
                & _running_in_tune_state(run_dir) - _reported(run_dir)):
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert len(_finished_trials(run_dir)) >= 2, "no two trials finished within 240 s"
        running_engines = _unreported_engines(run_dir)
        assert running_engines, "no trial was running when the sweep was killed"
        if with_ray:
            _kill_all([proc.pid, *_procs_with_env_marker(marker)])
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the sweep driver only; Ray and the engines are its orphans
        proc.wait(timeout=30)
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
    finished_before = _finished_trials(run_dir)
    before = {p.parent.name.removeprefix("trial_"): json.loads(p.read_text().splitlines()[-1])
              for p in (run_dir / "tune").glob("trial_*/result.json") if p.stat().st_size > 0}

    # The engine of the trial that was running must not outlive it (it runs in a session of its own,
    # so nothing kills it by process group). Whatever else of the dead driver's local Ray is left is
    # killed below so it doesn't leak into other tests; that is Ray's business, not asserted here.
    deadline = time.monotonic() + 60
    leftover_engines = engines_logging_under(run_dir)
    while leftover_engines and time.monotonic() < deadline:
        time.sleep(1)
        leftover_engines = engines_logging_under(run_dir)
    strays = _procs_with_env_marker(marker)
    _kill_all(list(leftover_engines) + strays)  # whatever the assertion says, don't leak into other tests
    assert leftover_engines == {}, f"engines outlived the killed sweep: {leftover_engines}"
    return run_dir, env, marker, finished_before, before


@pytest.fixture(scope="module")
def killed_sweep(tmp_path_factory):
    """``restore()``: the run of :func:`_sweep_killed_mid_trial` (the driver alone killed) as the kill left
    it, at the path it was made (a resume that runs trials again must be where Tune made them). The two
    tests that resume it differently share one kill: the run dir is put back from a copy for each."""
    tmp = tmp_path_factory.mktemp("killed-sweep")
    killed = _sweep_killed_mid_trial(tmp)
    run_dir = killed[0]
    pristine = tmp / "pristine"
    shutil.copytree(run_dir, pristine, symlinks=True)

    def restore() -> tuple[Path, dict[str, str], str, set[str], dict[str, dict]]:
        shutil.rmtree(run_dir)
        shutil.copytree(pristine, run_dir, symlinks=True)
        return killed

    return tmp, restore


@pytest.mark.slow  # ~30-45 s on 2 busy cores with the killed sweep it sets up; in the default run (< 90 s)
@OWN_CLUSTER
def test_sigkilled_sweep_resumes_without_losing_or_rerunning_trials(killed_sweep):
    tmp_path, restore = killed_sweep
    run_dir, env, marker, finished_before, before = restore()
    # Without the live display the killed run's output still says how far it got: a line per trial
    # started and one per trial finished, with its figures.
    printed = (tmp_path / "first.log").read_text()
    for trial_id in finished_before:
        assert f"trial {trial_id} started (" in printed and f"trial {trial_id} ok" in printed, printed[-3000:]
    assert "le256 " in printed and "output tok/s" in printed

    r = subprocess.run(_sweep_cmd(run_dir, "--resume", str(run_dir), "--num-trials", "4"), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    _kill_all(_procs_with_env_marker(marker))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    df = pd.read_parquet(run_dir / "results.parquet")
    ids = list(df.trial_id)
    assert len(ids) == len(set(ids)) == 4, df[["trial_id", "role", "status"]]
    assert finished_before <= set(ids), (finished_before, ids)
    # The trial the kill cut short ran again and was measured: its interruption is not a result (a
    # resume once handed it the driver's "reported nothing" rows as a cached result of its own).
    assert (df.status == "ok").all() and not df.cached.any(), df[["trial_id", "status", "cached", "failure_reason"]]
    # Finished trials kept their measured figures (same rows, not re-measured)...
    for trial_id, result in before.items():
        row = df[df.trial_id == trial_id].iloc[0]
        assert row.output_throughput == pytest.approx(result["tput_le256"]), trial_id
        assert row.status == result["status"]
    # ... and their engines were started exactly once (one log per trial; the interrupted trial may
    # have a second log from its re-run, which is expected: it had reported nothing).
    for trial_id in finished_before:
        logs = list((run_dir / "engine-logs" / trial_id).glob("*.log"))
        assert len(logs) == 1, (trial_id, logs)
    assert routing.load(run_dir / "routing_table.json").provenance.sweep_id == "killed"
    assert wait_no_engines(run_dir) == {}


@pytest.mark.slow  # ~45-70 s on 2 busy cores; in the default run (< 90 s)
@OWN_CLUSTER
def test_a_trial_cut_with_its_ray_cluster_is_measured_when_resumed(tmp_path):
    """GPU run 4 (2026-11-29): a device call's time limit killed the sweep and its Ray cluster during
    the static baseline; the resume handed that trial the driver's own "reported nothing" rows as a
    cached result, so the table lacked a baseline and was not committed. It must run again instead."""
    run_dir, env, marker, finished_before, _ = _sweep_killed_mid_trial(tmp_path, with_ray=True)
    cut = _running_in_tune_state(run_dir) - _reported(run_dir)
    assert cut, "Tune's saved state has no unreported running trial: nothing to resume"

    r = subprocess.run(_sweep_cmd(run_dir, "--resume", str(run_dir), "--num-trials", "4"), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    _kill_all(_procs_with_env_marker(marker))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    df = pd.read_parquet(run_dir / "results.parquet")
    for trial_id in cut:
        row = df[df.trial_id == trial_id]
        assert len(row) == 1 and row.status.iloc[0] == "ok" and not row.cached.iloc[0], \
            df[["trial_id", "status", "cached", "failure_reason"]]
        assert list((run_dir / "engine-logs" / trial_id).glob("*.log")), "the cut trial started no engine on resume"
    assert (df.status == "ok").all() and len(df) == 4, df[["trial_id", "status", "failure_reason"]]
    assert routing.load(run_dir / "routing_table.json").provenance.sweep_id == "killed"


@pytest.mark.slow  # ~10-40 s on 2 busy cores, and the killed sweep's ~15-25 s when run alone; in the default run
@OWN_CLUSTER
def test_a_resume_whose_budget_the_reported_trials_meet_ends_without_starting_an_engine(killed_sweep):
    """Lowering --num-trials to what was reported finishes the sweep now: the trial the kill cut
    short is not restarted (on a GPU it would pay a 1-3 minute engine start), the reported trials'
    rows stand, and the table is committed from them."""
    _, restore = killed_sweep
    run_dir, env, marker, _, before = restore()
    logs_before = set((run_dir / "engine-logs").rglob("*.log"))
    reported = _reported(run_dir)

    r = subprocess.run(_sweep_cmd(run_dir, "--resume", str(run_dir), "--num-trials", str(len(reported))),
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    _kill_all(_procs_with_env_marker(marker))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert set((run_dir / "engine-logs").rglob("*.log")) == logs_before, "the resume started an engine"

    df = pd.read_parquet(run_dir / "results.parquet")
    ok = df[df.status == "ok"]
    assert set(ok.trial_id) == reported, df[["trial_id", "role", "status", "failure_reason"]]
    for trial_id, result in before.items():
        assert ok[ok.trial_id == trial_id].iloc[0].output_throughput == pytest.approx(result["tput_le256"])
    # The interrupted trial is listed as what it is (if Tune's saved state knew it), never passed
    # off as measured.
    cut = df[~df.trial_id.isin(reported)]
    assert len(cut) <= 1 and (cut.status == "failed").all(), df[["trial_id", "status"]]
    assert cut.failure_reason.str.contains("reported nothing").all()
    for _, row in cut.iterrows():  # under its own config (Tune's params.json), not a default one
        params = json.loads((run_dir / "tune" / f"trial_{row.trial_id}" / "params.json").read_text())
        assert (bool(row.speculative), row.max_batch_size) == (params["speculative"], params["max_batch_size"]), row
        assert row.num_draft_tokens == params.get("num_draft_tokens", 0), row
    table = routing.load(run_dir / "routing_table.json")
    assert table.provenance.sweep_id == "killed"
    assert table.buckets[0].figures.output_throughput == pytest.approx(max(ok.output_throughput))

# ----- outputs that cannot be written --------------------------------------------------------------------
def _valid_table() -> dict:
    cfg = {"backend": "sim", "model": PROFILE, "tp": 8}
    return {"provenance": {"model": PROFILE, "gpu_type": "none (simulated)", "gpu_count": 0, "sweep_id": "old",
                           "created_at": utc_now_iso(), "simulated": True},
            "buckets": [{"name": "le256", "max_output_len": 256, "config": cfg,
                         "figures": {"output_throughput": 1.0}}]}


def test_unwritable_outputs_give_a_clear_error_and_keep_the_previous_table(tmp_path, ray_local, capsys):
    """The CLI's ``main`` in this process (on the module's Ray, to save a Ray start per case)."""
    from tuning.sweep import main

    args = ["--no-live", "--buckets", "256", "--concurrency", "4", "--num-prompts", "4", "--sim-time-scale", "4",
            "--speculative", "false", "--num-draft-tokens", "4", "--memory-fraction", "0.8",
            "--max-batch-size", "64", "--num-trials", "2", "--max-concurrent-trials", "1"]

    # 1. The run dir cannot be created (a file is in its way: works as root, unlike chmod).
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    assert main(["--run-dir", str(blocker / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert "error: cannot write the sweep's files" in err and str(blocker) in err, err[-2000:]

    # 2. The serving table's folder cannot take the new version: the sweep reports it and fails;
    #    the table being served is untouched.
    serving = tmp_path / "serving" / "routing_table.json"
    routing.commit(_valid_table(), serving)
    before = serving.read_bytes()
    hist = routing.history_dir(serving)
    for f in hist.iterdir():
        f.unlink()
    hist.rmdir()
    hist.write_text("in the way")  # the history folder can't be created: the commit must fail
    run_dir = tmp_path / "run2"
    code = main(["--run-dir", str(run_dir), "--routing-table", str(serving), *args])
    captured = capsys.readouterr()
    out = (captured.out + captured.err).replace("\n", "")
    assert code == 3, out[-3000:]
    assert "previous table is unchanged" in out and str(serving) in out, out[-3000:]
    assert serving.read_bytes() == before
    assert wait_no_engines(run_dir) == {}


def test_disk_full_while_committing_keeps_the_previous_table(tmp_path):
    """A real ENOSPC-like failure, not a monkeypatch: the committing process may write at most a
    few bytes per file (RLIMIT_FSIZE), so the table's temp file can't be written."""
    path = tmp_path / "routing_table.json"
    routing.commit(_valid_table(), path)
    before = path.read_bytes()
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "from orchestrator import table as routing\n"
        "t = routing.load(sys.argv[1])\n"
        "try:\n"
        "    routing.commit(t.model_dump(mode='json'), sys.argv[1])\n"
        "except routing.RoutingTableError as e:\n"
        "    print(e); sys.exit(7)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 7, r.stdout + r.stderr
    assert "previous table is unchanged" in r.stdout and "File too large" in r.stdout, r.stdout
    assert path.read_bytes() == before
    assert routing.load(path).version == 1
    assert not [p for p in tmp_path.rglob("*.tmp")], "a partial temp file was left behind"
