"""The simulator's text model (``orchestrator/sim/textmodel.py``), without a server: a completion is a
function of prompt, temperature and seed, cut anywhere it reads the same, and its spread grows with
temperature. The over-HTTP test that MTP keeps the sampled distribution is
``tests/integration/test_sim_sampling.py``."""
from __future__ import annotations

import numpy as np

from orchestrator.sim.textmodel import Completion, draw_completion, prompt_anchor
from orchestrator.sim.tokenizer import corpus_tokens, count_tokens

PROMPT = "Explain how a hash table resolves collisions."


def test_a_completion_reads_the_same_however_it_is_cut():
    rng = np.random.default_rng(0)
    for seed in range(20):
        c = draw_completion(PROMPT, 1.5, 400, seed)
        whole = c.tokens(0, 400)
        assert len(whole) == 400 and count_tokens(c.text(0, 400)) == 400
        cuts = sorted(set(rng.integers(1, 400, size=int(rng.integers(1, 40))).tolist()))
        pieces = [c.tokens(a, b) for a, b in zip([0, *cuts], [*cuts, 400])]
        assert [t for piece in pieces for t in piece] == whole


def test_runs_wrap_around_the_corpus_end():
    size = len(corpus_tokens())
    c = Completion(10, (0,), (size - 3,))
    assert c.tokens(0, 10) == [*corpus_tokens()[size - 3:], *corpus_tokens()[:7]]
    assert c.tokens(2, 5) == c.tokens(0, 10)[2:5]


def test_greedy_ignores_the_seed_and_sampling_uses_it():
    assert len({tuple(draw_completion(PROMPT, 0.0, 50, s).tokens(0, 50)) for s in range(10)}) == 1
    assert draw_completion(PROMPT, 0.0, 5, 0).tokens(0, 5) == list(corpus_tokens()[prompt_anchor(PROMPT):][:5])
    assert len({tuple(draw_completion(PROMPT, 1.0, 50, s).tokens(0, 50)) for s in range(10)}) == 10
    assert draw_completion(PROMPT, 1.0, 50, 7) == draw_completion(PROMPT, 1.0, 50, 7)


def test_hotter_sampling_spreads_wider_and_prompts_pick_different_places():
    def mean_offset(temperature: float) -> float:
        anchor = prompt_anchor(PROMPT)
        return float(np.mean([draw_completion(PROMPT, temperature, 8, s).starts[0] - anchor for s in range(2000)]))

    assert mean_offset(0.25) < mean_offset(0.5) < mean_offset(1.0) < mean_offset(2.0)
    assert prompt_anchor(PROMPT) != prompt_anchor("Write a haiku about the sea.")
