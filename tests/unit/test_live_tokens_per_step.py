"""The engine's tokens per step behind LMDeploy's counted accept length: the Serve replica's live
tracker (:class:`orchestrator.serve.metrics.AcceptLengthTracker`) and the bench's estimate and label
(:mod:`tuning.bench.counters`). Pure: counters in, figures out, checked against the counting model's
forward direction (``chain_counted_accept_length``)."""
from __future__ import annotations

import pytest

from orchestrator.serve.metrics import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    DRAFTS,
    AcceptLengthTracker,
    drafting_sequences,
)
from orchestrator.spec_counting import chain_counted_accept_length, estimate_tokens_per_step
from tuning.bench.counters import accept_length_label, tokens_per_step_from_counters
from tuning.bench.records import BenchResult, LatencyStats

N = 3
WINDOW = 12
"""Scrape intervals of the replica's default tracker (a minute of 5 s polls)."""


class Engine:
    """LMDeploy's counters as a replica scrapes them, advanced interval by interval: ``drafts`` counted
    decode outputs whose accept length reads ``counted``, and ``ended`` sequences (the replica's
    running total beside them)."""

    def __init__(self, with_drafts_counter: bool = True) -> None:
        self.accepted = self.draft_tokens = self.drafts = 0.0
        self.sequences = 0
        self.with_drafts_counter = with_drafts_counter

    def run(self, drafts: float, counted: float, ended: int) -> None:
        self.drafts += drafts
        self.draft_tokens += drafts * N
        self.accepted += drafts * (counted - 1)
        self.sequences += ended

    def samples(self) -> dict[str, float]:
        out = {ACCEPTED_TOKENS: self.accepted, DRAFT_TOKENS: self.draft_tokens, "lmdeploy:num_requests_running": 4.0}
        if self.with_drafts_counter:
            out[DRAFTS] = self.drafts
        return out


def _scrape(tracker: AcceptLengthTracker, engine: Engine) -> float | None:
    return tracker.update(engine.samples(), engine.sequences)


def _tracker(window: int = WINDOW) -> AcceptLengthTracker:
    return AcceptLengthTracker(N, window=window)


@pytest.mark.parametrize("with_drafts_counter", [True, False])
@pytest.mark.parametrize(("truth", "outputs"), [(2.66, 1.1), (1.45, 1.3), (3.8, 4.0)])
def test_the_estimate_inverts_lmdeploys_counting_of_the_ended_sequences(truth, outputs, with_drafts_counter):
    """Sequences that deliver ``outputs`` counted outputs each, one of them their last: the counted figure
    reads high, the estimate recovers the engine's tokens per step."""
    counted = chain_counted_accept_length(truth, N, outputs)
    engine, tracker = Engine(with_drafts_counter), _tracker()
    assert _scrape(tracker, engine) is None  # first scrape: a baseline only
    engine.run(drafts=64 * outputs, counted=counted, ended=64)
    assert _scrape(tracker, engine) == pytest.approx(counted)
    assert tracker.outputs_per_request == pytest.approx(outputs)
    assert tracker.tokens_per_step_estimate == pytest.approx(truth, abs=1e-6)
    assert tracker.accept_length - tracker.tokens_per_step_estimate > 0.02  # the correction is not nothing


def test_the_alert_follows_the_estimate_not_the_counted_figure():
    """Under load a 1.35-token-per-step engine counts above the 1.5 threshold; the alert still fires."""
    engine, tracker = Engine(), _tracker()
    _scrape(tracker, engine)
    engine.run(drafts=128 * 1.05, counted=chain_counted_accept_length(1.35, N, 1.05), ended=128)
    _scrape(tracker, engine)
    assert tracker.accept_length > 1.5 and tracker.low(1.5) is True
    assert _tracker().low(1.5) is None  # nothing scraped: no verdict


