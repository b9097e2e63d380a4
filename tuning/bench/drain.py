"""Predicting the rest of a run once steady state is known: the step-time model and the drain.

Until the last request starts, the closed loop goes on at the steady-state rate; then comes the
final drain, where occupancy falls from ``concurrency`` to 0 and every sequence speeds up because
each decode step has fewer sequences to serve. The drain is predicted step by step with a
:class:`StepTimeModel` measured from the stream alone: step time against running sequences from an
*occupancy probe* sent before the measured run (``concurrency`` short requests of staggered lengths,
so occupancy falls one sequence at a time; a MoE engine's curve is strongly concave, so it is used
as measured), step time against context from the run's own windows (mean gap between a request's
chunks ~ one step; prefills enter as a count), and tokens per step by output position (speculative
decoding accepts more late in an output). With ``ignore_eos`` the remaining work is known exactly.
The prediction is made at ``z`` standard errors of the model's step times either way (``z`` from
``confidence``); the run stops only when those two full-run figures are within ``drain_tolerance``
(±1%) of their midpoint (:func:`full_run_throughput_bounds`), which is reported. Without a probe
(it failed, or saw too few occupancy levels) the bounds are model-free (drain between the steady
per-sequence rate and the whole steady throughput) and too wide to stop unless the drain is a tiny
share of the run. The early-stopped figure is thus the full run's within the statistical tolerance
plus the drain tolerance, plus the step-time model's form error (measured in
``docs/analyses/early_stop_agreement/early_stop_agreement.md``).

Everything here is pure except :class:`_StreamStats`, which accumulates the model's inputs online.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "PROBE_MIN_TOKENS",
    "PROBE_SPAN_TOKENS",
    "StepTimeModel",
    "fit_occupancy_curve",
    "fit_step_model",
    "full_run_throughput_bounds",
    "occupancy_probe_lengths",
    "predict_drain_end",
    "predict_full_run_end",
]


def predict_full_run_end(
    now: float,
    in_flight_remaining: Sequence[float],
    queued_lengths: Sequence[float],
    concurrency: int,
    per_sequence_rate: float,
    startup_s: float,
) -> float:
    """When a closed-loop run ends if every running sequence keeps decoding at ``per_sequence_rate``
    (a fluid model): when one finishes, the next queued request takes its slot after ``startup_s``
    (its time to first token). Pure."""
    if per_sequence_rate <= 0:
        return math.inf
    slots = [now + max(0.0, r) / per_sequence_rate for r in in_flight_remaining]
    slots += [now] * max(0, concurrency - len(slots))
    heapq.heapify(slots)
    end = max(slots, default=now)
    for length in queued_lengths:
        t = heapq.heappop(slots) + startup_s + length / per_sequence_rate
        end = max(end, t)
        heapq.heappush(slots, t)
    return end


@dataclass(frozen=True)
class StepTimeModel:
    """Measured decode-step time of the engine, from the observed stream only (no engine internals).

    ``step(k, C) = alpha + gamma * C - (f(c) - f(k))``: seconds per decode step with ``k`` sequences
    running and ``C`` tokens of context among them, ``c`` the benchmark's concurrency.

    - ``alpha``, ``gamma`` (and a prefill term, not used in the drain) are fitted by least squares over
      windows of the measured run itself while ``c`` sequences run (the first wave's growing contexts
      and the steady state's turnover give ``C`` its range): mean inter-chunk gap ~ step time.
    - ``f(k)`` is the measured step time at ``k`` running sequences from the occupancy probe (``c``
      short requests of staggered lengths sent before measuring, so occupancy falls from ``c`` to 1
      the way it does in a drain), corrected to common context with ``gamma``; made non-decreasing in
      ``k`` (more sequences never make a step faster). MoE engines have a strongly concave ``f``
      (experts' weights are shared), so it is used as measured, not as a straight line.
    - ``tokens_per_step`` by output position (speculative decoding accepts more late in an output).

    Each part carries its standard error; :meth:`step` with ``z`` gives the bounds the rule uses.
    """

    concurrency: int
    alpha: float
    gamma: float
    cov: tuple[tuple[float, float], tuple[float, float]]
    """Covariance of (alpha, gamma)."""
    occupancy_step: tuple[float, ...]
    """f(k) for k = 1..concurrency (seconds, context-corrected, non-decreasing)."""
    occupancy_se: tuple[float, ...]
    position_bin: float
    tokens_per_step: tuple[float, ...]
    """Mean tokens per chunk by output-position bin of width ``position_bin``."""

    def step(self, k: int, context: float, z: float = 0.0) -> float:
        """Step time with ``k`` running sequences and ``context`` tokens among them; ``z`` standard
        errors above (``z > 0``) or below the estimate."""
        c = self.concurrency
        k = max(1, min(int(k), c))
        (vaa, vag), (_, vgg) = self.cov
        var_fit = max(0.0, vaa + 2 * context * vag + context * context * vgg)
        var_occ = self.occupancy_se[k - 1] ** 2 + self.occupancy_se[c - 1] ** 2 if k < c else 0.0
        s = self.alpha + self.gamma * context - (self.occupancy_step[c - 1] - self.occupancy_step[k - 1])
        s += z * math.sqrt(var_fit + var_occ)
        return max(s, 0.25 * self.occupancy_step[0], 1e-9)

    def tokens_at(self, position: float) -> float:
        i = min(max(int(position / self.position_bin), 0), len(self.tokens_per_step) - 1)
        return self.tokens_per_step[i]

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "gamma": self.gamma,
                "f_1": self.occupancy_step[0], "f_c": self.occupancy_step[-1],
                "tokens_per_step_first": self.tokens_per_step[0], "tokens_per_step_last": self.tokens_per_step[-1]}


def _isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Non-decreasing least-squares fit (pool adjacent violators). Pure."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _, n in blocks:
        out += [v] * int(n)
    return out


def fit_occupancy_curve(
    streams: Sequence[tuple[float, Sequence[tuple[float, float]]]], concurrency: int
) -> tuple[list[float], list[float], list[float]] | None:
    """Step time by running sequences from the probe's streams. Pure.

    Args:
        streams: per probe request, ``(prompt_len, [(t, tokens), ...])`` -- every chunk with text,
            the first one being the first token.
        concurrency: ``c``; the curve is returned for ``k = 1..c``.

    Returns:
        ``(mean gap, standard error, mean context)`` per ``k`` (gaps only after every probe request
        has its first token, so no step holds a prefill), or ``None`` when fewer than half the
        levels were seen. Missing levels are interpolated; the standard error counts one sample per
        step (the ``k`` gaps of one step are one observation).
    """
    live = [(p, ev) for p, ev in streams if len(ev) >= 2]
    if not live:
        return None
    starts = np.array([ev[0][0] for _, ev in live])
    ends = np.array([ev[-1][0] for _, ev in live])
    after = float(starts.max())
    sums = np.zeros(concurrency + 1)
    sq = np.zeros(concurrency + 1)
    cnt = np.zeros(concurrency + 1)
    ctx = np.zeros(concurrency + 1)
    # Context of every request at any time: prompt + tokens before then (step function).
    times = [np.array([t for t, _ in ev]) for _, ev in live]
    cums = [np.cumsum([n for _, n in ev]) for _, ev in live]
    prompts = [p for p, _ in live]
    for j, (_, ev) in enumerate(live):
        for i in range(1, len(ev)):
            t, gap = ev[i][0], ev[i][0] - ev[i - 1][0]
            if ev[i - 1][0] < after or gap <= 0:
                continue
            running = (starts < t) & (ends >= t)
            k = int(running.sum())
            if not 1 <= k <= concurrency:
                continue
            c_tot = 0.0
            for m in np.flatnonzero(running):
                idx = int(np.searchsorted(times[m], t, side="left"))  # tokens before this step
                c_tot += prompts[m] + (float(cums[m][idx - 1]) if idx > 0 else 0.0)
            sums[k] += gap
            sq[k] += gap * gap
            cnt[k] += 1
            ctx[k] += c_tot
    seen = [k for k in range(1, concurrency + 1) if cnt[k] > 0]
    if len(seen) < max(2, concurrency // 2):
        return None
    mean = {k: sums[k] / cnt[k] for k in seen}
    steps = {k: max(1.0, cnt[k] / k) for k in seen}
    se = {}
    for k in seen:
        var = max(0.0, sq[k] / cnt[k] - mean[k] ** 2)
        se[k] = math.sqrt(var / steps[k]) if steps[k] > 1 else mean[k] * 0.1
    mc = {k: ctx[k] / cnt[k] for k in seen}
    ks = np.arange(1, concurrency + 1)
    xs = np.array(seen, dtype=float)
    interp = lambda d: list(np.interp(ks, xs, [d[k] for k in seen]))  # noqa: E731
    m, s, c = interp(mean), interp(se), interp(mc)
    # Interpolated levels get the wider neighbour's error.
    return m, [max(v, se[min(seen, key=lambda q: abs(q - k))]) for k, v in zip(ks, s)], c


def fit_step_model(
    windows: Sequence[tuple[float, float, float, float]],
    occupancy: tuple[Sequence[float], Sequence[float], Sequence[float]],
    positions: tuple[float, Sequence[float]],
    concurrency: int,
) -> StepTimeModel | None:
    """Least-squares step-time model (see :class:`StepTimeModel`). Pure.

    Args:
        windows: per window of the measured run with all ``concurrency`` slots decoding:
            ``(mean gap, mean context, prefills per step, chunks)``.
        occupancy: :func:`fit_occupancy_curve`'s result.
        positions: ``(bin width, tokens per chunk by bin)``.
    Returns ``None`` when there are too few windows (< 6) or the fit is degenerate.
    """
    rows = [w for w in windows if w[3] > 0]
    if len(rows) < 6:
        return None
    y = np.array([w[0] for w in rows])
    x = np.column_stack([np.ones(len(rows)), [w[1] for w in rows], [w[2] for w in rows]])
    if not np.any(x[:, 2] > 0):
        x = x[:, :2]
    try:
        xtx_inv = np.linalg.inv(x.T @ x)
    except np.linalg.LinAlgError:
        return None
    beta = xtx_inv @ x.T @ y
    resid = y - x @ beta
    dof = len(rows) - x.shape[1]
    if dof < 3:
        return None
    cov = xtx_inv * float(resid @ resid) / dof
    mean, se, ctx = occupancy
    c = concurrency
    gamma = float(beta[1])
    corrected = [m - gamma * (cx - ctx[c - 1]) for m, cx in zip(mean, ctx)]  # to the probe's context at k=c
    f = _isotonic(corrected, [1.0 / max(s, 1e-12) ** 2 for s in se])
    width, tps = positions
    if not tps:
        return None
    return StepTimeModel(
        concurrency=c, alpha=float(beta[0]), gamma=gamma,
        cov=((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
        occupancy_step=tuple(f), occupancy_se=tuple(se), position_bin=float(width),
        tokens_per_step=tuple(float(v) for v in tps),
    )


def predict_drain_end(start: float, sequences: Sequence[tuple[float, float, float]], model: StepTimeModel,
                      z: float = 0.0, max_jump: int = 64) -> float:
    """When the last of ``sequences`` ``(remaining tokens, output position, prompt tokens)`` finishes
    if nothing new starts: step by step with :meth:`StepTimeModel.step` (``z`` standard errors
    slower) as occupancy falls and contexts grow; finishes are jumped to in at most ``max_jump``
    steps at a time. Pure."""
    rem = np.array([s[0] for s in sequences if s[0] > 0], dtype=float)
    pos = np.array([s[1] for s in sequences if s[0] > 0], dtype=float)
    ctx = np.array([s[1] + s[2] for s in sequences if s[0] > 0], dtype=float)
    t = start
    while rem.size:
        tau = np.array([model.tokens_at(p) for p in pos])
        steps = max(1, min(max_jump, int(math.ceil(float(np.min(rem / tau))))))
        grow = steps * float(tau.sum())
        t += steps * model.step(rem.size, float(ctx.sum()) + grow / 2, z)
        rem -= steps * tau
        pos += steps * tau
        ctx += steps * tau
        keep = rem > 1e-9
        rem, pos, ctx = rem[keep], pos[keep], ctx[keep]
    return t


def _drain_start_state(
    now: float,
    in_flight: Sequence[tuple[float, float, float]],
    queued: Sequence[tuple[float, float]],
    concurrency: int,
    per_sequence_rate: float,
    startup_s: float,
) -> tuple[float, list[tuple[float, float, float]]]:
    """The closed loop at the steady per-sequence rate until the last queued request starts: that
    time and every running sequence's ``(remaining, position, prompt)`` then. Pure."""
    slots = [(now + max(0.0, r) / per_sequence_rate, r + p, pr) for r, p, pr in in_flight]
    slots += [(now, 0.0, 0.0)] * max(0, concurrency - len(slots))
    heapq.heapify(slots)
    t_last = now
    for length, prompt in queued:
        end, _, _ = heapq.heappop(slots)
        t_last = end + startup_s
        heapq.heappush(slots, (t_last + length / per_sequence_rate, float(length), float(prompt)))
    state = []
    for end, length, prompt in slots:
        remaining = (end - t_last) * per_sequence_rate
        if remaining > 0:
            state.append((remaining, length - remaining, prompt))
    return t_last, state


def full_run_throughput_bounds(
    *,
    now: float,
    t0: float,
    in_flight_remaining: Sequence[float],
    queued_lengths: Sequence[float],
    total_tokens: float,
    concurrency: int,
    steady_throughput: float,
    startup_s: float,
    step_model: StepTimeModel | None = None,
    in_flight_positions: Sequence[float] | None = None,
    in_flight_prompts: Sequence[float] | None = None,
    queued_prompts: Sequence[float] | None = None,
    z: float = 2.0,
) -> tuple[float, float]:
    """Bounds on the output throughput (tokens per unit of ``now``'s clock) of the whole run.

    Until the last request starts, the run goes on at the steady-state rate (each sequence at the
    steady per-sequence rate, closed loop). What is unknown is the final drain, when fewer than
    ``concurrency`` sequences are left and each runs faster than in the full batch.

    Without ``step_model`` the bounds are model-free and wide: every sequence keeps the steady
    per-sequence rate to the end (:func:`predict_full_run_end`), or the drain keeps the whole
    steady-state throughput. With a :class:`StepTimeModel` the drain is predicted step by step
    (:func:`predict_drain_end`) at ``z`` standard errors of the model's step times either way. With
    ``ignore_eos`` the remaining work is known exactly.
    """
    remaining = float(sum(in_flight_remaining) + sum(queued_lengths))
    if steady_throughput <= 0:
        return 0.0, 0.0
    rate = steady_throughput / concurrency
    if step_model is None:
        slow_end = predict_full_run_end(now, in_flight_remaining, queued_lengths, concurrency, rate, startup_s)
        fast_end = now + remaining / steady_throughput
    else:
        n = len(in_flight_remaining)
        flight = list(zip(in_flight_remaining, in_flight_positions or [0.0] * n, in_flight_prompts or [0.0] * n))
        queue = list(zip(queued_lengths, queued_prompts or [0.0] * len(queued_lengths)))
        start, state = _drain_start_state(now, flight, queue, concurrency, rate, startup_s)
        slow_end = predict_drain_end(start, state, step_model, z)
        fast_end = predict_drain_end(start, state, step_model, -z)
    low = total_tokens / (slow_end - t0) if slow_end > t0 else 0.0
    high = total_tokens / (fast_end - t0) if fast_end > t0 else 0.0
    return low, high


class _StreamStats:
    """What the step-time model is fitted on, accumulated online from the measured stream (O(1) per
    chunk): per time bin the mean gap between a request's chunks (~ one decode step), the running
    sequences and their total context at each chunk, the prompt tokens prefilled; per output-position
    bin the tokens per chunk. Times are the caller's (wall or sim-mapped) seconds."""

    def __init__(self, t0: float | None, bin_s: float, position_bin: float, n_position_bins: int = 32) -> None:
        self.t0 = t0
        self.bin_s = bin_s
        self.position_bin = max(1.0, position_bin)
        self.running = 0
        self.context = 0.0
        self.bins: list[list[float]] = []  # [sum gap, chunks, sum context, sum running, first tokens]
        self.pos_tokens = [0.0] * n_position_bins
        self.pos_chunks = [0.0] * n_position_bins

    def _bin(self, t: float) -> list[float]:
        if self.t0 is None:
            self.t0 = t  # bins start at the first token: token clocks (SimClock) can lag the wall clock
        i = max(0, int((t - self.t0) / self.bin_s))
        while len(self.bins) <= i:
            self.bins.append([0.0, 0.0, 0.0, 0.0, 0.0])
        return self.bins[i]

    def on_first_token(self, prompt_len: int, t: float) -> None:
        self.running += 1
        self.context += prompt_len
        self._bin(t)[4] += 1

    def on_chunk(self, position: float, t: float, n: float, gap: float | None) -> None:
        if gap is not None and gap > 0:
            b = self._bin(t)
            b[0] += gap
            b[1] += 1
            b[2] += self.context
            b[3] += self.running
            j = min(int(position / self.position_bin), len(self.pos_tokens) - 1)
            self.pos_tokens[j] += n
            self.pos_chunks[j] += 1
        self.context += n

    def on_finish(self, context: float) -> None:
        self.running -= 1
        self.context -= context

    def windows(self, now: float, concurrency: int) -> list[tuple[float, float, float, float]]:
        """Complete bins with (nearly) every slot decoding: ``(mean gap, mean context, prefills per
        step, chunks)``. A prefill costs a step much more than its share of tokens (a prefill reads
        all the weights), so it enters as a count: requests whose first token came in the bin."""
        if self.t0 is None:
            return []
        done = int((now - self.t0) / self.bin_s)
        out = []
        for gap, chunks, ctx, run, prefill in self.bins[:done]:
            if chunks < 2 * concurrency or run / chunks < concurrency - 1:
                continue
            mean_gap = gap / chunks
            steps = chunks / (run / chunks)
            if prefill / steps > 0.5:
                continue  # the ramp-up: prompts prefilled many per step, not one prefill per step
            out.append((mean_gap, ctx / chunks, prefill / steps, chunks))
        return out

    def positions(self) -> tuple[float, list[float]]:
        """Tokens per chunk by position bin (bins with no chunk take their nearest neighbour's)."""
        known = [(i, t / c) for i, (t, c) in enumerate(zip(self.pos_tokens, self.pos_chunks)) if c > 0]
        if not known:
            return self.position_bin, []
        out = [min(known, key=lambda kv: abs(kv[0] - i))[1] for i in range(len(self.pos_tokens))]
        return self.position_bin, out


PROBE_MIN_TOKENS = 96
"""The occupancy probe's shortest request: long enough that every probe request is decoding at once
for a while after the prefills (the full-occupancy level must be seen)."""
PROBE_SPAN_TOKENS = 768
"""The occupancy probe's longest request is this many tokens longer than its shortest."""


def occupancy_probe_lengths(concurrency: int, max_output_len: int) -> list[int]:
    """Output lengths of the occupancy probe's ``concurrency`` requests: staggered evenly so the
    running sequences fall from ``concurrency`` to 1 one at a time, a few steps per level. Pure."""
    lo = min(PROBE_MIN_TOKENS, max_output_len)
    span = max(0, min(PROBE_SPAN_TOKENS, max_output_len - lo))
    if concurrency <= 1:
        return [lo + span]
    return [lo + round(j * span / (concurrency - 1)) for j in range(concurrency)]
