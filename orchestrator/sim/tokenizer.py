"""A deterministic word-level tokenizer over the shipped corpus, so the simulator needs no model files.

Why word-level: the simulator only needs *counts* that a client and the server agree on, and text that
looks like real prompts. A token is a run of word characters or one punctuation character
(``\\w+|[^\\w\\s]``); whitespace separates but is not a token. Text built by :func:`sample_text` joins
tokens with single spaces, so ``count_tokens(sample_text(n, rng)) == n`` exactly.

Public API (used by the server and by the bench client's random dataset when no HF tokenizer is given):
``count_tokens(text)``, ``tokenize(text)``, ``sample_text(num_tokens, rng)``, ``sample_tokens(num_tokens, rng)``.
"""
from __future__ import annotations

import functools
import random
import re
from pathlib import Path
from typing import Any

__all__ = ["count_tokens", "tokenize", "sample_text", "sample_tokens", "corpus_tokens"]

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_CORPUS_DIR = Path(__file__).with_name("corpus")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into tokens (words and single punctuation marks)."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """Number of tokens in ``text``; the figure reported as ``usage.prompt_tokens``."""
    return sum(1 for _ in _TOKEN_RE.finditer(text))


@functools.lru_cache(maxsize=1)
def corpus_tokens() -> tuple[str, ...]:
    """All tokens of the shipped corpus (``corpus/*.txt``, sorted by name), loaded once."""
    files = sorted(_CORPUS_DIR.glob("*.txt"))
    if not files:
        raise FileNotFoundError(
            f"no corpus under {_CORPUS_DIR}; rebuild it with `python {_CORPUS_DIR / 'build_corpus.py'}`"
        )
    tokens: list[str] = []
    for path in files:
        tokens.extend(tokenize(path.read_text(encoding="utf-8", errors="replace")))
    return tuple(tokens)


def _randrange(rng: Any, n: int) -> int:
    if hasattr(rng, "integers"):  # numpy Generator
        return int(rng.integers(0, n))
    return rng.randrange(n)


def sample_tokens(num_tokens: int, rng: Any = None) -> list[str]:
    """``num_tokens`` consecutive corpus tokens from a random offset (wrapping around)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    rng = rng if rng is not None else random.Random()
    corpus = corpus_tokens()
    start = _randrange(rng, len(corpus))
    out: list[str] = []
    while len(out) < num_tokens:
        take = corpus[start : start + num_tokens - len(out)]
        out.extend(take)
        start = 0
    return out


def sample_text(num_tokens: int, rng: Any = None) -> str:
    """Real text with exactly ``num_tokens`` tokens (``rng``: ``random.Random`` or numpy ``Generator``)."""
    return " ".join(sample_tokens(num_tokens, rng))
