"""The simulator's performance and acceptance model: PURE (no I/O except reading a profile JSON).

Why a model rather than a replay table: the tuner searches draft counts, memory fractions and batch
sizes that nobody measured, so the simulator must *extrapolate plausibly* while reproducing the one
published table exactly enough (MTP on/off ratio within ±10%, accept length within ±0.15 per bucket).

Step-time model (one engine iteration, seconds)::

    decode(n seqs, total context C, N drafts) =
        (weight bytes read + KV bytes read) / (tp * HBM bandwidth * eff_bw)       # memory-bound part
      + tokens * 2 * active_params / (tp * FLOP/s * eff_flops)                    # per-token compute
      + attention FLOPs over the context / same                                   # grows with context
      + fixed overhead + n * per-sequence overhead                                 # host side: launches, sampling
      + N * (one MTP-layer draft step: its weights + its KV, one token per sequence) + overheads
      + [any sequence samples] * sampling_overhead_ms                              # host: eager sampler kernels
      - host_overlap * min(host part, GPU part)                                    # host work hidden behind GPU

    prefill(t tokens) = weights / bandwidth + FLOPs / prefill FLOP/s + fixed overhead + t * per-token overhead

Host/GPU overlap (``host_overlap``, 0..1, default 0): the share of the smaller of a decode step's two parts
-- the GPU part (the memory, compute and draft-layer terms) and the host part (every ``*_overhead_ms`` term
of the step: fixed, per sequence, verification, per draft pass, sampling) -- that runs concurrently with the other, so
the step is ``gpu + host - host_overlap * min(host, gpu)``: the plain sum at 0, ``max(host, gpu)`` at 1.
Why: LMDeploy's PyTorch engine pipelines its forwards -- ``EngineLoop._main_loop_get_outputs`` prefetches
(schedules and builds) the next forward's inputs before awaiting the current one's output, the model agent
copies inputs on a separate stream and takes a decode step's inputs as a delta of the previous step's on-GPU
state (the next step launches without the tokens coming back to the host first), decode runs as captured CUDA
graphs, and ``get_output_async`` polls a CUDA event instead of blocking. How much of the host work that hides
is the engine's and the load's to decide, so a profile fits it; 0 (every profile fitted before the constant
existed) keeps the sum. The MTP step (draft passes + verification) is one engine forward and one pipelined
unit, so its parts are summed over the whole step before the overlap applies. Prefill stays a sum: a
prefill forward's inputs are built whole on the host (not a delta) and it runs eagerly (no CUDA graph), and
no measurement so far could tell a prefill overlap from a smaller prefill overhead (the testbed's prompts
are all one length); the scheduler adds a prefill to the decode of the same iteration, whose own overlap
applies to the decode part.

Sampling cost (``sampling_overhead_ms``, default 0): a decode step in which any sequence samples (temperature
> 0) costs that much more HOST time than a greedy one. LMDeploy's PyTorch sampler
(``lmdeploy/pytorch/engine/logits_process.py``, ``FusedLogitsProcessor.sampling``) takes one ``argmax`` when every
sequence of the batch is greedy (``max_top_k == 1``) and otherwise, for the whole batch, ``topk`` (or a full
sort) over the vocabulary, top-p/min-p masks, a softmax and a multinomial draw; with MTP the same choice covers
all ``N + 1`` verified positions (``spec_decode/reject_sampler.py``: argmax when all are greedy, else the bonus
position sampled so and the drafts through a rejection kernel). Read in ``InternLM/lmdeploy``'s newest stored
source, not 0.18's own. Those are a chain of eager kernels outside the decode CUDA graph plus per-step tensors
built in Python: launch-bound work, hence host time, which the pipelined loop can hide behind GPU work like the other
``*_overhead_ms`` (``host_overlap``). One fixed term, no cost per scored row (the kernels' GPU time over the
vocabulary): the testbed's cells show the cost at low load and little of it at 16-64 in flight. The engine calls a
batch greedy when every ``top_k`` is 1 (temperature 0 sets it); the simulator decides by temperature alone, so a
request with temperature > 0 and ``top_k`` 1 pays here and not in the engine. The scheduler passes how many decoding sequences sample; with none the term is not added, so greedy steps
are unchanged bit for bit. Prefill's first token is not charged (one sampler call against a prompt's forward).

Engines (``EngineParams.backend``): the profile's constants describe LMDeploy's PyTorch engine. A
profile may carry a ``turbomind`` section: the constants that differ for LMDeploy's TurboMind engine
(no speculation at all), with what they were fitted on. TurboMind is a C++ loop around the same kind
of kernels, so what differs physically is host-side work per step (launches, scheduling, sampling):
the overhead terms. Where the step is GPU-bound those terms are a small share and the engines come
close; where it is launch-bound (a tiny model) they are the step.

MoE is explicit: dense (attention, shared expert, embeddings) weights are read every step; routed
expert weights are read only for experts that some token in the step touches. With ``t`` tokens
routed independently over ``E`` experts, top-``k`` each, the touched share is
``1 - (1 - k/E) ** (t * routing_spread)`` (``routing_spread`` < 1: real routing is correlated).
Speculative verification runs ``N + 1`` positions per sequence; positions of one sequence route
alike, so they count as ``1 + N * verify_route_novelty`` independent tokens. That is why MTP's
verification costs more than "free compute" on a MoE model: it touches more experts.

Acceptance model: the draft at depth ``k`` (1-based) is accepted with conditional probability
``sigmoid(logit(p0) + log_slope * ln(1 + pos / pos_scale) - temperature_slope * T - depth_penalty * (k - 1))``
-- logistic in log-position: it rises with output position (long outputs settle into predictable
text, as the published accept lengths 2.97 @1024 ... 3.63 @16000 show), falls with temperature and
with draft depth -- and only if drafts ``1..k-1`` were accepted (chain).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from orchestrator.config import TURBOMIND_HAS_NO_SPECULATION
from orchestrator.errors import ConfigError, OrchestratorError

__all__ = [
    "BACKEND_CONSTANTS",
    "SIM_BACKENDS",
    "PROFILES_DIR",
    "DEFAULT_PROFILE",
    "Profile",
    "EngineParams",
    "PerformanceModel",
    "SimModelError",
    "SAMPLING_CONSTANTS",
    "load_profile",
    "list_profiles",
    "accept_distribution",
    "emission_schedule",
    "expected_accept_length",
]

PROFILES_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "intern-s2-preview-8xh200"
_PROFILE_SECTIONS = ("architecture", "mtp", "hardware", "fitted", "acceptance")
_POS_BIN = 16  # acceptance tables are tabulated every 16 output positions (smooth in position)

SIM_BACKENDS = ("pytorch", "turbomind", "vllm")
"""The engines a profile can describe: its own constants are LMDeploy's PyTorch engine's; a section
named after another engine holds that engine's constants."""

