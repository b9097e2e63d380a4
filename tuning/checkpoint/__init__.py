"""A small Qwen3.5 checkpoint with one MTP layer, in the exact layout LMDeploy 0.18 loads.

Why the project builds its own model: MTP speed-ups depend on how often the draft head agrees with
the target model. Random weights give ~0 % acceptance and a constructed "oracle" gives 100 %; neither
says anything about real traffic. :mod:`tuning.checkpoint.train` trains the main model and its MTP
head together for a few minutes on local Python sources, so acceptance is real (between the two) and
predictable: the trainer reports the accept length its own PyTorch forward pass expects, and the GPU
measurements compare LMDeploy's counters against it.

- :mod:`tuning.checkpoint.build`: tokenizer, ``config.json`` (nested ``text_config`` +
  ``vision_config``), initial or oracle weights (``python -m tuning.checkpoint.build OUT_DIR``).
  Needs torch, safetensors, tokenizers; no transformers.
- :mod:`tuning.checkpoint.train`: the training run and the acceptance prediction
  (``python -m tuning.checkpoint.train OUT_DIR --minutes 3``). Needs transformers (its
  ``Qwen3_5TextModel`` is the main model, so weight names and semantics match exactly) and a GPU.
"""
from __future__ import annotations

__all__ = ["build", "train"]
