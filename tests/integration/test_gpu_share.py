"""Engines sharing a GPU (``--share-gpu``): what each reserves, how many run at once, and the per-GPU
lease (start-ups shared, measurements alone) that keeps neighbours out of each other's figures (real Ray
actors and threads)."""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import pytest

from orchestrator.config import SHARED_GPU_HEADROOM, EngineConfig
from orchestrator.errors import ConfigError
from tests.waiting import wait_for
from tuning.sweep import _parser, build_spec
from tuning.sweep.actors import MEASURE, STARTUP, GpuLease, measure_lease, startup_lease
from tuning.sweep.space import ROLE_STATIC


def test_gpu_request_is_tp_unless_a_tp1_engine_shares():
    cfg = EngineConfig(model="/m", memory_fraction=0.3)
    assert cfg.gpu_request() == 1
    assert cfg.gpu_request(share_gpu=True) == pytest.approx(0.3 + SHARED_GPU_HEADROOM)
    assert EngineConfig(model="/m", memory_fraction=0.95).gpu_request(share_gpu=True) == 1.0
    assert EngineConfig(model="/m", tp=2, memory_fraction=0.3).gpu_request(share_gpu=True) == 2
    assert EngineConfig(backend="sim", model="p", tp=8).gpu_request(share_gpu=True) == 0


def test_shared_sweep_reserves_each_trials_fraction_and_runs_as_many_as_fit(tmp_path, model_dir):
    args = _parser().parse_args(["--model", str(model_dir), "--tp", "1", "--share-gpu",
                                 "--memory-fraction", "0.2,0.3", "--run-dir", str(tmp_path / "r")])
    spec = build_spec(args, cluster_gpus=1)
    assert spec.share_gpu
    assert spec.max_concurrent_trials == 3  # 1 GPU / (0.2 + 0.1)
    ctx = spec.trial_context("cache", "ns")
    assert ctx.measure_lease_actor == spec.measure_lease_name()

    def gpu_of(point_params):
        pgf = spec.resources_for(point_params)
        (bundle,) = pgf.bundles
        return bundle["GPU"]

    static = next(p for p in spec.space.points if p.role == ROLE_STATIC)
    assert gpu_of(static.params) == pytest.approx(0.8 + SHARED_GPU_HEADROOM)  # runs alone
    assert gpu_of({"speculative": True, "num_draft_tokens": 2, "memory_fraction": 0.2,
                   "max_batch_size": 256}) == pytest.approx(0.3)
    # An invalid point keeps the fixed request (the trial then reports the invalid config itself).
    assert gpu_of({"speculative": "maybe"}) == 1


def _search_alg(tmp_path, model_dir, *, share_gpu: bool):
    """The sweep's search generator for an 8-trial one-GPU sweep of small fractions, as Tune gets it
    (its searcher is the concurrency limiter Tune calls), and the spec it was built from."""
    from tuning.sweep.budget import write_budget
    from tuning.sweep.searcher import build_search_alg

    argv = ["--model", str(model_dir), "--tp", "1", "--memory-fraction", "0.05,0.1", "--max-concurrent-trials", "4",
            "--run-dir", str(tmp_path / "r"), *(["--share-gpu"] if share_gpu else [])]
    spec = build_spec(_parser().parse_args(argv), cluster_gpus=1)
    (tmp_path / "r").mkdir(exist_ok=True)
    write_budget(tmp_path / "r", num_trials=8, time_budget_s=None)
    return spec, build_search_alg(spec)


