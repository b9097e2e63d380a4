"""A controlled-acceptance MoE checkpoint on a real GPU: LMDeploy's measured accept length matches what
the builder predicts (``acceptance.json``) within 0.15, greedy and sampled.

Skipped without a CUDA GPU, torch and LMDeploy (``tests/conftest.py``). The checkpoint is a small
Qwen3.5-MoE (hidden 1024, 4 layers, 64 experts top-8) built on the GPU here; the MTP engine drafts
``NUM_DRAFT`` tokens. Requests carry no ``top_k``, so LMDeploy samples with its API default (40), as
the prediction assumes.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(1500)]

NUM_DRAFT = 3
AGREEMENT = 0.8
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tuning.checkpoint.acceptance import AcceptanceSpec
    from tuning.checkpoint.build import ModelShape, build_checkpoint

    shape = ModelShape(hidden_size=1024, num_layers=4, vocab_size=8192, num_heads=8, num_kv_heads=2, head_dim=128,
                       linear_num_key_heads=4, linear_num_value_heads=8, linear_head_dim=128, num_experts=64,
                       num_experts_per_tok=8, moe_intermediate_size=256, shared_expert_intermediate_size=256)
    out = tmp_path_factory.mktemp("controlled_moe")
    build_checkpoint(out, shape, acceptance=AcceptanceSpec(agreement=AGREEMENT), tokenizer_bytes=2 << 20,
                     device="cuda")
    return out


@pytest.fixture(scope="module")
def engine(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    from orchestrator.config import EngineConfig
    from orchestrator.engine import EngineProcess

    cfg = EngineConfig(backend="pytorch", model=str(checkpoint), memory_fraction=0.2, max_batch_size=64,
                       speculative_algorithm="qwen3_5_mtp", num_draft_tokens=NUM_DRAFT,
                       extra_flags=("--language-model-only",))
    proc = EngineProcess(cfg, log_dir=tmp_path_factory.mktemp("engine_logs"), ready_timeout_s=900)
    t0 = time.monotonic()
    proc.start()
    try:
        proc.wait_until_ready()
        print(f"engine ready in {time.monotonic() - t0:.0f} s: {' '.join(proc.argv)}")
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_measured_accept_length_matches_the_prediction(engine, checkpoint: Path, temperature: float) -> None:
    from tokenizers import Tokenizer

    from tuning.bench import benchmark
    from tuning.checkpoint.build import (
        collect_source_files,
        predicted_accept_length,
        read_texts,
    )
    from tuning.workload import HFTokenCounter, Workload

    corpus = "\n".join(read_texts(collect_source_files(max_bytes=1 << 20, split="eval")))
    counter = HFTokenCounter(Tokenizer.from_file(str(checkpoint / "tokenizer.json")), name="ckpt", corpus_text=corpus)
    wl = Workload(dataset="random", input_len=256, output_len=512, range_ratio=1.0, num_prompts=64,
                  max_concurrency=32, temperature=temperature, ignore_eos=True, name="gpu-acceptance")
    result = benchmark(engine.base_url, wl, tokenizer=counter, engine_config=engine.config)
    assert result.completed == 64 and result.failed == 0, result.failure_reasons
    predicted = predicted_accept_length(checkpoint, NUM_DRAFT, temperature)
    record = {"temperature": temperature, "predicted": predicted, "measured": result.accept_length,
              "prediction_file": json.loads((checkpoint / "acceptance.json").read_text())}
    print(json.dumps(record))
    assert result.accept_length == pytest.approx(predicted, abs=TOLERANCE), record
