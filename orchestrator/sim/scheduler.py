"""Continuous-batching scheduler shared by both drivers (virtual clock and scaled wall clock).

The scheduler knows nothing about time sources: :meth:`Scheduler.step` returns how long the
iteration takes in simulated seconds and what each sequence emitted. :func:`simulate_workload`
drives it with a virtual clock (no HTTP, no sleeping); the server drives it against the wall clock
divided by the time scale. One model, two drivers: calibration and serving cannot drift apart.

Admission (LMDeploy-like): FIFO; a request is admitted when the batch has room (``max_batch_size``)
and the KV cache has free blocks for its prompt + max output (+ draft slots). Reserving the whole
sequence up front is a simplification of LMDeploy's on-demand blocks with preemption; it keeps the
effect that matters (a small memory fraction caps concurrency, more so with long outputs and MTP).
Prompts are prefilled in chunks of at most ``max_prefill_tokens`` per iteration; a sequence emits its
first token when its prefill completes, then decodes ``1 + accepted drafts`` tokens per iteration.
A decode iteration in which any decoding sequence samples (temperature > 0) pays the profile's sampling
cost (:mod:`orchestrator.sim.model`); the scheduler keeps the count of such sequences as they start and
stop decoding, so a step costs no scan.
"""
from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from orchestrator.sim.model import (
    EngineParams,
    PerformanceModel,
    Profile,
    draw_emission,
    emission_schedule,
    load_profile,
)

__all__ = ["SimRequest", "StepResult", "Scheduler", "SimSummary", "simulate_workload", "make_request"]


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine. ``schedule`` is its per-step emission (drawn at creation)."""

    request_id: str
    prompt_tokens: int
    num_tokens: int  # tokens it will generate (max_tokens, or fewer if it samples EOS)
    schedule: list[int]
    arrival_time: float = 0.0
    # mutable engine state
    prefill_remaining: int = 0
    context: int = 0
    generated: int = 0
    step_index: int = 0
    blocks: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    payload: Any = None  # the server's per-request delivery queue
    sampled: bool = False  # temperature > 0: its decode steps take the engine's sampling path
    temperature: float = 0.0
    rng: Any = None  # an engine with a draft schedule draws each step's acceptance when the step runs

    def __post_init__(self) -> None:
        self.prefill_remaining = self.prompt_tokens


def make_request(model: PerformanceModel, request_id: str, prompt_tokens: int, max_tokens: int, *,
                 temperature: float = 0.0, ignore_eos: bool = True, seed: int = 0,
                 arrival_time: float = 0.0) -> SimRequest:
    """Draw a request's output length (EOS) and acceptance schedule from its own seeded RNG."""
    rng = np.random.default_rng(seed)
    num_tokens = max(1, int(max_tokens))
    if not ignore_eos and model.profile.eos_prob_per_token > 0:
        num_tokens = min(num_tokens, int(rng.geometric(model.profile.eos_prob_per_token)))
    if model.params.draft_schedule is not None:  # the draft length is known only when each step runs
        return SimRequest(request_id, max(1, int(prompt_tokens)), num_tokens, [], arrival_time,
                          sampled=float(temperature) > 0.0, temperature=float(temperature), rng=rng)
    schedule = emission_schedule(model.profile, model.n_draft, temperature, num_tokens, rng)
    return SimRequest(request_id, max(1, int(prompt_tokens)), num_tokens, schedule, arrival_time,
                      sampled=float(temperature) > 0.0)


@dataclass
class StepResult:
    duration: float
    emissions: list[tuple[SimRequest, int, bool]]  # (request, tokens emitted, finished)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    prefill_tokens: int = 0
    decode_seqs: int = 0


