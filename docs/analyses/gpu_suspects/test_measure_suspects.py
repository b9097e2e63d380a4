"""``measure_suspects.py``'s pure parts: the order conditions are measured in, how rounds are paired and
pooled, and what its report says (a study: run from the repository root with
``python -m pytest docs/analyses/gpu_suspects``)."""
from __future__ import annotations

import pytest

from docs.analyses.gpu_suspects import measure_suspects as suspects


def test_every_condition_takes_every_slot_once_in_four_rounds():
    orders = [suspects.order_of(r) for r in range(4)]
    assert all(sorted(o) == sorted(suspects.CONDITIONS) for o in orders)
    for slot in range(4):
        assert sorted(o[slot] for o in orders) == sorted(suspects.CONDITIONS)
    pair = [suspects.order_of(r, ("quiet", "cpu")) for r in range(4)]  # --conditions quiet,cpu: ABBA...
    assert pair == [["quiet", "cpu"], ["cpu", "quiet"]] * 2


def test_a_subset_of_conditions_must_hold_quiet(capsys):
    with pytest.raises(SystemExit):
        suspects.main(["--out", "/tmp/never-written", "--conditions", "cpu,busy1"])
    assert "quiet among them" in capsys.readouterr().err


def _runs(start: int, quiet: list[float], busy: list[float]) -> list[dict]:
    return ([{"engine_start": start, "round": r, "condition": "quiet", "output_throughput": q} for r, q in enumerate(quiet)]
            + [{"engine_start": start, "round": r, "condition": "busy1", "output_throughput": b} for r, b in enumerate(busy)]
            + [{"engine_start": start, "round": None, "condition": "first-wave", "output_throughput": 1.0}])


def test_a_condition_is_compared_with_the_quiet_run_of_its_own_round_and_engine():
    """Two engine starts 2x apart in speed: paired per (start, round), busy1 is 0.9x in every round —
    a difference the unpaired means (wide apart by the starts) could never show."""
    runs = _runs(0, [100, 104], [90, 93.6]) + _runs(1, [200, 196], [180, 176.4])
    s = suspects.summarize(runs)
    assert s["busy1"]["ratio_to_quiet"] == pytest.approx(0.9) and s["busy1"]["matters"] is True
    assert s["busy1"]["ratio_ci"][1] < 1.0 and s["quiet"]["n"] == 4
    noisy = suspects.summarize(_runs(0, [100, 100, 100], [80, 120, 95]))
    assert noisy["busy1"]["matters"] is False  # its interval holds 1


def test_pooled_starts_keep_their_rounds_apart():
    a = {"runs": _runs(0, [100, 104], [90, 93.6]), "command": "one", "starts_s": {"test": 1.0}}
    b = {"runs": _runs(0, [200, 196], [180, 176.4]), "command": "two", "starts_s": {"test": 2.0}}
    both = suspects.pooled([a, b])
    assert {r["engine_start"] for r in both["runs"]} == {0, 1}
    assert both["summary"]["busy1"]["n"] == 4 and both["command"] == "one ; two"
    assert suspects.pooled([a]) is a


def test_a_subset_run_says_it_had_no_neighbours_and_pools_with_a_full_one():
    subset = {"runs": _runs(0, [100, 104], []), "command": "quiet,cpu", "starts_s": {}, "neighbours": [],
              "conditions": ["quiet", "cpu"], "engine": "e", "simulated": False, "host": {},
              "workload": {"input_len": 512, "output_len": 512, "concurrency": 64, "num_prompts": 128}}
    assert "neighbours on the same GPU: none" in suspects.render(subset | {"summary": suspects.summarize(subset["runs"])})
    full = subset | {"runs": _runs(0, [100, 104], [90, 93.6]), "neighbours": ["tm", "tm"],
                     "conditions": list(suspects.CONDITIONS)}
    both = suspects.pooled([subset, full])
    assert both["conditions"] == list(suspects.CONDITIONS) and both["neighbours"] == ["tm", "tm"]
    assert "| busy1 | 2 |" in suspects.render(both)
