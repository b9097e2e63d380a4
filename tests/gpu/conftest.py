"""Shared fixtures of the GPU tests: the checkpoint they serve and prompts from held-out sources
(``gpu_helpers.py`` beside it has what nvidia-smi and an engine's OpenAI endpoint say)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

PROMPT_COUNT = 8
"""Prompts of 200 tokens each from held-out source files."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    """(checkpoint dir, is_oracle): ``$MTP_TEST_CHECKPOINT`` when set, else an oracle checkpoint of the
    default shape built here."""
    given = os.environ.get("MTP_TEST_CHECKPOINT")
    if given:
        return Path(given), False
    from tuning.checkpoint.build import ModelShape, build_checkpoint

    out = tmp_path_factory.mktemp("oracle_ckpt")
    build_checkpoint(out, ModelShape(), oracle=True, tokenizer_bytes=2 << 20)
    return out, True


@pytest.fixture(scope="module")
def prompts(checkpoint: tuple[Path, bool]) -> list[str]:
    from tokenizers import Tokenizer

    from tuning.checkpoint.tokenizer import collect_source_files, read_texts

    tok = Tokenizer.from_file(str(checkpoint[0] / "tokenizer.json"))
    texts = read_texts(collect_source_files(max_bytes=2 << 20, split="eval"))
    out = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        if len(ids) >= 200:
            out.append(tok.decode(ids[:200]))
        if len(out) == PROMPT_COUNT:
            break
    return out