def test_without_ended_sequences_the_counted_figure_is_the_estimate():
    """No sequence ended: no last step was counted, the outputs are an even sample of the steps."""
    engine, tracker = Engine(), _tracker()
    _scrape(tracker, engine)
    engine.run(drafts=500, counted=2.9, ended=0)
    _scrape(tracker, engine)
    assert tracker.accept_length == pytest.approx(2.9) and tracker.tokens_per_step_estimate == pytest.approx(2.9)
    assert tracker.outputs_per_request is None


def test_a_new_load_phase_after_a_coalesced_one_is_not_corrected_as_coalesced():
    """A minute of short requests counted at 1.1 outputs each, then long ones begin (their outputs an
    even sample, none ends yet), the engine at 1.8 tokens per step throughout. Correcting the new
    interval's counted figure (already 1.8) with the minute's outputs per request read 1.47 and raised
    the alert for two scrapes; the counted figure of the same window is corrected exactly."""
    truth, coalesced = 1.8, 1.1
    engine, tracker = Engine(), _tracker()
    _scrape(tracker, engine)
    for _ in range(WINDOW):
        engine.run(drafts=100 * coalesced, counted=chain_counted_accept_length(truth, N, coalesced), ended=100)
        _scrape(tracker, engine)
    assert tracker.tokens_per_step_estimate == pytest.approx(truth, abs=1e-6)
    for _ in range(3):
        engine.run(drafts=200, counted=truth, ended=0)
        assert _scrape(tracker, engine) == pytest.approx(truth)
        assert tracker.tokens_per_step_estimate == pytest.approx(truth, abs=1e-6)
        assert tracker.low(1.5) is False


def test_the_window_holds_whole_bursts_so_a_bursts_tail_reads_as_the_whole_burst():
    """A burst of 8 sequences of 100 counted outputs each (no coalescing) whose last interval holds only
    2 outputs and the 8 ends: that interval alone reads 0.25 outputs per sequence and would correct a
    figure that needs none; the window sees 100 per sequence."""
    truth = 2.5
    counted = chain_counted_accept_length(truth, N, 100.0)
    for window, outputs in ((4, 100.0), (1, 0.25)):
        engine, tracker = Engine(), _tracker(window)
        _scrape(tracker, engine)
        for drafts, ended in ((798, 0), (2, 8)):
            engine.run(drafts=drafts, counted=counted, ended=ended)
            _scrape(tracker, engine)
        assert tracker.outputs_per_request == pytest.approx(outputs)
        if window > 1:
            assert tracker.tokens_per_step_estimate == pytest.approx(truth, abs=1e-6)
        else:
            assert tracker.tokens_per_step_estimate < truth - 0.1  # what the window is for


def test_the_accept_length_is_the_last_intervals_and_older_intervals_leave_the_window():
    """A heavily coalesced phase (1 output per sequence), then two intervals at 10 per sequence: a window
    of two intervals forgets the first; the counted accept length answers at once."""
    engine, tracker = Engine(), _tracker(2)
    _scrape(tracker, engine)
    engine.run(drafts=100, counted=chain_counted_accept_length(2.4, N, 1.0), ended=100)
    _scrape(tracker, engine)
    assert tracker.tokens_per_step_estimate == pytest.approx(2.4, abs=1e-6)
    later = chain_counted_accept_length(1.3, N, 10.0)
    engine.run(drafts=100, counted=later, ended=10)
    _scrape(tracker, engine)
    assert tracker.accept_length == pytest.approx(later)
    engine.run(drafts=100, counted=later, ended=10)
    _scrape(tracker, engine)
    assert tracker.outputs_per_request == pytest.approx(10.0)
    assert tracker.tokens_per_step_estimate == pytest.approx(1.3, abs=1e-6)