@pytest.mark.parametrize("share_gpu", [True, False])
def test_on_a_shared_gpu_the_baselines_start_before_any_search_trial(tmp_path, model_dir, share_gpu):
    """Ray grants GPU shares to whichever request fits, so a 0.9-GPU baseline waits behind every small
    search trial (GPU run 4: 9 minutes, then a call's deadline cut it). With ``--share-gpu`` the
    searcher suggests no search trial while a baseline is suggested and not complete — also when it
    errored; the baselines themselves are suggested together (Ray runs two 0.9 shares one at a time and
    small ones side by side). Without sharing every trial reserves the same and nothing is held back."""
    from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH

    spec, generator = _search_alg(tmp_path, model_dir, share_gpu=share_gpu)
    assert spec.share_gpu is share_gpu
    searcher = generator.searcher  # the concurrency limiter, as Tune calls it
    searcher.set_search_properties("score", "max", {})

    first = searcher.suggest("t1")
    assert first["role"] == ROLE_MTP_OFF
    if not share_gpu:
        assert searcher.suggest("t2")["role"] == ROLE_STATIC
        assert searcher.suggest("t3")["role"] == ROLE_SEARCH
        return
    assert searcher.suggest("t2")["role"] == ROLE_STATIC  # the other baseline, beside it where it fits
    assert searcher.suggest("t3") is None  # no search trial while a baseline runs
    searcher.on_trial_complete("t1", {"score": 1.0, "engine_key": "a"})
    assert searcher.suggest("t3") is None
    searcher.on_trial_complete("t2", None, error=True)  # an errored baseline holds nothing back
    assert searcher.suggest("t3")["role"] == ROLE_SEARCH
    assert searcher.suggest("t4")["role"] == ROLE_SEARCH  # search trials run side by side


def test_a_baseline_that_duplicates_a_measured_config_lets_no_search_trial_past_the_hold(tmp_path, model_dir):
    """The searcher skips a suggestion whose engine was already measured and asks again; when the skipped
    one was the last waiting baseline, the next is a search trial, which must wait like any other while a
    baseline runs."""
    from tuning.sweep.space import ROLE_MTP_OFF, ROLE_SEARCH

    spec, generator = _search_alg(tmp_path, model_dir, share_gpu=True)
    searcher = generator.searcher
    searcher.set_search_properties("score", "max", {})
    assert searcher.suggest("t1")["role"] == ROLE_MTP_OFF
    static = next(p for p in spec.space.points if p.role == ROLE_STATIC)
    key = spec.space.to_engine_config(static.params, extra_flags=static.extra_flags).key()
    searcher.searcher.known[key] = {"score": 2.0}  # as if measured by an earlier trial of this sweep
    assert searcher.suggest("t2") is None
    searcher.on_trial_complete("t1", {"score": 1.0, "engine_key": "a"})
    assert searcher.suggest("t2")["role"] == ROLE_SEARCH


def test_past_the_hard_limit_no_trial_is_suggested_or_started(tmp_path, model_dir):
    """``--stop-after-s`` also ends what the time budget ends: the searcher suggests nothing more and a
    trial that gets its resources after the limit does not start its engine (a resume runs it)."""
    import time

    from ray.tune.search import Searcher

    from tuning.sweep.budget import StoppedAtLimit, check_time_budget, write_budget

    spec, generator = _search_alg(tmp_path, model_dir, share_gpu=False)
    searcher = generator.searcher
    searcher.set_search_properties("score", "max", {})
    assert searcher.suggest("t1") not in (None, Searcher.FINISHED)
    check_time_budget(tmp_path / "r")  # within every limit: no error
    write_budget(tmp_path / "r", num_trials=8, time_budget_s=None, stop_after_s=0.01)
    time.sleep(0.05)
    assert searcher.suggest("t2") == Searcher.FINISHED
    with pytest.raises(StoppedAtLimit, match="hard limit .*--resume"):
        check_time_budget(tmp_path / "r")


def test_shared_sweep_counts_the_baselines_fraction_in_how_many_run_at_once(tmp_path, model_dir):
    """A decide phase starts several engines of the baselines at once: at a small baseline fraction as many
    run together as their reservations fit, whatever the searched fractions."""
    args = _parser().parse_args(["--model", str(model_dir), "--tp", "1", "--share-gpu", "--memory-fraction", "0.3",
                                 "--baseline-memory-fraction", "0.02", "--run-dir", str(tmp_path / "r")])
    assert build_spec(args, cluster_gpus=1).max_concurrent_trials == 8  # 1 GPU / (0.02 + 0.1)


