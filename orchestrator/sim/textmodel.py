"""What the simulated engine says: a stand-in target model whose samples depend on the prompt, the
temperature and the seed, and on nothing else.

Why: LMDeploy's MTP verifies every draft against the target model, so speculation must change *when*
tokens come, never *which* (issue #18: sampled outputs keep the target distribution). The simulator
models MTP as timing only, so its text is drawn once per request, before any engine step, from a
distribution set by (prompt, temperature) with the request's own seed; the draft count and the
emission schedule only decide how the drawn tokens are cut into stream events. The distribution is
not a language model, but it responds to what a real one responds to, so a test that two engines
sample one distribution can fail when they do not (another prompt, another temperature):

- the prompt picks an anchor in the shipped corpus (a stable hash of its text);
- greedy (``T = 0``) reads the corpus from the anchor: one prompt, one text, as greedy decoding;
- sampled, the walk starts a random distance past the anchor (geometric, mean ``SPREAD_TOKENS * T``)
  and, before each later token, jumps ahead by such a distance with probability ``JUMP_RATE * T``
  (at most ``MAX_JUMP_PROB``): the higher the temperature, the wider the outcomes spread.

Text is corpus tokens joined by single spaces, so ``count_tokens`` of ``n`` tokens is ``n``.
"""
from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass

import numpy as np

from orchestrator.sim.tokenizer import corpus_tokens

__all__ = ["JUMP_RATE", "MAX_JUMP_PROB", "SPREAD_TOKENS", "Completion", "draw_completion", "prompt_anchor"]

SPREAD_TOKENS = 32.0
"""Mean distance (tokens) of a sampled start or jump past the current corpus position, per unit of temperature."""

JUMP_RATE = 0.05
"""Probability per token and unit of temperature that the walk jumps (leaves the corpus run)."""

MAX_JUMP_PROB = 0.5


def prompt_anchor(prompt_key: str) -> int:
    """Corpus position a prompt's completions start from (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b(prompt_key.encode("utf-8", errors="replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % len(corpus_tokens())


@dataclass(frozen=True)
class Completion:
    """A drawn completion of ``num_tokens`` tokens: runs of consecutive corpus tokens.

    ``bounds[i]`` is the completion index where run ``i`` starts (``bounds[0] == 0``) and ``starts[i]``
    its corpus position; positions wrap around the corpus.
    """

    num_tokens: int
    bounds: tuple[int, ...]
    starts: tuple[int, ...]

    def tokens(self, start: int, stop: int) -> list[str]:
        """Tokens ``start .. stop - 1`` of the completion (clipped to it)."""
        corpus = corpus_tokens()
        size = len(corpus)
        start, stop = max(0, start), min(stop, self.num_tokens)
        out: list[str] = []
        i = bisect.bisect_right(self.bounds, start) - 1
        while start < stop:
            run_end = self.bounds[i + 1] if i + 1 < len(self.bounds) else self.num_tokens
            take = min(stop, run_end) - start
            pos = (self.starts[i] + start - self.bounds[i]) % size
            while take > 0:  # a run may wrap around the corpus's end
                piece = corpus[pos: pos + take]
                out.extend(piece)
                take -= len(piece)
                start += len(piece)
                pos = 0
            i += 1
        return out

    def text(self, start: int, stop: int) -> str:
        return " ".join(self.tokens(start, stop))


def draw_completion(prompt_key: str, temperature: float, num_tokens: int, seed: int) -> Completion:
    """The completion a request of ``prompt_key`` at ``temperature`` gets with ``seed``."""
    anchor = prompt_anchor(prompt_key)
    num_tokens = max(0, int(num_tokens))
    if temperature <= 0 or num_tokens == 0:
        return Completion(num_tokens, (0,), (anchor,))
    rng = np.random.default_rng([int(seed) % 2**64, 0x7E47])  # apart from the request's timing draws
    spread = 1.0 / (1.0 + SPREAD_TOKENS * float(temperature))
    jumps = np.flatnonzero(rng.random(max(num_tokens - 1, 0)) < min(MAX_JUMP_PROB, JUMP_RATE * float(temperature))) + 1
    distances = rng.geometric(spread, size=len(jumps) + 1)  # >= 1; the first start may land at the anchor
    bounds = np.concatenate(([0], jumps))
    lengths = np.diff(np.concatenate((bounds, [num_tokens])))
    starts = anchor + distances[0] - 1 + np.concatenate(([0], np.cumsum(lengths[:-1] + distances[1:])))
    return Completion(num_tokens, tuple(int(b) for b in bounds), tuple(int(s) for s in starts))
