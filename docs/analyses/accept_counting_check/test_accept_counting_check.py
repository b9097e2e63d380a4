"""The committed counting check is what ``accept_counting_check.py`` computes from its measurement (a study:
run from the repository root with ``python -m pytest docs/analyses/accept_counting_check``)."""
from __future__ import annotations

import json
from pathlib import Path

from docs.analyses.accept_counting_check import accept_counting_check as script

ROOT = Path(__file__).resolve().parents[3]


def test_the_committed_counting_check_is_what_the_script_computes_from_its_measurement(tmp_path):
    committed = json.loads((ROOT / "docs/analyses/accept_counting_check/accept_counting_check_2026-12-02.json").read_text())
    assert script.main(["--out-prefix", str(tmp_path / "check.v1")]) == 0  # a dot in the prefix is kept
    fresh = json.loads((tmp_path / "check.v1.json").read_text())
    assert {k: v for k, v in fresh.items() if k != "command"} == {k: v for k, v in committed.items() if k != "command"}
    assert (tmp_path / "check.v1.md").read_text().split("\n", 3)[3] == \
        (ROOT / "docs/analyses/accept_counting_check/accept_counting_check_2026-12-02.md").read_text().split("\n", 3)[3]
    s = committed["summary"]
    # the verdict follows the rows: a share of the rise, cells above the ceiling named
    assert 0 < s["explained_share_median"] < 1 and s["above_ceiling"]
    for name in s["above_ceiling"]:
        (row,) = [r for r in committed["rows"] if f"{r['config']} o{r['output_len']} c{r['concurrency']}" == name]
        assert row["counted"] > row["if_only_last_step"]
    md = (ROOT / "docs/analyses/accept_counting_check/accept_counting_check_2026-12-02.md").read_text()
    assert f"net rise of {s['predicted_net_rise']:+.2f} against {s['measured_net_rise']:+.2f} measured" in md
    assert all(name in md for name in s["fell"]) and "too noisy to say" in md
    assert all(r["counted_high"] <= r["ceiling"] for r in committed["last_step_ceiling"]) == \
        (f"{len(committed['last_step_ceiling'])} of {len(committed['last_step_ceiling'])} stay under it" in md)
