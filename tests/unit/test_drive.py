"""The mixed-workload driver's pure parts: the dispatcher follows a load profile (ramps, bursts), the
class draw matches the mix's shares, and goodput per phase is what the definitions say."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tuning.drive import (
    Dispatcher,
    DriveRecord,
    DriveResult,
    EngineLateness,
    RequestDraw,
    Slo,
    kept_schedule,
    overall_figures,
    phase_figures,
    report_lines,
    tokens_in_window,
)
from tuning.drive.cli import main as cli_main
from tuning.traffic import LoadProfile, TrafficMix

PROFILE = LoadProfile.model_validate({"phases": [
    {"seconds": 10, "concurrency": 4},
    {"seconds": 8, "ramp_to": 12},
    {"seconds": 4, "concurrency": 20, "name": "burst"},
    {"seconds": 10, "concurrency": 4}]})

MIX = TrafficMix.model_validate({"default_temperature": 0.7, "classes": [
    {"max_tokens": 1024, "temperature": 0.0, "share": 5},
    {"max_tokens": 8192, "share": 3},
    {"max_tokens": 4096, "temperature": 0.8, "share": 2}]})


def _run_virtual(profile: LoadProfile, duration: float, dt: float = 0.01):
    """Drive the dispatcher on a virtual clock with requests that each take ``duration`` seconds: the
    trace of (t, in flight, target) and every launch."""
    draw = RequestDraw(MIX, seed=1)
    d = Dispatcher(profile, draw.next)
    ends: dict[int, float] = {}
    trace, launches = [], []
    t = 0.0
    while not d.done(t):
        for i in [i for i, end in ends.items() if end <= t + 1e-9]:
            d.finished(i)
            del ends[i]
        for launch in d.tick(t):
            ends[launch.request.index] = t + duration
            launches.append(launch)
        trace.append((t, d.in_flight, d.target(t)))
        t = round(t + dt, 6)
        assert t < profile.seconds + duration + 1, "the drive never ended"
    return trace, launches, t


def test_dispatcher_keeps_the_profiles_concurrency_through_ramp_and_burst():
    duration = 0.5
    trace, launches, ended = _run_virtual(PROFILE, duration)
    for t, in_flight, target in trace:
        if t >= PROFILE.seconds:
            assert target == 0
            continue
        dropped_recently = any(PROFILE.concurrency_at(s) > target for s in (t - duration + 0.01 * k for k in range(50))
                               if s >= 0)
        if dropped_recently:
            # a falling level is reached by not replacing finished requests: never above what it was
            assert target <= in_flight <= 20
        else:
            assert in_flight == target, f"t={t}: {in_flight} in flight, profile asks {target}"
    by_phase = Counter(launch.phase for launch in launches)
    assert set(by_phase) == {0, 1, 2, 3}
    assert all(launch.phase == PROFILE.phase_at(launch.at) for launch in launches)
    assert max(launch.at for launch in launches) < PROFILE.seconds, "nothing starts after the profile's end"
    assert ended <= PROFILE.seconds + duration + 0.02
    # the ramp passes every level from 4 to 12, the burst jumps to 20 at once
    ramp = {target for t, _, target in trace if 10 <= t < 18}
    assert set(range(5, 13)) <= ramp
    assert {in_flight for t, in_flight, _ in trace if 18.0 <= t < 22} == {20}


def test_dispatcher_rejects_unknown_finishes_and_negative_time():
    d = Dispatcher(PROFILE, RequestDraw(MIX, seed=0).next)
    with pytest.raises(ValueError, match="not in flight"):
        d.finished(3)
    with pytest.raises(ValueError, match="starts at 0"):
        d.tick(-1.0)


def test_class_draw_matches_the_mix_shares_and_is_seeded():
    draw = RequestDraw(MIX, seed=7, input_len=1000, range_ratio=0.5)
    reqs = [draw.next() for _ in range(20000)]
    counts = Counter(r.class_index for r in reqs)
    for k, p in enumerate((0.5, 0.3, 0.2)):
        sigma = (p * (1 - p) / len(reqs)) ** 0.5
        assert abs(counts[k] / len(reqs) - p) < 4 * sigma
    assert [r.index for r in reqs[:5]] == [0, 1, 2, 3, 4]
    assert {(r.max_tokens, r.temperature) for r in reqs} == {(1024, 0.0), (8192, 0.7), (4096, 0.8)}
    assert min(r.prompt_len for r in reqs) >= 500 and max(r.prompt_len for r in reqs) <= 1000
    again = RequestDraw(MIX, seed=7, input_len=1000, range_ratio=0.5)
    assert [again.next() for _ in range(100)] == reqs[:100]
    other = RequestDraw(MIX, seed=8, input_len=1000, range_ratio=0.5)
    assert [other.next().class_index for _ in range(100)] != [r.class_index for r in reqs[:100]]


def _rec(index, phase, started, first, finished, tokens, ok=True, error_kind=None):
    return DriveRecord(index=index, phase=phase, class_index=0, max_tokens=tokens or 1, temperature=0.0,
                       prompt_len=10, started_at=started, first_token_at=first, finished_at=finished,
                       output_tokens=tokens, ok=ok, error_kind=error_kind, error="" if ok else "x")


TWO_PHASES = LoadProfile.model_validate({"phases": [{"seconds": 10, "concurrency": 2},
                                                    {"seconds": 10, "concurrency": 2, "name": "second"}]})
RECORDS = [
    _rec(0, 0, 0.0, 1.0, 11.0, 11),  # TTFT 1, TPOT 1: good; 1 + 9 tokens in [0,10), 1 in [10,20)
    _rec(1, 0, 2.0, 5.0, 7.0, 5),  # TTFT 3 > 2: completed, not good; 5 tokens in [0,10)
    _rec(2, 1, 12.0, None, 12.1, 0, ok=False, error_kind="HTTP 503"),
    _rec(3, 1, 12.0, 12.5, 14.5, 5),  # TTFT 0.5, TPOT 0.5: good; 5 tokens in [10,20)
]


def test_goodput_per_phase_is_hand_computed():
    slo = Slo(ttft_s=2.0, tpot_s=2.0)
    first, second = phase_figures(RECORDS, TWO_PHASES, slo)
    assert (first.label, second.label) == ("steady 2", "second")
    assert first.throughput == pytest.approx(1.5) and first.goodput == pytest.approx(1.0)
    assert (first.started, first.completed, first.good, first.failed) == (2, 2, 1, 0)
    assert second.throughput == pytest.approx(0.6) and second.goodput == pytest.approx(0.6)
    assert (second.started, second.completed, second.good, second.failed) == (2, 1, 1, 1)
    assert second.errors == {"HTTP 503": 1}
    overall = overall_figures(RECORDS, TWO_PHASES, slo)
    assert overall.throughput == pytest.approx(21 / 20) and overall.goodput == pytest.approx(16 / 20)
    assert first.ttft_median_s == pytest.approx(2.0) and first.tpot_median_s == pytest.approx(0.75)


def test_a_tighter_slo_lowers_goodput_not_throughput():
    strict = Slo(ttft_s=0.6, tpot_s=2.0)
    first, second = phase_figures(RECORDS, TWO_PHASES, strict)
    assert first.goodput == 0.0 and first.throughput == pytest.approx(1.5)
    assert second.goodput == pytest.approx(0.5)  # only request 3; request 0's last token no longer counts


def test_tokens_in_window_edges():
    r = _rec(0, 0, 0.0, 1.0, 11.0, 11)
    assert tokens_in_window(r, 0, 100) == pytest.approx(11)
    assert tokens_in_window(r, 11, 20) == 0
    assert tokens_in_window(_rec(0, 0, 0.0, 2.0, 2.0, 4), 0, 5) == 4  # every token at once
    assert tokens_in_window(_rec(0, 0, 0.0, None, 2.0, 0, ok=False), 0, 5) == 0
    with pytest.raises(ValueError, match="must be > 0"):
        Slo(ttft_s=0, tpot_s=1)


def _result(lateness):
    return DriveResult(base_url="http://x", model="m", simulated=True, time_scale=5.0, mix=MIX.model_dump(mode="json"),
                       profile=TWO_PHASES.model_dump(mode="json"), seed=0, input_len=1024, started_at="a",
                       finished_at="b", drain_s=600, records=tuple(RECORDS), lateness=tuple(lateness))


def test_report_labels_simulated_and_refuses_engines_that_fell_behind():
    on_time = _result([EngineLateness("e1", steps=1000, late_steps=3, lateness_s=0.01)])
    lines = report_lines(on_time, Slo(2.0, 2.0))
    assert any("SIMULATED" in line for line in lines) and "engines kept their schedule" in lines
    behind = _result([EngineLateness("e1", steps=1000, late_steps=900, lateness_s=800.0)])
    assert kept_schedule(on_time.lateness, TWO_PHASES)
    assert not kept_schedule(behind.lateness, TWO_PHASES) and not kept_schedule((), TWO_PHASES)
    assert any("FELL BEHIND" in line for line in report_lines(behind, Slo(2.0, 2.0)))


def test_drive_result_round_trips_through_json():
    res = _result([EngineLateness("e1", steps=10, late_steps=0, lateness_s=0.0)])
    back = DriveResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res


def test_profile_windows_and_labels():
    assert PROFILE.windows() == [(0.0, 10.0), (10.0, 18.0), (18.0, 22.0), (22.0, 32.0)]
    assert [PROFILE.label(i) for i in range(4)] == ["steady 4", "ramp 4->12", "burst", "steady 4"]


def test_cli_names_the_bad_file_and_sends_nothing(tmp_path, capsys):
    profile = tmp_path / "p.yaml"
    profile.write_text("phases:\n  - {seconds: 5, ramp_to: 8}\n")
    mix = tmp_path / "m.yaml"
    mix.write_text("classes:\n  - {max_tokens: 16, temperature: 0, share: 1}\n")
    assert cli_main(["--base-url", "http://127.0.0.1:9", "--mix", str(mix), "--profile", str(profile)]) == 2
    assert "first phase cannot be a ramp" in capsys.readouterr().err
    assert cli_main(["--base-url", "http://127.0.0.1:9", "--mix", str(tmp_path / "none.yaml"),
                     "--profile", str(profile)]) == 2
    assert "cannot read traffic mix" in capsys.readouterr().err
