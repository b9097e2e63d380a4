"""An engine grid's figures (:mod:`tuning.engine_grid`, what ``benchmarks/gpu/measure_turbomind.py`` reports):
which waves count, how runs pool, how a round's waves make one figure, and what the report marks."""
from __future__ import annotations

import pytest

from tuning import engine_grid


def _wave(rnd, tput, failed=0, reasons=None, engine="turbomind", run=None):
    row = {"round": rnd, "engine": engine, "output_len": 128, "concurrency": 256, "temperature": 0.0,
           "output_throughput": tput, "completed": 256 - failed, "failed": failed, "failure_reasons": reasons}
    return row if run is None else row | {"run": run}


def test_a_wave_that_lost_only_empty_text_counts_scaled_and_a_clean_retry_replaces_it():
    empty = {engine_grid.EMPTY_TEXT: 1}
    rows = [_wave(0, 255.0, 1, empty), _wave(1, 100.0, 1, empty), _wave(1, 120.0),  # round 1 retried clean
            _wave(2, 300.0, 1, {"timeout": 1}), _wave(3, 200.0, 1, None)]
    counted = {r["round"]: r for r in engine_grid.counted_rows(rows)}
    assert counted[0]["output_throughput"] == pytest.approx(256.0) and counted[0]["admitted"] == "empty text"
    assert counted[1]["output_throughput"] == 120.0 and not counted[1].get("admitted")
    assert 2 not in counted and 3 not in counted  # a timeout is a loss; an unrecorded one only when asked
    assert engine_grid.counted_rows(rows, admit_unrecorded=True)[-1]["output_throughput"] == pytest.approx(200.0 * 256 / 255)


def test_pooled_runs_give_a_cell_every_runs_rounds():
    def run(rows, conc, batch):
        return {"command": "c", "rounds": 2, "order": [["turbomind"]], "starts": [], "rows": rows, "ckpt": "/c",
                "engines": {"turbomind": {"backend": "turbomind", "max_batch_size": batch}},
                "workload": {"concurrency": conc, "input_len": 512, "output_len": [128]}, "notes": []}
    a = run([_wave(0, 100.0), _wave(1, 110.0, 1, None)], [8, 256], 256)
    b = run([_wave(0, 90.0), _wave(1, 95.0, 1, {engine_grid.EMPTY_TEXT: 1})], 256, 128)
    cell = engine_grid.pooled([a, b])["summary"]["turbomind@o128@c256@T0"]
    assert cell["output_throughput"] == [100.0, 90.0, 95.4] and cell["admitted"] == [None, None, "empty text"]
    both = engine_grid.pooled([a, b], admit_unrecorded=True)
    assert both["summary"]["turbomind@o128@c256@T0"]["rounds"] == 4 and both["workload"]["concurrency"] == [8, 256]
    assert both["notes"] == ["engine turbomind differs in run 2: max_batch_size 256 -> 128"]
    md = engine_grid.render_markdown(both)
    assert "Run 2: Command" in md and "95*" in md and "110†" in md and "without a recorded reason" in md
    assert "engine turbomind differs" in md


def test_a_round_is_the_mean_of_its_waves_and_a_short_or_admitted_round_is_marked():
    """``--waves``: one figure per round, the mean of its waves; a round that lost a wave in every attempt
    is the mean of the others and carries ‡; a round with an admitted (empty-text) wave carries *."""
    def wave(rnd, w, tput, **kw):
        return {"round": rnd, "wave": w, "engine": "turbomind", "output_len": 128, "concurrency": 8,
                "temperature": 0.0, "output_throughput": tput, "completed": 8, "failed": 0, "failure_reasons": None} | kw

    rows = [wave(0, 0, 100.0), wave(0, 1, 300.0),
            wave(1, 0, 100.0), wave(1, 1, 5.0, failed=3, completed=5, failure_reasons={"timeout": 3}),
            wave(2, 0, 70.0, failed=1, completed=7, failure_reasons={engine_grid.EMPTY_TEXT: 1}), wave(2, 1, 120.0)]
    cell = engine_grid.summarize(rows)["turbomind@o128@c8@T0"]
    assert cell["output_throughput"] == [200.0, 100.0, 100.0] and cell["waves"] == [2, 1, 2]
    assert cell["admitted"] == [None, None, "empty text"]
    res = {"command": "c", "rounds": 3, "order": [["turbomind"]], "starts": [], "rows": rows, "ckpt": "/c", "notes": [],
           "engines": {"turbomind": {"backend": "turbomind"}}, "summary": engine_grid.summarize(rows),
           "workload": {"concurrency": [8], "input_len": 512, "output_len": [128], "waves": 2}}
    md = engine_grid.render_markdown(res)
    assert "| 200, 100‡, 100* |" in md and "fewer measured waves" in md and "2 measured waves per cell" in md