SAMPLING_CONSTANTS = ("sampling_overhead_ms",)
"""A profile's sampling-cost constants (module docstring): non-negative, default 0 (no cost)."""

BACKEND_CONSTANTS = ("eff_bandwidth", "eff_decode_flops", "eff_prefill_flops", "decode_overhead_ms",
                     "decode_overhead_per_seq_ms", "prefill_overhead_ms", "prefill_overhead_per_token_us",
                     "host_overlap", *SAMPLING_CONSTANTS)
"""Constants a profile's ``turbomind`` or ``vllm`` section may set (one it leaves out is the PyTorch engine's);
everything else (architecture, memory, acceptance) is the model's and the GPU's, the same under either
engine. The sampling constants are among them: TurboMind samples with its own kernels."""

_BACKEND_NOTES = ("fitted_on", "notes")  # a backend section's documentation keys


class SimModelError(OrchestratorError, ValueError):
    """A profile or engine parameter is invalid; the message says which and what is allowed."""


class SimOutOfMemory(SimModelError):
    """The engine would run out of GPU memory at start (the message reads like the real engine's)."""


@dataclass(frozen=True, eq=False)  # hashed by identity: profiles key lru caches
class Profile:
    """One model on one GPU type: architecture, hardware and the fitted constants.

    Loaded from ``profiles/<name>.json`` (sections flattened); fields are described in the module docstring
    and ``orchestrator/sim/README.md``, and in attribute docstrings below where they were added later.
    """

    name: str
    notes: str
    calibrated: bool
    # architecture
    dense_params_b: float
    expert_params_b: float
    num_experts: int
    experts_per_token: int
    weight_bytes_per_param: float
    kv_bytes_per_token: float
    state_bytes_per_seq: float
    attn_flops_per_token_ctx: float
    max_context: int
    default_session_len: int
    # MTP draft layer
    mtp_dense_params_b: float
    mtp_expert_params_b: float
    mtp_kv_bytes_per_token: float
    mtp_memory_overhead_gb: float
    # hardware (per GPU)
    num_gpus: int
    gpu_memory_gb: float
    reserved_memory_gb: float
    hbm_tbps: float
    tflops: float
    # fitted efficiencies and overheads
    eff_bandwidth: float
    eff_decode_flops: float
    eff_prefill_flops: float
    routing_spread: float
    verify_route_novelty: float
    decode_overhead_ms: float
    prefill_overhead_ms: float
    draft_overhead_ms: float
    mtp_verify_overhead_ms: float
    mtp_prefill_overhead_ms: float
    # acceptance
    accept_p0: float
    accept_log_slope: float
    accept_pos_scale: float
    accept_depth_penalty: float
    accept_temperature_slope: float
    eos_prob_per_token: float
    # limits
    safe_max_memory_fraction: float
    safe_max_memory_fraction_mtp: float
    default_max_batch_size: int
    block_size: int = 64
    # host-side overheads that grow with the batch (0 where the fit folded them into the efficiencies)
    decode_overhead_per_seq_ms: float = 0.0
    prefill_overhead_per_token_us: float = 0.0
    host_overlap: float = 0.0
    """Share (0..1) of the smaller of a decode step's host and GPU parts hidden behind the other (module
    docstring); 0 sums them."""
    sampling_overhead_ms: float = 0.0
    """Host milliseconds a decode step costs more when any of its sequences samples (temperature > 0): the
    sampler's eager kernels over the vocabulary and their inputs (module docstring). 0: sampling is free."""
    backend: str = "pytorch"
    """The engine these constants describe (set by :meth:`for_backend`, never by the profile file)."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        overlap = self.host_overlap
        if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0.0 <= overlap <= 1.0:
            raise SimModelError(f"profile {self.name!r}: host_overlap={overlap!r}; allowed: a number in 0..1 "
                                "(the share of the smaller of a decode step's host and GPU parts hidden behind "
                                "the other; 0 adds them)")
        for name in SAMPLING_CONSTANTS:
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or value < 0):
                raise SimModelError(f"profile {self.name!r}: {name}={value!r}; allowed: a finite number >= 0 "
                                    "(the decode step's extra cost when a sequence samples; 0: none)")

    @property
    def total_params_b(self) -> float:
        return self.dense_params_b + self.expert_params_b

    @property
    def active_params_b(self) -> float:
        return self.dense_params_b + self.expert_params_b * self.experts_per_token / self.num_experts

    @property
    def mtp_active_params_b(self) -> float:
        return self.mtp_dense_params_b + self.mtp_expert_params_b * self.experts_per_token / self.num_experts

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        flat: dict[str, Any] = {}
        for section, value in data.items():
            if isinstance(value, dict) and section in _PROFILE_SECTIONS:
                flat.update(value)
            else:
                flat[section] = value
        known = {f.name for f in fields(cls)}
        extra = {k: v for k, v in flat.items() if k not in known}
        # keys that only document (e.g. "fields", "published") are kept aside, never silently used
        kwargs = {k: v for k, v in flat.items() if k in known and k != "backend"}
        missing = sorted(f.name for f in fields(cls)
                         if f.name not in kwargs and f.default is MISSING and f.default_factory is MISSING)
        if missing:
            raise SimModelError(f"profile {flat.get('name', '?')!r} lacks field(s) {missing}")
        kwargs["extra"] = extra
        return cls(**kwargs)

    def replace(self, **changes: Any) -> Profile:
        return dataclasses.replace(self, **changes)

    def for_backend(self, backend: str) -> Profile:
        """This profile under LMDeploy engine ``backend`` (``pytorch``: itself; ``turbomind``: with its
        ``turbomind`` section's constants). Cached, so equal requests share acceptance tables."""
        return _for_backend(self, backend)

    @property
    def backends(self) -> tuple[str, ...]:
        """The engines this profile has constants for."""
        return tuple(b for b in SIM_BACKENDS if b == "pytorch" or isinstance(self.extra.get(b), dict))


@functools.lru_cache(maxsize=32)
def _for_backend(profile: Profile, backend: str) -> Profile:
    if backend not in SIM_BACKENDS:
        raise SimModelError(f"backend {backend!r} is invalid; allowed: {list(SIM_BACKENDS)}")
    if backend == profile.backend:
        return profile
    if profile.backend != "pytorch":
        raise SimModelError(f"profile {profile.name!r} already describes {profile.backend!r}; derive other engines "
                            "from the profile as loaded")
    section = profile.extra.get(backend)
    if not isinstance(section, dict):
        raise SimModelError(
            f"profile {profile.name!r} has no {backend!r} section, so it cannot simulate that engine; "
            f"its engines: {list(profile.backends)}"
        )
    unknown = sorted(set(section) - set(BACKEND_CONSTANTS) - set(_BACKEND_NOTES))
    if unknown:
        raise SimModelError(f"profile {profile.name!r}: {backend!r} section sets {unknown}; allowed: "
                            f"{list(BACKEND_CONSTANTS)} (and {list(_BACKEND_NOTES)} as documentation)")
    if "fitted_on" not in section:
        raise SimModelError(f"profile {profile.name!r}: the {backend!r} section must say what it was fitted on "
                            "('fitted_on')")
    changed = {k: float(v) for k, v in section.items() if k in BACKEND_CONSTANTS}
    return profile.replace(backend=backend, **changed)


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


@functools.lru_cache(maxsize=32)
def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    """A profile by shipped name (``intern-s2-preview-8xh200``) or by path to a JSON file."""
    path = Path(name_or_path)
    if not (path.suffix == ".json" and path.exists()):
        path = PROFILES_DIR / f"{name_or_path}.json"
    if not path.exists():
        raise SimModelError(
            f"simulator profile {name_or_path!r} not found; shipped profiles: {list_profiles()} "
            f"(or pass a path to a profile JSON file)"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SimModelError(f"profile {path} is not valid JSON: {exc}") from None
    return Profile.from_dict(data)


@dataclass(frozen=True)
class EngineParams:
    """The engine knobs the simulator honours (same meaning as LMDeploy's flags)."""

    tp: int = 8
    num_draft_tokens: int = 0
    memory_fraction: float = 0.8
    max_batch_size: int | None = None
    session_len: int | None = None
    max_prefill_tokens: int = 8192
    backend: str = "pytorch"
    """The engine simulated: ``pytorch``, ``turbomind`` (no speculation) or ``vllm``."""
    draft_schedule: tuple[tuple[int, int, int], ...] | None = None
    """vLLM's draft length per batch size (``num_speculative_tokens_per_batch_size``): each decode step
    drafts the length of the range its batch size falls in (0: no drafting); ``num_draft_tokens`` is the
    longest, which sizes memory as vLLM's buffers do."""

    def __post_init__(self) -> None:
        if self.backend not in SIM_BACKENDS:
            raise SimModelError(f"backend={self.backend!r}; allowed: {list(SIM_BACKENDS)}")
        if self.draft_schedule is not None:
            from orchestrator.backends.vllm import check_draft_schedule

            if self.backend != "vllm":
                raise SimModelError(f"a draft schedule needs backend vllm, not {self.backend!r}")
            try:
                object.__setattr__(self, "draft_schedule", check_draft_schedule(self.draft_schedule,
                                                                                self.num_draft_tokens))
            except ConfigError as exc:
                raise SimModelError(str(exc)) from None
        if self.backend == "turbomind" and self.num_draft_tokens:
            raise SimModelError(f"speculative decoding with backend turbomind: {TURBOMIND_HAS_NO_SPECULATION}")
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise SimModelError(f"tp={self.tp!r}; allowed: integer >= 1")
        if not (isinstance(self.num_draft_tokens, int) and 0 <= self.num_draft_tokens <= 8):
            raise SimModelError(f"num_draft_tokens={self.num_draft_tokens!r}; allowed: 0..8")
        if not (0.0 < float(self.memory_fraction) <= 0.99):
            raise SimModelError(f"memory_fraction={self.memory_fraction!r}; allowed: (0, 0.99]")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise SimModelError(f"max_batch_size={self.max_batch_size!r}; allowed: >= 1")
        if self.session_len is not None and self.session_len < 16:
            raise SimModelError(f"session_len={self.session_len!r}; allowed: >= 16")
        if self.max_prefill_tokens < 16:
            raise SimModelError(f"max_prefill_tokens={self.max_prefill_tokens!r}; allowed: >= 16")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


@functools.lru_cache(maxsize=64)
def _accept_table(profile: Profile, num_draft_tokens: int, temperature: float) -> tuple[tuple[float, ...], ...]:
    """``table[pos // 16][k-1]`` = P(drafts 1..k all accepted) at that output position."""
    rows = []
    n_bins = min(profile.max_context, 65536) // _POS_BIN + 2  # saturated well before 64k
    for b in range(n_bins):
        pos = b * _POS_BIN + _POS_BIN / 2
        base = (_logit(profile.accept_p0) + profile.accept_log_slope * math.log1p(pos / profile.accept_pos_scale)
                - profile.accept_temperature_slope * temperature)
        cum, row = 1.0, []
        for k in range(num_draft_tokens):
            cum *= _sigmoid(base - profile.accept_depth_penalty * k)
            row.append(cum)
        rows.append(tuple(row))
    return tuple(rows)


def accept_distribution(profile: Profile, num_draft_tokens: int, temperature: float, pos: int) -> tuple[float, ...]:
    """``P(A = k)``, k = 0..N: the drafts one decode step accepts at output position ``pos`` (what a
    measurement model of the engine's counters needs beside the mean)."""
    row = _accept_table(profile, num_draft_tokens, round(float(temperature), 3))
    at_least = (1.0, *row[min(max(pos, 0) // _POS_BIN, len(row) - 1)])
    return tuple(at_least[k] - (at_least[k + 1] if k < num_draft_tokens else 0.0) for k in range(num_draft_tokens + 1))


def emission_schedule(profile: Profile, num_draft_tokens: int, temperature: float, num_tokens: int, rng: Any) -> list[int]:
    """Tokens emitted by each decode step of one sequence after its first (prefill) token.

    ``sum(result) == num_tokens - 1``; each entry is ``1 + accepted drafts`` (capped at the end so the
    sequence never exceeds ``num_tokens``). Acceptance depends only on the sequence's own position and
    temperature, so the schedule is drawn once per request from its own seeded ``rng`` (numpy Generator).
    """
    remaining = num_tokens - 1
    if remaining <= 0:
        return []
    if num_draft_tokens == 0:
        return [1] * remaining
    table = _accept_table(profile, num_draft_tokens, round(float(temperature), 3))
    last = len(table) - 1
    draws = rng.random(remaining).tolist()
    out: list[int] = []
    pos, j = 1, 0
    while remaining > 0:
        row = table[min(pos // _POS_BIN, last)]
        v = draws[j]
        j += 1
        a = 0
        for c in row:
            if v < c:
                a += 1
            else:
                break
        e = a + 1 if a + 1 < remaining else remaining
        out.append(e)
        remaining -= e
        pos += e
    return out


def draw_emission(profile: Profile, num_draft_tokens: int, temperature: float, pos: int, remaining: int,
                  rng: Any) -> int:
    """Tokens one decode step emits for a sequence at output position ``pos`` drafting ``num_draft_tokens``
    (``1 + accepted``, capped at ``remaining``): one step of :func:`emission_schedule`, drawn when the
    step runs, for an engine whose draft length changes with the batch (a draft schedule)."""
    if num_draft_tokens == 0 or remaining <= 1:
        return min(1, remaining)
    table = _accept_table(profile, num_draft_tokens, round(float(temperature), 3))
    row = table[min(pos // _POS_BIN, len(table) - 1)]
    v = rng.random()
    a = 0
    for c in row:
        if v < c:
            a += 1
        else:
            break
    return min(a + 1, remaining)


def expected_accept_length(profile: Profile, num_draft_tokens: int, temperature: float, output_len: int,
                           range_ratio: float = 0.5) -> float:
    """Analytic accept length (1 + accepted/drafts) for the random dataset's output-length bucket.

    Steps are spent at position ``pos`` at rate ``1 / (1 + a(pos))``, so the accept length is the
    harmonic mean of ``1 + a(pos)`` over positions, weighted by how many requests reach ``pos``.
    Used to fit the acceptance constants quickly; the simulator samples instead.
    """
    if num_draft_tokens == 0:
        return 1.0
    table = _accept_table(profile, num_draft_tokens, round(float(temperature), 3))
    lo = max(int(output_len * range_ratio), 1)
    tokens = steps = 0.0
    for b in range(0, output_len // _POS_BIN + 1):
        pos = b * _POS_BIN + _POS_BIN / 2
        reach = min(1.0, max(0.0, (output_len - pos) / max(output_len - lo, 1)))
        if reach <= 0:
            break
        a = sum(table[min(b, len(table) - 1)])
        tokens += reach
        steps += reach / (1 + a)
    return tokens / steps if steps else 1.0


class PerformanceModel:
    """Step times and memory capacity of one engine (a profile with engine parameters)."""

    def __init__(self, profile: Profile, params: EngineParams) -> None:
        self.profile = profile = profile.for_backend(params.backend)
        self.params = params
        pr = profile
        self.n_draft = params.num_draft_tokens
        self.bandwidth = params.tp * pr.hbm_tbps * 1e12 * pr.eff_bandwidth
        self.decode_flops = params.tp * pr.tflops * 1e12 * pr.eff_decode_flops
        self.prefill_flops = params.tp * pr.tflops * 1e12 * pr.eff_prefill_flops
        self.bpp = pr.weight_bytes_per_param
        self.route_miss = 1.0 - pr.experts_per_token / pr.num_experts
        self.max_batch_size = params.max_batch_size or pr.default_max_batch_size
        self.kv_bytes_per_token = pr.kv_bytes_per_token + (pr.mtp_kv_bytes_per_token if self.n_draft else 0.0)
        self.session_len = params.session_len or min(pr.default_session_len, pr.max_context)
        self.kv_capacity_tokens = self._kv_capacity()  # raises SimOutOfMemory

    # ----- memory ---------------------------------------------------------------------------------
    def memory_report(self) -> dict[str, float]:
        pr, p = self.profile, self.params
        total = p.tp * pr.gpu_memory_gb * 1e9
        weights = pr.total_params_b * 1e9 * self.bpp
        mtp = (pr.mtp_dense_params_b + pr.mtp_expert_params_b) * 1e9 * self.bpp + pr.mtp_memory_overhead_gb * 1e9 * p.tp if self.n_draft else 0.0
        reserved = p.tp * pr.reserved_memory_gb * 1e9
        states = self.max_batch_size * pr.state_bytes_per_seq
        free = total - weights - mtp - reserved - states
        return {"total_bytes": total, "weight_bytes": weights, "mtp_bytes": mtp, "reserved_bytes": reserved,
                "state_bytes": states, "free_bytes": free}

    def _kv_capacity(self) -> int:
        pr, p = self.profile, self.params
        safe = pr.safe_max_memory_fraction_mtp if self.n_draft else pr.safe_max_memory_fraction
        mem = self.memory_report()
        per_gpu_weights = (mem["weight_bytes"] + mem["mtp_bytes"]) / p.tp / 1e9
        if mem["free_bytes"] <= 0:
            raise SimOutOfMemory(
                f"CUDA out of memory: weights need {per_gpu_weights:.1f} GB per GPU on {p.tp} GPU(s) of "
                f"{pr.gpu_memory_gb:.0f} GB (+{pr.reserved_memory_gb:.0f} GB reserved, {self.max_batch_size} "
                f"sequence states); use more GPUs (--tp) or a smaller --max-batch-size"
            )
        if p.memory_fraction > safe:
            raise SimOutOfMemory(
                f"CUDA out of memory: --cache-max-entry-count {p.memory_fraction:g} leaves too little memory for "
                f"activations{' and MTP draft buffers' if self.n_draft else ''} (profile's safe max is {safe:g}); "
                f"lower --cache-max-entry-count"
            )
        capacity = int(mem["free_bytes"] * p.memory_fraction / self.kv_bytes_per_token)
        capacity -= capacity % pr.block_size
        if capacity < self.session_len:
            raise SimOutOfMemory(
                f"CUDA out of memory: KV cache holds {capacity} tokens at --cache-max-entry-count "
                f"{p.memory_fraction:g}, less than one sequence of --session-len {self.session_len}; raise "
                f"--cache-max-entry-count or lower --session-len"
            )
        return capacity

    # ----- step times (seconds) ---------------------------------------------------------------
    def draft_tokens_at(self, num_seqs: int) -> int:
        """Tokens each sequence drafts in a decode step of ``num_seqs`` sequences: the draft schedule's
        range for that batch size (past its last range: the last one's), else ``num_draft_tokens``."""
        schedule = self.params.draft_schedule
        if schedule is None:
            return self.n_draft
        return next((k for lo, hi, k in schedule if lo <= num_seqs <= hi), schedule[-1][2])

    def _coverage(self, independent_tokens: float) -> float:
        return 1.0 - self.route_miss ** (independent_tokens * self.profile.routing_spread)

    def decode_time(self, num_seqs: int, total_context: int, *, num_sampled: int = 0) -> float:
        """One decode (or verify) step of ``num_seqs`` sequences holding ``total_context`` KV tokens, of which
        ``num_sampled`` sample (temperature > 0): its GPU and host parts added, less the profile's
        ``host_overlap`` of the smaller one."""
        total, gpu, host = self._decode_terms(num_seqs, total_context, num_sampled)
        return total - self.profile.host_overlap * min(gpu, host)

    def decode_parts(self, num_seqs: int, total_context: int, *, num_sampled: int = 0) -> tuple[float, float]:
        """``(gpu, host)`` seconds of one decode step (draft passes, verification and sampling included),
        before any overlap: what :meth:`decode_time` combines."""
        _, gpu, host = self._decode_terms(num_seqs, total_context, num_sampled)
        return gpu, host

    def _decode_terms(self, num_seqs: int, total_context: int, num_sampled: int = 0) -> tuple[float, float, float]:
        """(GPU + host, GPU, host) seconds of a decode step; the sum is added term by term in the order the
        additive model always used, so ``host_overlap`` 0 gives every existing profile's step bit for bit,
        and the sampling term comes last (added only when a sequence samples), so greedy steps too."""
        if isinstance(num_sampled, bool) or not isinstance(num_sampled, int) or not 0 <= num_sampled <= num_seqs:
            raise SimModelError(f"num_sampled={num_sampled!r}; allowed: an integer in 0..num_seqs ({num_seqs})")
        if num_seqs == 0:
            return 0.0, 0.0, 0.0
        n = self.draft_tokens_at(num_seqs)
        gpu, host = self._decode_main_parts(num_seqs, total_context, n)
        total = gpu + host
        if n:
            verify = self.profile.mtp_verify_overhead_ms / 1e3
            draft_gpu, draft_host = self._draft_parts(num_seqs, total_context)
            total += verify + n * (draft_gpu + draft_host)
            gpu += n * draft_gpu
            host += verify + n * draft_host
        if num_sampled:  # the whole batch takes the sampled path once one sequence samples (module docstring)
            sample = self.profile.sampling_overhead_ms / 1e3
            total += sample
            host += sample
        return total, gpu, host

    def _decode_main_parts(self, num_seqs: int, total_context: int, n: int) -> tuple[float, float]:
        """The target model's forward of a decode step verifying ``n`` drafts per sequence: (GPU seconds,
        host seconds)."""
        pr = self.profile
        tokens = num_seqs * (n + 1)
        routed = num_seqs * (1 + n * pr.verify_route_novelty)
        weight_bytes = (pr.dense_params_b + pr.expert_params_b * self._coverage(routed)) * 1e9 * self.bpp
        kv_bytes = pr.kv_bytes_per_token * total_context + pr.state_bytes_per_seq * num_seqs
        flops = tokens * 2 * pr.active_params_b * 1e9 + pr.attn_flops_per_token_ctx * (n + 1) * total_context
        gpu = (weight_bytes + kv_bytes) / self.bandwidth + flops / self.decode_flops
        return gpu, (pr.decode_overhead_ms + pr.decode_overhead_per_seq_ms * num_seqs) / 1e3

    def draft_step_time(self, num_seqs: int, total_context: int) -> float:
        """One autoregressive step of the MTP draft layer (one token per sequence), GPU and host added (the
        overlap applies to the whole decode step, :meth:`decode_time`)."""
        gpu, host = self._draft_parts(num_seqs, total_context)
        return gpu + host

    def _draft_parts(self, num_seqs: int, total_context: int) -> tuple[float, float]:
        pr = self.profile
        weight_bytes = (pr.mtp_dense_params_b + pr.mtp_expert_params_b * self._coverage(num_seqs)) * 1e9 * self.bpp
        kv_bytes = pr.mtp_kv_bytes_per_token * total_context
        flops = num_seqs * 2 * pr.mtp_active_params_b * 1e9
        return (weight_bytes + kv_bytes) / self.bandwidth + flops / self.decode_flops, pr.draft_overhead_ms / 1e3

    def prefill_time(self, num_tokens: int, attention_work: float) -> float:
        """A prefill iteration of ``num_tokens`` prompt tokens; ``attention_work`` = sum of token*context."""
        if num_tokens == 0:
            return 0.0
        pr = self.profile
        weight_bytes = (pr.dense_params_b + pr.expert_params_b * self._coverage(num_tokens)) * 1e9 * self.bpp
        flops = num_tokens * 2 * pr.active_params_b * 1e9 + pr.attn_flops_per_token_ctx * attention_work
        t = weight_bytes / self.bandwidth + flops / self.prefill_flops + pr.prefill_overhead_ms / 1e3
        t += pr.prefill_overhead_per_token_us * num_tokens / 1e6
        if self.n_draft:
            mtp_bytes = (pr.mtp_dense_params_b + pr.mtp_expert_params_b * self._coverage(num_tokens)) * 1e9 * self.bpp
            t += mtp_bytes / self.bandwidth + num_tokens * 2 * pr.mtp_active_params_b * 1e9 / self.prefill_flops
            t += pr.mtp_prefill_overhead_ms / 1e3
        return t

    def blocks_for(self, num_tokens: int) -> int:
        bs = self.profile.block_size
        return -(-num_tokens // bs)

    def describe(self) -> dict[str, Any]:
        mem = self.memory_report()
        return {
            "backend": self.params.backend,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "max_batch_size": self.max_batch_size,
            "session_len": self.session_len,
            "num_draft_tokens": self.n_draft,
            "memory_gb": {k.removesuffix("_bytes"): round(v / 1e9, 2) for k, v in mem.items()},
            "decode_step_ms_bs64_ctx2k": round(self.decode_time(64, 64 * 2048) * 1e3, 3),
        }