class Scheduler:
    """FIFO continuous batching over a :class:`PerformanceModel`."""

    def __init__(self, model: PerformanceModel, *, slowdown: Callable[[float], float] | None = None) -> None:
        """``slowdown``: a factor on each iteration's time by its simulated start (run-to-run variation,
        :meth:`orchestrator.sim.noise.EngineNoise.slowdown`); none: the model's times exactly."""
        self.model = model
        self.slowdown = slowdown
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self.decoding: list[SimRequest] = []
        self.total_blocks = model.kv_capacity_tokens // model.profile.block_size
        self.free_blocks = self.total_blocks
        self.decode_context = 0  # sum of context over decoding sequences
        self.decode_sampled = 0  # decoding sequences that sample (temperature > 0)

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def add(self, request: SimRequest) -> None:
        need = self.model.blocks_for(request.prompt_tokens + request.num_tokens + self.model.n_draft)
        if need > self.total_blocks:
            raise ValueError(
                f"request {request.request_id} needs {request.prompt_tokens + request.num_tokens} tokens of KV, "
                f"more than the whole cache ({self.model.kv_capacity_tokens})"
            )
        request.blocks = need
        self.waiting.append(request)

    def cancel(self, request: SimRequest) -> None:
        """Drop a request (client went away) and free its blocks."""
        if request in self.waiting:
            self.waiting.remove(request)
            return
        for group in (self.prefilling, self.decoding):
            if request in group:
                group.remove(request)
                self.free_blocks += request.blocks
                if group is self.decoding:
                    self.decode_context -= request.context
                    self.decode_sampled -= request.sampled
                return

    def step(self, now: float = 0.0) -> StepResult:
        """Run one iteration starting at simulated time ``now``; returns its duration and emissions."""
        model = self.model
        # 1. admission
        while self.waiting and self.num_running < model.max_batch_size and self.waiting[0].blocks <= self.free_blocks:
            req = self.waiting.popleft()
            self.free_blocks -= req.blocks
            self.prefilling.append(req)
        # 2. prefill (chunked)
        budget = model.params.max_prefill_tokens
        prefill_tokens, attention_work = 0, 0.0
        finished_prefill: list[SimRequest] = []
        for req in self.prefilling:
            if budget <= 0:
                break
            take = min(req.prefill_remaining, budget)
            budget -= take
            prefill_tokens += take
            attention_work += take * (req.context + take / 2)
            req.prefill_remaining -= take
            req.context += take
            if req.prefill_remaining == 0:
                finished_prefill.append(req)
        # 3. decode all decoding sequences
        n_seqs = len(self.decoding)
        duration = (model.prefill_time(prefill_tokens, attention_work)
                    + model.decode_time(n_seqs, self.decode_context, num_sampled=self.decode_sampled))
        if self.slowdown is not None:
            duration *= self.slowdown(now)
        end = now + duration
        result = StepResult(duration, [], prefill_tokens=prefill_tokens, decode_seqs=n_seqs)
        emissions = result.emissions
        n_draft = model.draft_tokens_at(n_seqs)
        scheduled = model.params.draft_schedule is not None
        if n_seqs:
            still: list[SimRequest] = []
            added = 0
            for req in self.decoding:
                e = draw_emission(model.profile, n_draft, req.temperature, req.generated, req.num_tokens - req.generated,
                                  req.rng) if scheduled else req.schedule[req.step_index]
                req.step_index += 1
                req.generated += e
                req.context += e
                added += e
                done = req.generated >= req.num_tokens
                emissions.append((req, e, done))
                if done:
                    req.finish_time = end
                    self.free_blocks += req.blocks
                    self.decode_sampled -= req.sampled
                else:
                    still.append(req)
            self.decoding = still
            if n_draft:
                result.drafts = n_seqs
                result.draft_tokens = n_seqs * n_draft
                result.accepted_tokens = added - n_seqs
            self.decode_context = sum(r.context for r in still)
        # 4. sequences whose prefill finished emit their first token and start decoding
        if finished_prefill:
            done_set = set(map(id, finished_prefill))
            self.prefilling = [r for r in self.prefilling if id(r) not in done_set]
            for req in finished_prefill:
                req.generated = 1
                req.context += 1
                req.first_token_time = end
                done = req.num_tokens <= 1
                emissions.append((req, 1, done))
                if done:
                    req.finish_time = end
                    self.free_blocks += req.blocks
                else:
                    self.decoding.append(req)
                    self.decode_context += req.context
                    self.decode_sampled += req.sampled
        return result


@dataclass(frozen=True)
class SimSummary:
    """What a benchmark client would measure, in simulated time (sglang bench_serving meanings)."""

    output_throughput: float
    request_throughput: float
    accept_length: float | None
    tpot_ms_median: float
    tpot_ms_mean: float
    ttft_ms_median: float
    ttft_ms_mean: float
    e2e_ms_median: float
    duration_s: float
    completed: int
    total_input_tokens: int
    total_output_tokens: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    mean_running: float
    kv_capacity_tokens: int
    steps: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getitem__(self, key: str) -> Any:  # dict-like access, as CONTRACTS describes a dict
        return getattr(self, key)


