"""What each request of a mixed-workload drive asks for: its class from the traffic mix, drawn with a
seed, and its prompt length. Pure.

Why by index and not by time: request ``i`` gets the same class, prompt length and sampling seed in
every run with the same seed, whatever the server's speed, so a routing table and each single config
are driven with the same sequence of requests (the first ``n`` of it, ``n`` depending on how fast
they were served).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuning.traffic import TrafficMix

__all__ = ["DrawnRequest", "RequestDraw"]


@dataclass(frozen=True)
class DrawnRequest:
    """Request ``index``: class ``class_index`` of the mix (its ``max_tokens`` and ``temperature``), a
    prompt of ``prompt_len`` tokens and a per-request ``seed`` (the engine's sampling seed)."""

    index: int
    class_index: int
    max_tokens: int
    temperature: float
    prompt_len: int
    seed: int


class RequestDraw:
    """Draws request after request from ``mix``: each class with its share's probability, prompt
    lengths uniform in ``[range_ratio * input_len, input_len]`` (as the sweep's random workload)."""

    def __init__(self, mix: TrafficMix, *, seed: int, input_len: int = 1024, range_ratio: float = 0.5) -> None:
        if input_len < 1:
            raise ValueError(f"input_len={input_len}; allowed: >= 1")
        if not 0.0 < range_ratio <= 1.0:
            raise ValueError(f"range_ratio={range_ratio}; allowed: 0 < range_ratio <= 1")
        self.mix = mix
        shares = np.array([c.share for c in mix.classes], dtype=float)
        self._p = shares / shares.sum()
        self._rng = np.random.default_rng(seed)
        self._low = max(1, int(round(range_ratio * input_len)))
        self._high = input_len
        self._next = 0

    @property
    def probabilities(self) -> tuple[float, ...]:
        """Each class's probability (its normalised share)."""
        return tuple(float(p) for p in self._p)

    def next(self) -> DrawnRequest:
        k = int(self._rng.choice(len(self._p), p=self._p))
        c = self.mix.classes[k]
        prompt_len = int(self._rng.integers(self._low, self._high + 1))
        seed = int(self._rng.integers(0, 2**31 - 1))
        i = self._next
        self._next += 1
        return DrawnRequest(index=i, class_index=k, max_tokens=c.max_tokens, temperature=self.mix.temperature_of(c),
                            prompt_len=prompt_len, seed=seed)
