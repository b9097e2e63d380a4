"""What LMDeploy's speculative-decoding counters report under load (``tuning.bench.counters``), and the
committed check that this counting explains the rise of the counted accept length with concurrency."""
from __future__ import annotations

from pathlib import Path

import pytest

from tuning.bench.counters import (
    accept_length_label,
    chain_accept_distribution,
    chain_counted_accept_length,
    chain_per_draft,
    chain_tokens_per_step,
    counted_accept_length,
    outputs_per_request,
)

ROOT = Path(__file__).resolve().parents[2]


def test_a_chain_of_drafts_accepts_as_many_as_its_first_rejection_allows():
    dist = chain_accept_distribution(0.5, 3)
    assert dist == pytest.approx((0.5, 0.25, 0.125, 0.125)) and sum(dist) == pytest.approx(1.0)
    assert chain_accept_distribution(1.0, 2) == (0.0, 0.0, 1.0)
    with pytest.raises(ValueError):
        chain_accept_distribution(1.5, 2)


def test_the_finishing_step_counts_by_its_length_and_other_outputs_dilute_it():
    """Steps of 1 or 3 tokens, half each (true tokens per step 2): the step that crosses the end is a
    3-token one with probability 3/4, so it counts 2.5 on average; with 4 outputs per request, three
    even ones (2 each) and that one: 2.125; with every step counted the figure tends to the truth."""
    last = (0.5, 0.0, 0.5)
    assert counted_accept_length(2.0, last, 1.0) == pytest.approx(2.5)
    assert counted_accept_length(2.0, last, 4.0) == pytest.approx(2.125)
    assert counted_accept_length(2.0, last, 1000.0) == pytest.approx(2.0, abs=1e-3)
    with pytest.raises(ValueError, match="finishing output"):
        counted_accept_length(2.0, last, 0.5)


def test_outputs_per_request_are_the_draft_outputs_over_finished_requests():
    assert outputs_per_request({"num_drafts": 142.0}, 64) == pytest.approx(2.21875)
    assert outputs_per_request({"num_drafts": 0.0}, 64) is None and outputs_per_request({"num_drafts": 5.0}, 0) is None


def test_the_summary_says_how_many_outputs_an_accept_length_was_counted_over():
    assert accept_length_label(None, {}, 8) == "n/a"
    assert accept_length_label(4.56, {}, 64) == "4.560"  # no draft outputs counted: nothing to say
    busy = accept_length_label(4.56, {"num_drafts": 142.0}, 64)
    assert busy == ("4.560 (counted over 2.2 decode outputs per request; 1 in 2.2 counted steps is a request's last, "
                    "so it reads above the engine's tokens per step)")
    assert accept_length_label(4.22, {"num_drafts": 91.0}, 2) == "4.220 (counted over 45.5 decode outputs per request)"


def test_a_chains_counted_figure_inverts_to_its_tokens_per_step():
    for n, truth, outputs in ((4, 3.79, 1.0), (2, 1.7, 2.5), (1, 1.9, 40.0)):
        counted = chain_counted_accept_length(truth, n, outputs)
        assert counted >= truth and chain_tokens_per_step(counted, n, outputs) == pytest.approx(truth, abs=1e-6)
    assert chain_per_draft(1.0, 3) == pytest.approx(0.0, abs=1e-9) and chain_per_draft(4.0, 3) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        chain_per_draft(4.5, 3)