def test_the_window_is_chosen_and_the_figures_are_not_arguments():
    assert AcceptLengthTracker.for_poll(N, 5.0).window == WINDOW and AcceptLengthTracker.for_poll(N, 120.0).window == 1
    assert AcceptLengthTracker.for_poll(N, 1.0, window_s=10.0).window == 10
    with pytest.raises(ValueError, match="window"):
        _tracker(0)
    with pytest.raises(TypeError):
        AcceptLengthTracker(N)  # no default window: one interval would flap
    with pytest.raises(TypeError):
        AcceptLengthTracker(N, window=2, tokens_per_step_estimate=2.0)


def test_a_restarted_engine_starts_a_new_baseline_and_keeps_the_last_figures():
    engine, tracker = Engine(), _tracker()
    _scrape(tracker, engine)
    engine.run(drafts=200, counted=chain_counted_accept_length(2.0, N, 2.0), ended=100)
    _scrape(tracker, engine)
    before = (tracker.accept_length, tracker.tokens_per_step_estimate)
    restarted = Engine()
    restarted.sequences = engine.sequences  # the replica's running total goes on; the engine's counters restart
    restarted.run(drafts=10, counted=3.0, ended=0)
    assert _scrape(tracker, restarted) == before[0] and tracker.tokens_per_step_estimate == before[1]
    restarted.run(drafts=300, counted=3.0, ended=0)
    assert _scrape(tracker, restarted) == pytest.approx(3.0)
    assert tracker.tokens_per_step_estimate == pytest.approx(3.0)


def test_an_idle_engine_keeps_its_last_reading_as_the_window_empties():
    """After a burst whose last interval holds its ends and few outputs, idle scrapes past the window's
    length: were the window's figures recomputed as the burst slid out, its tail alone would read as
    heavily coalesced."""
    truth = 2.2
    counted = chain_counted_accept_length(truth, N, 50.0)
    engine, tracker = Engine(), _tracker(4)
    _scrape(tracker, engine)
    for drafts, ended in ((1000, 0), (998, 0), (2, 40)):
        engine.run(drafts=drafts, counted=counted, ended=ended)
        _scrape(tracker, engine)
    before = (tracker.accept_length, tracker.tokens_per_step_estimate, tracker.outputs_per_request)
    assert before[1] == pytest.approx(truth, abs=1e-6)
    for _ in range(6):
        engine.run(drafts=0, counted=1, ended=0)
        _scrape(tracker, engine)
        assert (tracker.accept_length, tracker.tokens_per_step_estimate, tracker.outputs_per_request) == before
    assert AcceptLengthTracker(0, window=1).update(engine.samples(), 5) is None  # MTP off: nothing to track
    assert _tracker().update({"lmdeploy:num_requests_running": 1.0}, 5) is None  # no spec counters


def test_sequences_that_end_after_their_last_counted_step_update_the_estimate():
    """The replica counts a sequence when its response ends, which can be a scrape after the engine
    counted its last step: that scrape sees ends and no drafts, and still corrects the window."""
    truth, outputs = 2.0, 1.5
    engine, tracker = Engine(), _tracker()
    _scrape(tracker, engine)
    engine.run(drafts=60 * outputs, counted=chain_counted_accept_length(truth, N, outputs), ended=0)
    _scrape(tracker, engine)
    assert tracker.outputs_per_request is None
    engine.run(drafts=0, counted=1, ended=60)
    _scrape(tracker, engine)
    assert tracker.outputs_per_request == pytest.approx(outputs)
    assert tracker.tokens_per_step_estimate == pytest.approx(truth, abs=1e-6)


