"""The byte-level BPE tokenizer every project checkpoint shares, and the Python sources it (and the
trainer) learn from: Qwen's special tokens and ChatML template, a held-out split by a stable hash of each
file's path, so the same files are held out on every run and machine.

Needs ``tokenizers`` only when a tokenizer is trained.
"""
from __future__ import annotations

import json
import os
import sysconfig
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuning.checkpoint.errors import CheckpointError

__all__ = [
    "CHAT_TEMPLATE",
    "EVAL_FILE_MODULUS",
    "SPECIAL_TOKENS",
    "TOKENIZER_VOCAB_CAP",
    "TokenizerInfo",
    "collect_source_files",
    "default_source_roots",
    "is_eval_file",
    "read_texts",
    "train_tokenizer",
]

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)
"""Qwen-style special tokens; ids 0..8 in every tokenizer this module trains (they are added first)."""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML, as Qwen models use: LMDeploy's chat endpoint renders it when the model name is unknown."""

EVAL_FILE_MODULUS = 40
"""One source file in this many (by a CRC of its relative path) is held out of tokenizer and model
training; the acceptance prompts come from those files."""

TOKENIZER_VOCAB_CAP = 32_768
"""The BPE is trained to at most this many tokens; a larger model vocabulary is padding the tokenizer
never produces (and a controlled checkpoint never generates)."""


@dataclass(frozen=True)
class TokenizerInfo:
    vocab_size: int
    special_ids: dict[str, int]


# ----- corpus -------------------------------------------------------------------------------------
def default_source_roots() -> list[Path]:
    """Python sources that exist on every machine this runs on: the standard library, plus torch's
    and transformers' own sources when installed (much more code, so the model sees more text)."""
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    for name in ("torch", "transformers"):
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).parent)
    return roots


def is_eval_file(relative_path: str) -> bool:
    """Held-out split by a stable hash of the path: the same files on every run and machine."""
    return zlib.crc32(relative_path.encode()) % EVAL_FILE_MODULUS == 0


def collect_source_files(roots: Sequence[Path] | None = None, *, max_bytes: int = 64 << 20,
                         split: str = "train", max_file_bytes: int = 400_000) -> list[Path]:
    """``*.py`` files under ``roots`` in a deterministic order, up to ``max_bytes`` in total.

    Args:
        split: ``train`` (files not held out), ``eval`` (held-out files) or ``all``.
        max_file_bytes: larger files (generated tables, vendored blobs) are skipped.
    """
    if split not in ("train", "eval", "all"):
        raise CheckpointError(f"split={split!r}; allowed: train, eval, all")
    files: list[Path] = []
    total = 0
    for root in roots if roots is not None else default_source_roots():
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"source root {root} is not a directory; pass --text-root DIR with .py files")
        for path in _python_files(root):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size == 0 or size > max_file_bytes:
                continue
            held_out = is_eval_file(f"{root.name}/{path.relative_to(root).as_posix()}")
            if (split == "train" and held_out) or (split == "eval" and not held_out):
                continue
            files.append(path)
            total += size
            if total >= max_bytes:
                return files
    if not files:
        raise CheckpointError(f"no .py files found under {[str(r) for r in roots or []]}")
    return files


_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", ".git"})


def _python_files(root: Path) -> Iterable[Path]:
    """``*.py`` under ``root`` in sorted order, not descending into installed-package folders (a
    virtualenv's stdlib folder holds every installed package; those are separate roots here)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def read_texts(files: Iterable[Path]) -> list[str]:
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


# ----- tokenizer ----------------------------------------------------------------------------------
def train_tokenizer(out_dir: Path, files: Sequence[Path], vocab_size: int) -> TokenizerInfo:
    """Byte-level BPE (GPT-2/Qwen style pre-tokenisation) trained on ``files``; writes
    ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template) and
    ``special_tokens_map.json``. Deterministic for the same files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(f) for f in files], trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {str(i): dict(content=t, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
             for t, i in ids.items()}
    tok_cfg = dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=32768, bos_token=None,
                   eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None, add_bos_token=False,
                   added_tokens_decoder=added, chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"), indent=2))
    return TokenizerInfo(vocab_size=tok.get_vocab_size(), special_ids=ids)