@pytest.mark.parametrize("finished_after_save", [False, True])
def test_a_resumed_shared_sweep_keeps_holding_a_baseline_that_tune_restarts(tmp_path, model_dir, finished_after_save):
    """The hold above is searcher state: saved with Tune's experiment and restored on ``--resume``
    (through the search generator, as Tune does), so a static baseline cut by a call's limit and
    restarted is not overtaken by small search trials. A baseline that finished after the last save
    (the study has it, Tune's saved state not) holds nothing back: no resumed sweep waits forever."""
    from tuning.sweep.searcher import build_search_alg
    from tuning.sweep.space import ROLE_SEARCH

    spec, generator = _search_alg(tmp_path, model_dir, share_gpu=True)
    searcher = generator.searcher
    searcher.set_search_properties("score", "max", {})
    searcher.suggest("t1")
    assert searcher.suggest("t2")["role"] == ROLE_STATIC
    searcher.on_trial_complete("t1", {"score": 1.0, "engine_key": "a"})
    saved = tmp_path / "experiment"
    saved.mkdir()
    generator.save_to_dir(str(saved), "session")
    if finished_after_save:
        searcher.on_trial_complete("t2", {"score": 2.0, "engine_key": "b"})

    resumed = build_search_alg(spec)  # same run dir, same study
    resumed.restore_from_dir(str(saved))
    searcher = resumed.searcher
    if not finished_after_save:
        assert searcher.suggest("t3") is None  # Tune restarts t2; nothing starts beside it
        searcher.on_trial_complete("t2", {"score": 2.0, "engine_key": "b"})
    assert searcher.suggest("t3")["role"] == ROLE_SEARCH


def test_share_gpu_is_refused_for_tp_above_one(tmp_path, model_dir):
    args = _parser().parse_args(["--model", str(model_dir), "--tp", "2", "--share-gpu",
                                 "--run-dir", str(tmp_path / "r")])
    with pytest.raises(ConfigError, match="tp=1"):
        build_spec(args, cluster_gpus=2)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