def test_figures_outside_the_models_domain_are_clamped_never_raised():
    """An accepted count read ahead of its drafts (counted above N + 1), and ends whose last steps fell
    into an earlier scrape (fewer counted outputs than sequences)."""
    engine, tracker = Engine(), _tracker(1)
    _scrape(tracker, engine)
    engine.run(drafts=10, counted=N + 1.4, ended=2)
    _scrape(tracker, engine)
    assert tracker.accept_length == pytest.approx(N + 1.4) and tracker.tokens_per_step_estimate == pytest.approx(N + 1)
    engine.run(drafts=3, counted=2.5, ended=6)  # 0.5 outputs per sequence
    _scrape(tracker, engine)
    assert tracker.outputs_per_request == pytest.approx(0.5)
    assert tracker.tokens_per_step_estimate == pytest.approx(estimate_tokens_per_step(2.5, N, 6.0, 6))
    assert chain_counted_accept_length(tracker.tokens_per_step_estimate, N, 1.0) == pytest.approx(2.5)  # as at 1
    assert estimate_tokens_per_step(0.7, N, 20.0, 10) == pytest.approx(1.0, abs=1e-9)
    assert estimate_tokens_per_step(2.5, N, 40.0, 0) == 2.5
    with pytest.raises(ValueError, match="num_draft_tokens"):
        estimate_tokens_per_step(2.5, 0, 20.0, 10)


@pytest.mark.parametrize(("body", "sequences"), [
    (b'{"prompt": "x", "max_tokens": 300}', 1),
    (b'{"messages": [], "max_tokens": 2}', 1),
    (b'{"prompt": "x"}', 1),  # no cap: the engine's own, far above 1
    (b'{"prompt": "x", "max_tokens": 1}', 0),  # a health ping: the prefill makes the only token
    (b'{"messages": [], "max_tokens": 100, "max_completion_tokens": 1}', 0),  # the newer name wins
    (b'{"messages": [], "max_tokens": 1, "max_completion_tokens": 64}', 1),
    (b'{"prompt": "x", "max_tokens": 64, "n": 4}', 4),
    (b'{"prompt": "x", "max_tokens": 1, "n": 4}', 0),
    (b'{"prompt": "x", "n": "2"}', 1),
    (b'not json', 1),
    (b'[1, 2]', 1),
])
def test_a_request_adds_the_sequences_it_asked_for_when_they_could_draft(body, sequences):
    assert drafting_sequences(body) == sequences


# ----- the bench -------------------------------------------------------------------------------------
def test_the_bench_estimate_inverts_the_counting_with_n_from_the_config_or_the_counters():
    counted = chain_counted_accept_length(2.66, N, 1.1)
    delta = {"num_drafts": 70.4, "num_draft_tokens": 70.4 * N, "num_accepted_tokens": 70.4 * (counted - 1)}
    assert tokens_per_step_from_counters(counted, delta, 64, N) == pytest.approx(2.66, abs=1e-6)
    assert tokens_per_step_from_counters(counted, delta, 64, None) == pytest.approx(2.66, abs=1e-6)
    without_drafts = {k: v for k, v in delta.items() if k != "num_drafts"}  # drafts from draft tokens / N
    assert tokens_per_step_from_counters(counted, without_drafts, 64, N) == pytest.approx(2.66, abs=1e-6)
    assert tokens_per_step_from_counters(None, delta, 64, N) is None
    assert tokens_per_step_from_counters(counted, without_drafts, 64, None) is None  # N unknown


def test_the_bench_and_the_live_gauge_follow_one_rule():
    """The same counts give the same estimate through the bench and the replica's tracker, also where no
    request ended (no last step counted: the counted figure stands)."""
    for outputs, ended in ((1.3, 64), (5.0, 0)):
        counted = chain_counted_accept_length(2.1, N, outputs) if ended else 2.1
        engine, tracker = Engine(), _tracker()
        _scrape(tracker, engine)
        engine.run(drafts=64 * outputs, counted=counted, ended=ended)
        _scrape(tracker, engine)
        delta = {"num_drafts": engine.drafts, "num_draft_tokens": engine.draft_tokens,
                 "num_accepted_tokens": engine.accepted}
        assert tokens_per_step_from_counters(counted, delta, ended, N) == pytest.approx(
            tracker.tokens_per_step_estimate, abs=1e-9)
        assert tracker.tokens_per_step_estimate == pytest.approx(2.1, abs=1e-6)