def _random_lengths(rng: np.random.Generator, length: int, range_ratio: float, n: int) -> np.ndarray:
    """sglang's random dataset: uniform integers in ``[max(int(L*ratio), 1), L]``."""
    lo = max(int(length * range_ratio), 1)
    return rng.integers(lo, length + 1, size=n)


def simulate_workload(profile: Profile | str, num_draft_tokens: int = 0, memory_fraction: float = 0.8,
                      max_batch_size: int | None = None, input_len: int = 1024, output_len: int = 1024,
                      range_ratio: float = 0.5, num_prompts: int = 256, concurrency: int | None = 64,
                      temperature: float = 0.0, seed: int = 0, *, tp: int | None = None,
                      max_prefill_tokens: int = 8192, session_len: int | None = None,
                      ignore_eos: bool = True, params: EngineParams | None = None) -> SimSummary:
    """Run a closed-loop benchmark (``concurrency`` clients, each sending its next request when the
    previous finishes) through the same :class:`Scheduler` the server uses, on a virtual clock.

    Raises :class:`~orchestrator.sim.model.SimOutOfMemory` where the real engine would OOM at start.
    """
    if isinstance(profile, str):
        profile = load_profile(profile)
    if params is None:
        params = EngineParams(tp=tp or profile.num_gpus, num_draft_tokens=num_draft_tokens,
                              memory_fraction=memory_fraction, max_batch_size=max_batch_size,
                              session_len=session_len, max_prefill_tokens=max_prefill_tokens)
    model = PerformanceModel(profile, params)
    sched = Scheduler(model)
    rng = np.random.default_rng(seed)
    inputs = _random_lengths(rng, input_len, range_ratio, num_prompts)
    outputs = _random_lengths(rng, output_len, range_ratio, num_prompts)
    seeds = rng.integers(0, 2**63 - 1, size=num_prompts)
    conc = num_prompts if concurrency is None else min(concurrency, num_prompts)

    requests: list[SimRequest] = []
    next_index = 0

    def submit(at: float) -> None:
        nonlocal next_index
        i = next_index
        next_index += 1
        req = make_request(model, f"sim-{i}", int(inputs[i]), int(outputs[i]), temperature=temperature,
                           ignore_eos=ignore_eos, seed=int(seeds[i]), arrival_time=at)
        sched.add(req)
        requests.append(req)

    for _ in range(conc):
        submit(0.0)
    now, steps, running_sum = 0.0, 0, 0
    drafts = draft_tokens = accepted = 0
    while sched.has_work():
        running_sum += sched.num_running
        res = sched.step(now)
        steps += 1
        now += res.duration
        drafts += res.drafts
        draft_tokens += res.draft_tokens
        accepted += res.accepted_tokens
        for _req, _n, done in res.emissions:
            if done and next_index < num_prompts:
                submit(now)
        if res.duration == 0.0 and not res.emissions:  # nothing fits: would loop forever
            raise RuntimeError("scheduler made no progress: a request cannot be admitted (KV cache too small)")

    tpots = [(r.finish_time - r.first_token_time) / (r.num_tokens - 1) * 1e3 for r in requests if r.num_tokens > 1]
    ttfts = [(r.first_token_time - r.arrival_time) * 1e3 for r in requests]
    e2es = [(r.finish_time - r.arrival_time) * 1e3 for r in requests]
    total_out = sum(r.num_tokens for r in requests)
    return SimSummary(
        output_throughput=total_out / now,
        request_throughput=len(requests) / now,
        accept_length=(1 + accepted / drafts) if drafts else None,
        tpot_ms_median=statistics.median(tpots) if tpots else 0.0,
        tpot_ms_mean=statistics.fmean(tpots) if tpots else 0.0,
        ttft_ms_median=statistics.median(ttfts),
        ttft_ms_mean=statistics.fmean(ttfts),
        e2e_ms_median=statistics.median(e2es),
        duration_s=now,
        completed=len(requests),
        total_input_tokens=int(sum(r.prompt_tokens for r in requests)),
        total_output_tokens=int(total_out),
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        mean_running=running_sum / max(steps, 1),
        kv_capacity_tokens=model.kv_capacity_tokens,
        steps=steps,
    )