def test_measurement_lease_lets_one_trial_per_gpu_measure(ray_local):
    lease = ray_local.remote(GpuLease).remote()
    intervals: dict[str, tuple[float, float]] = {}

    def measure(holder: str, gpu: str) -> None:
        with measure_lease(lease, [gpu], holder, poll_s=0.05):
            start = time.monotonic()
            time.sleep(0.6)
            intervals[holder] = (start, time.monotonic())

    threads = [threading.Thread(target=measure, args=(h, g)) for h, g in
               (("a", "node:0"), ("b", "node:0"), ("c", "node:1"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    (a0, a1), (b0, b1), (c0, _) = intervals["a"], intervals["b"], intervals["c"]
    assert a1 <= b0 or b1 <= a0, "two trials measured on one GPU at the same time"
    first_end = min(a1, b1)
    assert c0 < first_end, "a trial on another GPU waited for GPU 0's lease"
    assert ray_local.get(lease.holders.remote()) == {}


def test_lease_rules_startups_share_a_measurement_is_alone_and_a_waiting_one_goes_first(ray_local):
    """The grant rules, call by call (no threads, no timing)."""
    lease = ray_local.remote(GpuLease).remote()

    def take(holder: str, mode: str, gpus: tuple[str, ...] = ("n:0",)) -> bool:
        return ray_local.get(lease.try_acquire.remote(list(gpus), holder, mode))

    def release(holder: str, mode: str, gpus: tuple[str, ...] = ("n:0",)) -> None:
        ray_local.get(lease.release.remote(list(gpus), holder, mode))

    assert take("s1", STARTUP) and take("s2", STARTUP)  # start-ups share
    assert not take("m", MEASURE)  # ... and keep a measurement out
    assert ray_local.get(lease.waiting.remote()) == {"n:0": ["m"]}
    assert not take("s3", STARTUP), "a new start-up overtook a waiting measurement"
    assert take("s1", STARTUP), "a running start-up lost its renewal to a waiting measurement"
    assert take("s3", STARTUP, ("n:1",)), "a measurement waiting on GPU 0 held off GPU 1"
    release("s1", STARTUP)
    assert not take("m", MEASURE)  # s2 still starts
    release("s2", STARTUP)
    assert take("m", MEASURE)
    assert ray_local.get(lease.waiting.remote()) == {}
    assert not take("s3", STARTUP) and not take("m2", MEASURE)  # a measurement is alone
    assert not take("m", MEASURE, ("n:0", "n:1")), "took GPU 1 while s3 starts there"
    assert ray_local.get(lease.holders.remote()) == {"n:0": {"m": MEASURE}, "n:1": {"s3": STARTUP}}, \
        "a refused all-or-none call kept part of what it asked for"
    release("m", MEASURE, ("n:0", "n:1"))
    release("s3", STARTUP, ("n:1",))
    assert not take("s3", STARTUP), "m2, refused above, no longer waits"
    release("m2", MEASURE)  # gives up waiting
    assert take("s3", STARTUP)
    assert ray_local.get(lease.holders.remote()) == {"n:0": {"s3": STARTUP}}


def _run(lease, mode: str, holder: str, gpu: str, log: list[tuple[str, str, float]], *,
         entered: threading.Event | None = None, leave: threading.Event | None = None) -> threading.Thread:
    """A thread that holds ``mode`` on ``gpu`` until ``leave`` is set, logging when it entered and left."""
    hold = startup_lease if mode == STARTUP else measure_lease

    def body() -> None:
        with hold(lease, [gpu], holder, poll_s=0.05):
            log.append((holder, "in", time.monotonic()))
            if entered is not None:
                entered.set()
            if leave is not None:
                assert leave.wait(30)
            log.append((holder, "out", time.monotonic()))

    t = threading.Thread(target=body, name=holder, daemon=True)
    t.start()
    return t


def _finishes(body: Callable[[], None], timeout_s: float = 20.0) -> None:
    """Run ``body`` in a thread: the test fails, rather than hangs, when a lease never comes."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as e:  # noqa: BLE001 - raised again below
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "still waiting for a lease"
    if errors:
        raise errors[0]


def _at(log: list[tuple[str, str, float]], holder: str, what: str) -> float:
    (t,) = [t for h, w, t in log if h == holder and w == what]
    return t


def test_startups_share_a_gpu(ray_local):
    lease = ray_local.remote(GpuLease).remote()
    both_in = threading.Barrier(2, timeout=20)  # broken (and the test failed) unless both hold at once
    errors: list[BaseException] = []

    def start(holder: str) -> None:
        try:
            with startup_lease(lease, ["n:0"], holder, poll_s=0.05):
                both_in.wait()
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(h,)) for h in ("s1", "s2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert ray_local.get(lease.holders.remote()) == {}


def test_a_measurement_waits_for_running_startups_and_holds_off_new_ones(ray_local):
    lease = ray_local.remote(GpuLease).remote()
    log: list[tuple[str, str, float]] = []
    s1_in, s1_leave, m_leave = threading.Event(), threading.Event(), threading.Event()
    s1 = _run(lease, STARTUP, "s1", "n:0", log, entered=s1_in, leave=s1_leave)
    assert s1_in.wait(20)
    m = _run(lease, MEASURE, "m", "n:0", log, leave=m_leave)
    wait_for("the measurement waiting for the lease", lambda: ray_local.get(lease.waiting.remote()) == {"n:0": ["m"]},
             timeout_s=20, period_s=0.02)
    s2 = _run(lease, STARTUP, "s2", "n:0", log)  # comes after the measurement asked
    other_in = threading.Event()
    other = _run(lease, STARTUP, "other", "n:1", log, entered=other_in)
    assert other_in.wait(20), "a measurement waiting on GPU 0 held off a start-up on GPU 1"
    time.sleep(0.5)  # s2 and m poll meanwhile; neither may get in while s1 starts
    s1_leave.set()
    wait_for("the measurement holding the lease", lambda: any(h == "m" and w == "in" for h, w, _ in log),
             timeout_s=20, period_s=0.02)
    m_leave.set()
    for t in (s1, m, s2, other):
        t.join(timeout=30)
    assert _at(log, "s1", "out") <= _at(log, "m", "in"), "measured while a start-up ran"
    assert _at(log, "m", "out") <= _at(log, "s2", "in"), "a new start-up overtook a waiting measurement"
    assert ray_local.get(lease.holders.remote()) == {}
    assert ray_local.get(lease.waiting.remote()) == {}


def test_startups_wait_for_a_running_measurement(ray_local):
    lease = ray_local.remote(GpuLease).remote()
    log: list[tuple[str, str, float]] = []
    m_in, m_leave = threading.Event(), threading.Event()
    m = _run(lease, MEASURE, "m", "n:0", log, entered=m_in, leave=m_leave)
    assert m_in.wait(20)
    starts = [_run(lease, STARTUP, h, "n:0", log) for h in ("s1", "s2")]
    time.sleep(0.5)  # they poll meanwhile
    m_leave.set()
    for t in (m, *starts):
        t.join(timeout=30)
    assert _at(log, "m", "out") <= min(_at(log, "s1", "in"), _at(log, "s2", "in")), \
        "a start-up ran while a trial was measured"


def test_a_dead_holders_lease_expires(ray_local):
    lease = ray_local.remote(GpuLease).remote(ttl_s=0.5)
    assert ray_local.get(lease.try_acquire.remote(["n:0"], "dead-trial"))  # never renewed or released
    assert not ray_local.get(lease.try_acquire.remote(["n:0"], "next-trial"))
    t0 = time.monotonic()
    waited: list[float] = []

    def measure() -> None:
        with measure_lease(lease, ["n:0"], "next-trial", poll_s=0.05):
            waited.append(time.monotonic() - t0)

    _finishes(measure)
    assert 0.3 < waited[0] < 5


@pytest.mark.parametrize("dead_mode", [STARTUP, MEASURE])
def test_expired_holds_and_waits_of_dead_trials_stop_blocking(ray_local, dead_mode):
    """A dead start-up stops blocking measurements; a dead measurement (held or waiting) stops
    blocking start-ups."""
    lease = ray_local.remote(GpuLease).remote(ttl_s=0.5)
    assert ray_local.get(lease.try_acquire.remote(["n:0"], "dead", dead_mode))  # never renewed or released
    if dead_mode == MEASURE:  # a second dead trial that only waits for the measurement
        assert ray_local.get(lease.try_acquire.remote(["n:1"], "blocker", STARTUP))
        assert not ray_local.get(lease.try_acquire.remote(["n:1"], "dead-waiter", MEASURE))
        ray_local.get(lease.release.remote(["n:1"], "blocker", STARTUP))
    gpus = ["n:0", "n:1"] if dead_mode == MEASURE else ["n:0"]
    mode = STARTUP if dead_mode == MEASURE else MEASURE
    hold = startup_lease if mode == STARTUP else measure_lease

    def next_trial() -> None:
        with hold(lease, gpus, "next-trial", poll_s=0.05):
            assert ray_local.get(lease.holders.remote()) == {g: {"next-trial": mode} for g in gpus}

    _finishes(next_trial)
    assert ray_local.get(lease.holders.remote()) == {}
    assert ray_local.get(lease.waiting.remote()) == {}


def test_a_lease_is_renewed_while_its_holder_measures(ray_local):
    lease = ray_local.remote(GpuLease).remote(ttl_s=0.4)
    with measure_lease(lease, ["n:0"], "slow", poll_s=0.05, renew_s=0.1):
        time.sleep(1.0)  # well past the ttl: only renewal keeps it
        assert not ray_local.get(lease.try_acquire.remote(["n:0"], "other"))
    assert ray_local.get(lease.try_acquire.remote(["n:0"], "other"))


def test_a_renewal_never_takes_back_a_released_or_lapsed_hold():
    """A renewal that arrives after the release (or after a stall past the ttl) extends nothing."""
    lease = GpuLease(ttl_s=0.2)  # the plain class: the rules, without an actor
    assert lease.try_acquire(["n:0"], "a", STARTUP)
    assert lease.renew(["n:0"], "a", STARTUP)
    lease.release(["n:0"], "a", STARTUP)
    assert not lease.renew(["n:0"], "a", STARTUP) and lease.holders() == {}
    assert lease.try_acquire(["n:0"], "m")  # measure
    time.sleep(0.3)  # lapsed
    assert not lease.renew(["n:0"], "m") and lease.holders() == {} and lease.waiting() == {}
    assert not lease.renew(["n:0"], "m", STARTUP)  # a hold of the other mode is not extended either
    assert lease.try_acquire(["n:0", "n:1"], "b", STARTUP)
    assert not lease.renew(["n:0", "n:2"], "b", STARTUP)  # one of them was never held
    assert lease.holders() == {"n:0": {"b": STARTUP}, "n:1": {"b": STARTUP}}


def test_measurements_are_served_first_come_first_served():
    """A measurement that gives the GPU back and asks again queues behind those already waiting (its
    place is kept while it polls), so co-resident engines take turns round by round."""
    lease = GpuLease()  # the plain class: the rules, without an actor
    assert lease.try_acquire(["n:0"], "a")
    assert not lease.try_acquire(["n:0"], "b")  # b waits ...
    assert not lease.try_acquire(["n:0"], "c")  # ... and c behind it
    lease.release(["n:0"], "a")
    assert not lease.try_acquire(["n:0"], "a"), "a came back ahead of the measurements already waiting"
    assert not lease.try_acquire(["n:0"], "c"), "c overtook b, which waited longer"
    assert lease.try_acquire(["n:0"], "b") and lease.holders() == {"n:0": {"b": MEASURE}}
    lease.release(["n:0"], "b")
    assert not lease.try_acquire(["n:0"], "a") and lease.try_acquire(["n:0"], "c")  # c asked before a's return
    lease.release(["n:0"], "c")
    assert lease.try_acquire(["n:0"], "a") and lease.waiting() == {}
    lease.release(["n:0"], "a")
    assert lease.try_acquire(["n:0", "n:1"], "d")  # nobody waits: granted at once, on both GPUs


def test_co_resident_engines_measure_their_rounds_in_turn(ray_local):
    """Two trials on one GPU, three rounds each, every round under its own measurement lease: the
    rounds alternate (what gives the sweep interleaved rounds to compare configs by)."""
    lease = ray_local.remote(GpuLease).remote()
    order: list[str] = []
    both_ready = threading.Barrier(2, timeout=20)

    def trial(holder: str) -> None:
        both_ready.wait()
        for _ in range(3):
            with measure_lease(lease, ["n:0"], holder, poll_s=0.02):
                order.append(holder)
                time.sleep(0.3)

    threads = [threading.Thread(target=trial, args=(h,), daemon=True) for h in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(order) == ["a"] * 3 + ["b"] * 3
    assert all(x != y for x, y in zip(order, order[1:])), f"one trial measured two rounds in a row: {order}"


def test_measure_config_starts_under_the_startup_guard_and_measures_under_the_other(monkeypatch, tmp_path):
    """Start-up guarded until ready (or failed), measurement guarded after; never both at once. The
    engine stops inside the measurement's hold, so no neighbour measures or starts beside its teardown."""
    import orchestrator.engine
    from orchestrator.errors import EngineError
    from tuning.sweep.measure import measure_config

    events: list[str] = []

    class FakeEngine:
        fail = False

        def __init__(self, *args, **kwargs) -> None:
            pass

        def start(self) -> None:
            events.append("start")

        def wait_until_ready(self) -> None:
            if self.fail:
                raise EngineError("out of memory")
            events.append("ready")

        def stop(self) -> None:  # idempotent, like EngineProcess.stop
            if "stop" not in events:
                events.append("stop")

    @contextlib.contextmanager
    def guard(name: str):
        events.append(f"{name}-enter")
        try:
            yield
        finally:
            events.append(f"{name}-exit")

    monkeypatch.setattr(orchestrator.engine, "EngineProcess", FakeEngine)
    cfg = EngineConfig(model="/m", memory_fraction=0.3)
    kwargs = dict(log_dir=tmp_path, gpus=[0], startup_guard=lambda: guard("startup"),
                  measure_guard=lambda: guard("measure"))
    _, failure, startup_s = measure_config(cfg, [], **kwargs)
    assert failure == "" and startup_s is not None
    assert events == ["startup-enter", "start", "ready", "startup-exit", "measure-enter", "stop", "measure-exit"]

    events.clear()
    FakeEngine.fail = True
    _, failure, startup_s = measure_config(cfg, [], **kwargs)
    assert "engine failed to start" in failure and startup_s is None
    assert events == ["startup-enter", "start", "startup-exit", "stop"]


# ----- Serve: replicas of a shared GPU, and a table that does not fit is refused up front -------------------
MTP3 = EngineConfig(model="/ckpt", speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3, memory_fraction=0.3)
MTP4 = MTP3.replace(num_draft_tokens=4)


def test_shared_replicas_reserve_their_fraction_and_the_table_must_fit(tmp_path, write_table):
    from orchestrator.serve.app import AppArgs, build_app, load_table, resources_needed

    path = write_table(tmp_path / "t.json", [MTP3, MTP4])
    args = AppArgs.parse({"routing_table": str(path), "engine": {"share_gpu": True},
                          "scaling": {"le256": {"num_replicas": 2}}})
    app = build_app(args)
    engines = {k: v._bound_deployment for k, v in app._bound_deployment.init_args[1].items()}
    assert engines[MTP3.key()]._replica_config.ray_actor_options["num_gpus"] == pytest.approx(0.4)
    assert resources_needed(args, load_table(args)) == {"GPU": pytest.approx(3 * 0.4), "CPU": 4}  # + router
    unshared = AppArgs.parse({"routing_table": str(path)})
    assert resources_needed(unshared, load_table(unshared))["GPU"] == 2


def test_deploy_refuses_a_table_whose_engines_do_not_fit_the_cluster(tmp_path, ray_local, write_table):
    """A replica that can never be placed would sit pending for ever; deploy says so and starts nothing."""
    from ray import serve

    from orchestrator.deploy import deploy

    path = write_table(tmp_path / "t.json", [MTP3, MTP4])
    with pytest.raises(ConfigError, match="reserves 0.8 GPUs .* cluster has 0"):
        deploy({"routing_table": str(path), "engine": {"share_gpu": True}}, app_name="too-big")
    assert "too-big" not in serve.status().applications


def test_a_real_engine_sweep_warns_about_buckets_measured_with_less_than_two_waves(tmp_path, model_dir):
    """One wave is not steady state on a real engine (0.77-1.19x the four-wave figure on an H200): the
    sweep runs it, and says so per bucket; the defaults (2-8 waves) and the simulator get no warning."""
    from tuning.sweep import short_measurement_warnings

    real = ["--model", str(model_dir), "--tp", "1", "--run-dir", str(tmp_path / "r"), "--buckets", "256,2048",
            "--concurrency", "64"]
    one_wave = build_spec(_parser().parse_args([*real, "--num-prompts", "64"]), cluster_gpus=1)
    warnings = short_measurement_warnings(one_wave)
    assert [w.split(":")[0] for w in warnings] == ["le256", "le2048"]
    assert "64 prompts at concurrency 64 is 1 wave(s)" in warnings[0]
    assert short_measurement_warnings(build_spec(_parser().parse_args([*real, "--num-prompts", "128"]),
                                                 cluster_gpus=1)) == []
    assert short_measurement_warnings(build_spec(_parser().parse_args(real), cluster_gpus=1)) == []  # defaults
    sim = build_spec(_parser().parse_args(["--run-dir", str(tmp_path / "s"), "--num-prompts", "64",
                                           "--concurrency", "64"]), cluster_gpus=0)
    assert sim.simulated and short_measurement_warnings(sim) == []