def test_the_bench_label_shows_the_engines_estimate_beside_the_counted_figure_when_outputs_are_few():
    delta = {"num_drafts": 70.4}
    assert accept_length_label(3.4, delta, 64, 2.66) == (
        "3.400 (counted over 1.1 decode outputs per request; 1 in 1.1 counted steps is a request's last, "
        "so it reads above the engine's tokens per step; engine ≈ 2.660 tokens per step, estimated)")
    # many outputs per request: the counted figure stands for itself
    assert accept_length_label(4.22, {"num_drafts": 91.0}, 2, 4.21) == "4.220 (counted over 45.5 decode outputs per request)"


def test_the_bench_result_carries_the_estimate_and_loads_results_stored_without_it():
    stats = LatencyStats(mean=1.0, median=1.0, p99=2.0)
    fields = dict(workload={}, engine_key=None, engine_config=None, versions={}, started_at="", finished_at="",
                  duration_s=1.0, completed=64, failed=0, failure_reasons={}, request_throughput=64.0,
                  input_throughput=1.0, output_throughput=1.0, total_token_throughput=2.0, total_input_tokens=1,
                  total_output_tokens=1, ttft_ms=stats, tpot_ms=stats, itl_ms=stats, e2e_ms=stats, accept_length=3.4,
                  spec_counters={"num_drafts": 70.4}, simulated=True, time_scale=1.0, early_stopped=False,
                  concurrency=64)
    r = BenchResult(**fields, tokens_per_step_estimate=2.66)
    assert r.to_dict()["tokens_per_step_estimate"] == 2.66 and r.to_dict()["accept_length"] == 3.4
    stored = r.to_dict()
    del stored["tokens_per_step_estimate"]
    assert BenchResult.from_dict(stored).tokens_per_step_estimate is None


# The agreement-0.7 MTP grid of the H200 landscape's first lease (draft tokens x output length x
# temperature x concurrency, 80 cells); later leases add other agreements and may move re-measured cells
# aside (``superseded``): the claim below is about these cells.
LANDSCAPE_CELLS = [f"a0.7-mtp{n}|out{out}|T{t}|c{c}" for n in (1, 2, 3, 4) for out in (128, 512)
                   for t in ("0", "0.8") for c in (1, 4, 16, 64, 256)]


def test_on_the_h200_landscape_the_estimate_recovers_the_builders_prediction():
    """The H200 landscape measured a constructed MoE checkpoint whose tokens per step the builder predicts
    (``predicted_accept_length``; a near-constant chain, the counting model's ideal case) through
    LMDeploy's counters: counted, the figure strays up to 0.75 above the prediction at high load;
    inverted with each cell's outputs per request, 76 of the 80 cells sit within ±0.15 of it (61
    uncorrected)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu_landscape_h200_2026-12-02/landscape.json"
    measured = json.loads(path.read_text())["cells"]
    cells = [measured[k] for k in LANDSCAPE_CELLS]
    assert all(c["accept_length"] and c["predicted_accept_length"] is not None for c in cells)
    estimate = {id(c): tokens_per_step_from_counters(c["accept_length"], c["spec_counters"], c["completed"],
                                                     c["draft_tokens"]) for c in cells}
    close = [c for c in cells if abs(estimate[id(c)] - c["predicted_accept_length"]) <= 0.15]
    counted_close = [c for c in cells if abs(c["accept_length"] - c["predicted_accept_length"]) <= 0.15]
    assert len(close) >= 72 and len(close) - len(counted_close) >= 10, (len(close), len(counted_close))
    busiest = [c for c in cells if c["concurrency"] == 256]
    bias = sum(estimate[id(c)] - c["predicted_accept_length"] for c in busiest) / len(busiest)
    counted_bias = sum(c["accept_length"] - c["predicted_accept_length"] for c in busiest) / len(busiest)
    assert abs(bias) < 0.05 < 0.2 < counted_bias
