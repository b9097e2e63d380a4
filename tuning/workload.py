"""Workloads: what a benchmark sends, and the datasets that turn a :class:`Workload` into requests.

A :class:`Workload` is the *what* of one measurement (one output-length bucket at one concurrency);
:func:`build_requests` turns it into concrete prompts, deterministically for a given seed, so two
configs compared in a sweep see exactly the same requests.

Definitions follow ``sglang.bench_serving`` so figures are comparable with published tables:

- ``random``: per request, input and output lengths are drawn uniformly from the integers
  ``[max(1, int(L * range_ratio)), L]`` (seeded numpy RNG). Unlike sglang (random token ids), the
  prompts are *real text*: a random span of a real-text corpus cut to exactly the drawn number of
  tokens. Random token ids are unrealistic for speculative decoding: the draft head's acceptance
  depends on the text being language.
- ``sharegpt``: the first human turn of each conversation is the prompt; the output length is the
  token count of the following gpt turn (``sharegpt_output_len="dataset"``) or ``output_len``
  (``"fixed"``). Conversations are shuffled with the seed; too-short (< 4 tokens) and too-long
  prompts/outputs are dropped, as in sglang/vLLM.

Tokens are counted either with a HuggingFace ``tokenizers.Tokenizer`` (the served model's
``tokenizer.json``) or, without one, with the simulated engine's word-level tokenizer
(:mod:`orchestrator.sim.tokenizer`), which is what the simulator itself counts with.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from orchestrator.errors import ConfigError

__all__ = [
    "HFTokenCounter",
    "RequestSpec",
    "SimTokenCounter",
    "TokenCounter",
    "Workload",
    "WorkloadError",
    "build_requests",
    "load_tokenizer",
    "resolve_token_counter",
]

SHAREGPT_MIN_TOKENS = 4
"""Prompts or outputs shorter than this are dropped from ShareGPT (vLLM/sglang's filter)."""


class WorkloadError(ConfigError):
    """A workload spec or its dataset is invalid; the message names the field and what to do."""


@dataclass(frozen=True)
class Workload:
    """One benchmark workload (typically one output-length bucket at one concurrency).

    Args:
        dataset: ``random`` or ``sharegpt``.
        input_len: ``random``: max prompt tokens (drawn in ``[range_ratio*input_len, input_len]``).
            ``sharegpt``: prompts longer than this are dropped.
        output_len: ``random``: max output tokens (drawn in ``[range_ratio*output_len, output_len]``).
            ``sharegpt``: the fixed output length (``sharegpt_output_len="fixed"``) or the cap above
            which conversations are dropped (``"dataset"``).
        range_ratio: lower bound of the uniform length draw as a fraction of the max (sglang's
            ``--random-range-ratio``); 1.0 makes every request exactly ``input_len``/``output_len``.
        num_prompts: requests measured (warm-up requests come on top).
        max_concurrency: requests in flight at most; ``None`` = unbounded.
        request_rate: Poisson arrival rate in requests/s; ``inf`` sends all at once (then
            ``max_concurrency`` alone shapes the load).
        temperature: sampling temperature sent with every request.
        seed: seeds the dataset draw, the prompt text and the arrival times.
        api: ``completions`` (``/v1/completions``) or ``chat`` (``/v1/chat/completions``).
        ignore_eos: ask the engine to generate exactly the requested number of tokens.
        warmup_requests: requests sent (and not counted) before measuring.
        sharegpt_path: path of a ShareGPT JSON file (``dataset="sharegpt"``).
        sharegpt_output_len: ``dataset`` (gpt turn's length) or ``fixed`` (``output_len``).
        name: bucket name, carried into results.
    """

    dataset: Literal["random", "sharegpt"] = "random"
    input_len: int = 1024
    output_len: int = 1024
    range_ratio: float = 0.5
    num_prompts: int = 256
    max_concurrency: int | None = 64
    request_rate: float = math.inf
    temperature: float = 0.0
    seed: int = 0
    api: Literal["completions", "chat"] = "completions"
    ignore_eos: bool = True
    warmup_requests: int = 0
    sharegpt_path: str | None = None
    sharegpt_output_len: Literal["dataset", "fixed"] = "fixed"
    name: str = ""

    def __post_init__(self) -> None:
        if self.dataset not in ("random", "sharegpt"):
            raise WorkloadError(f"dataset={self.dataset!r} is invalid; allowed: 'random', 'sharegpt'")
        _check_int("input_len", self.input_len, 1, 10_000_000)
        _check_int("output_len", self.output_len, 1, 10_000_000)
        if not _is_number(self.range_ratio) or not (0.0 <= float(self.range_ratio) <= 1.0):
            raise WorkloadError(f"range_ratio={self.range_ratio!r} is out of range; allowed: 0.0..1.0")
        object.__setattr__(self, "range_ratio", float(self.range_ratio))
        _check_int("num_prompts", self.num_prompts, 1, 10_000_000)
        if self.max_concurrency is not None:
            _check_int("max_concurrency", self.max_concurrency, 1, 1_000_000)
        if not _is_number(self.request_rate) or not float(self.request_rate) > 0:
            raise WorkloadError(
                f"request_rate={self.request_rate!r} is invalid; allowed: a positive number of requests/s or inf"
            )
        object.__setattr__(self, "request_rate", float(self.request_rate))
        if not _is_number(self.temperature) or not (0.0 <= float(self.temperature) <= 10.0):
            raise WorkloadError(f"temperature={self.temperature!r} is out of range; allowed: 0.0..10.0")
        object.__setattr__(self, "temperature", float(self.temperature))
        _check_int("seed", self.seed, 0, 2**32 - 1)
        if self.api not in ("completions", "chat"):
            raise WorkloadError(f"api={self.api!r} is invalid; allowed: 'completions', 'chat'")
        if not isinstance(self.ignore_eos, bool):
            raise WorkloadError(f"ignore_eos={self.ignore_eos!r} must be true or false")
        _check_int("warmup_requests", self.warmup_requests, 0, 100_000)
        if self.sharegpt_output_len not in ("dataset", "fixed"):
            raise WorkloadError(
                f"sharegpt_output_len={self.sharegpt_output_len!r} is invalid; allowed: 'dataset', 'fixed'"
            )
        if self.dataset == "sharegpt" and not self.sharegpt_path:
            raise WorkloadError(
                "dataset='sharegpt' needs sharegpt_path (a ShareGPT JSON file, e.g. "
                "ShareGPT_V3_unfiltered_cleaned_split.json); pass --dataset-path"
            )
        if not isinstance(self.name, str):
            raise WorkloadError(f"name={self.name!r} must be a string")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; an infinite request rate is written as the string ``"inf"``."""
        out = dataclasses.asdict(self)
        if math.isinf(self.request_rate):
            out["request_rate"] = "inf"
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workload:
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        if not isinstance(data, Mapping):
            raise WorkloadError(f"a workload must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise WorkloadError(f"unknown workload field(s) {unknown}; known: {sorted(known)}")
        kwargs = dict(data)
        if isinstance(kwargs.get("request_rate"), str):
            try:
                kwargs["request_rate"] = float(kwargs["request_rate"])
            except ValueError:
                raise WorkloadError(f"request_rate={kwargs['request_rate']!r} is not a number or 'inf'") from None
        return cls(**kwargs)

    def replace(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the prompt, its token count, and the number of tokens to ask for."""

    prompt: str
    prompt_len: int
    output_len: int


# ----- tokenizers ---------------------------------------------------------------------------------


@runtime_checkable
class TokenCounter(Protocol):
    """What the bench needs from a tokenizer: count tokens and cut real text to an exact length."""

    name: str

    def count_tokens(self, text: str) -> int: ...

    def sample_text(self, num_tokens: int, rng: random.Random) -> str: ...


class SimTokenCounter:
    """The simulated engine's word-level tokenizer (the simulator counts tokens the same way)."""

    name = "sim-word"

    def __init__(self) -> None:
        from orchestrator.sim import tokenizer as sim_tokenizer  # lazily: written by the sim package

        self._tok = sim_tokenizer

    def count_tokens(self, text: str) -> int:
        return int(self._tok.count_tokens(text))

    def sample_text(self, num_tokens: int, rng: random.Random) -> str:
        return self._tok.sample_text(num_tokens, rng)


class HFTokenCounter:
    """A HuggingFace ``tokenizers.Tokenizer`` plus a real-text corpus to cut prompts from.

    Prompts are a random span of the corpus's token ids, decoded and re-checked so the prompt
    re-encodes to exactly the requested number of tokens (decoding can merge or split tokens at the
    span's edges; a few trims fix that). The corpus defaults to the simulator's shipped corpus.
    """

    def __init__(self, tokenizer: Any, *, name: str = "hf", corpus_text: str | None = None) -> None:
        self._tokenizer = tokenizer
        self.name = name
        self._corpus_text = corpus_text
        self._corpus_ids: list[int] | None = None

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _ids(self) -> list[int]:
        if self._corpus_ids is None:
            text = self._corpus_text if self._corpus_text is not None else _default_corpus_text()
            self._corpus_ids = list(self._tokenizer.encode(text, add_special_tokens=False).ids)
            if len(self._corpus_ids) < 16:
                raise WorkloadError("the prompt corpus is too small to cut prompts from (< 16 tokens)")
        return self._corpus_ids

    def sample_text(self, num_tokens: int, rng: random.Random) -> str:
        ids = self._ids()
        want = num_tokens
        # Spans longer than the corpus wrap around (a long prompt repeats the corpus, still real text).
        start = rng.randrange(len(ids))
        span = [ids[(start + i) % len(ids)] for i in range(want + 8)]
        take = want
        text = ""
        for _ in range(16):
            text = self._tokenizer.decode(span[:take])
            got = self.count_tokens(text)
            if got == want:
                return text
            take = max(1, min(len(span), take + (want - got)))
        return text  # closest found; the request records the length the tokenizer actually reports


def load_tokenizer(path: str | os.PathLike[str] | None) -> TokenCounter:
    """A token counter from a model dir (or its ``tokenizer.json``); the sim tokenizer for ``None``."""
    if path is None:
        return SimTokenCounter()
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise WorkloadError(
            f"no tokenizer.json at {p}; pass the served model's directory (it holds tokenizer.json) "
            "or the file itself, or omit --tokenizer to count with the simulator's word tokenizer"
        )
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # the library raises a bare Exception on malformed files
        raise WorkloadError(f"cannot load tokenizer {file}: {e}") from None
    return HFTokenCounter(tok, name=str(file))


def resolve_token_counter(tokenizer: Any) -> TokenCounter:
    """Accept ``None`` (sim tokenizer), a path, a ``tokenizers.Tokenizer`` or a :class:`TokenCounter`."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer)
    if isinstance(tokenizer, (SimTokenCounter, HFTokenCounter)) or isinstance(tokenizer, TokenCounter):
        return tokenizer
    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode"):
        return HFTokenCounter(tokenizer, name=type(tokenizer).__name__)
    raise WorkloadError(
        f"tokenizer must be None, a path, a tokenizers.Tokenizer or a TokenCounter; got {type(tokenizer).__name__}"
    )


def _default_corpus_text() -> str:
    corpus_dir = Path(__file__).resolve().parent.parent / "orchestrator" / "sim" / "corpus"
    files = sorted(corpus_dir.glob("*.txt"))
    if not files:
        raise WorkloadError(
            f"no real-text corpus at {corpus_dir}/*.txt to cut prompts from; the simulator package ships it "
            "(reinstall the project) or pass corpus_text to HFTokenCounter"
        )
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)


# ----- datasets -----------------------------------------------------------------------------------


def build_requests(workload: Workload, tokenizer: Any = None) -> list[RequestSpec]:
    """The workload's requests, deterministic for ``workload.seed``.

    Args:
        workload: what to build.
        tokenizer: ``None`` (the simulator's word tokenizer), a path to a model dir / tokenizer.json,
            a ``tokenizers.Tokenizer``, or a :class:`TokenCounter`.
    """
    counter = resolve_token_counter(tokenizer)
    if workload.dataset == "random":
        return _random_requests(workload, counter)
    return _sharegpt_requests(workload, counter)


def _uniform_lengths(rng: np.random.RandomState, max_len: int, ratio: float, n: int) -> np.ndarray:
    lo = max(int(max_len * ratio), 1)
    return rng.randint(lo, max_len + 1, size=n)


def _random_requests(w: Workload, counter: TokenCounter) -> list[RequestSpec]:
    # Same draw order as sglang (input lengths, then output lengths) from a seeded RandomState.
    np_rng = np.random.RandomState(w.seed)
    input_lens = _uniform_lengths(np_rng, w.input_len, w.range_ratio, w.num_prompts)
    output_lens = _uniform_lengths(np_rng, w.output_len, w.range_ratio, w.num_prompts)
    text_rng = random.Random(w.seed)
    out: list[RequestSpec] = []
    for in_len, out_len in zip(input_lens.tolist(), output_lens.tolist()):
        prompt = counter.sample_text(int(in_len), text_rng)
        out.append(RequestSpec(prompt=prompt, prompt_len=counter.count_tokens(prompt), output_len=int(out_len)))
    return out


def _sharegpt_pairs(path: str) -> list[tuple[str, str]]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise WorkloadError(f"cannot read ShareGPT file {p}: {e}") from None
    except json.JSONDecodeError as e:
        raise WorkloadError(f"ShareGPT file {p} is not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"ShareGPT file {p} must hold a JSON list of conversations, got {type(data).__name__}")
    pairs: list[tuple[str, str]] = []
    for entry in data:
        if not isinstance(entry, Mapping):
            continue
        conv = entry.get("conversations", entry.get("conversation"))
        if not isinstance(conv, Sequence) or len(conv) < 2:
            continue
        first, second = conv[0], conv[1]
        if not (isinstance(first, Mapping) and isinstance(second, Mapping)):
            continue
        if first.get("from") not in ("human", "user") or second.get("from") not in ("gpt", "assistant", "chatgpt"):
            continue
        prompt, completion = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(completion, str):
            pairs.append((prompt, completion))
    return pairs


def _sharegpt_requests(w: Workload, counter: TokenCounter) -> list[RequestSpec]:
    assert w.sharegpt_path is not None  # validated by Workload
    pairs = _sharegpt_pairs(w.sharegpt_path)
    random.Random(w.seed).shuffle(pairs)
    out: list[RequestSpec] = []
    for prompt, completion in pairs:
        if len(out) == w.num_prompts:
            break
        prompt_len = counter.count_tokens(prompt)
        if w.sharegpt_output_len == "fixed":
            output_len = w.output_len
        else:
            output_len = counter.count_tokens(completion)
            if output_len > w.output_len:
                continue
        if prompt_len < SHAREGPT_MIN_TOKENS or output_len < SHAREGPT_MIN_TOKENS or prompt_len > w.input_len:
            continue
        out.append(RequestSpec(prompt=prompt, prompt_len=prompt_len, output_len=output_len))
    if len(out) < w.num_prompts:
        raise WorkloadError(
            f"ShareGPT file {w.sharegpt_path} yields only {len(out)} usable conversations (human turn then gpt "
            f"turn, prompt {SHAREGPT_MIN_TOKENS}..{w.input_len} tokens, output >= {SHAREGPT_MIN_TOKENS} tokens) "
            f"but num_prompts={w.num_prompts}; lower num_prompts or raise input_len/output_len"
        )
    return out


# ----- validation helpers -------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not (lo <= value <= hi):
        raise WorkloadError(f"{name}={value!r} is out of range; allowed: integers {lo}..{hi}")
