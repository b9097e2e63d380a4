"""LMDeploy 0.18 on a real GPU through :class:`orchestrator.engine.EngineProcess`: MTP on and off,
greedy equality, the bench client's accept length against LMDeploy's counters, kill -9 detection
and GPU memory released on stop.

Skipped without a CUDA GPU, torch and LMDeploy (``tests/conftest.py``). The checkpoint is
``$MTP_TEST_CHECKPOINT`` when set (e.g. the trained one from ``python -m tuning.checkpoint.train``),
otherwise an oracle checkpoint of the default shape built here (its MTP head is always right, so
the accept length must be ``1 + N``). The default shape matches the trained model's, so a test run
also warms LMDeploy's kernel caches for it.

The engines run with ``--language-model-only`` (LMDeploy builds Qwen3.5's vision tower otherwise)
and a small KV share so they fit beside other work on the GPU. Both engines start once per module
(cold start ~3 min on a fresh machine: TileLang/Triton compilation and CUDA-graph capture).
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from gpu_helpers import complete, kill_9_and_check_memory_freed, spec_counters

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(1500)]

NUM_DRAFT = 2
MAX_TOKENS = 128


@pytest.fixture(scope="module")
def engines(checkpoint: tuple[Path, bool], tmp_path_factory: pytest.TempPathFactory):
    """{"off": EngineProcess, "mtp": EngineProcess}, started one after the other, stopped at the end."""
    from orchestrator.config import EngineConfig
    from orchestrator.engine import EngineProcess

    log_dir = tmp_path_factory.mktemp("engine_logs")
    base = EngineConfig(backend="pytorch", model=str(checkpoint[0]), memory_fraction=0.1, max_batch_size=16,
                        extra_flags=("--language-model-only",))
    procs = {"off": EngineProcess(base, log_dir=log_dir, ready_timeout_s=900),
             "mtp": EngineProcess(base.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=NUM_DRAFT),
                                  log_dir=log_dir, ready_timeout_s=900)}
    try:
        for name, proc in procs.items():
            t0 = time.monotonic()
            proc.start()
            proc.wait_until_ready()
            print(f"engine {name} ready in {time.monotonic() - t0:.0f} s: {' '.join(proc.argv)}")
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def test_greedy_output_identical_with_and_without_mtp(engines, prompts) -> None:
    off = [complete(engines["off"].base_url, p, MAX_TOKENS) for p in prompts]
    mtp = [complete(engines["mtp"].base_url, p, MAX_TOKENS) for p in prompts]
    different = [i for i, (a, b) in enumerate(zip(off, mtp)) if a != b]
    assert not different, f"{len(different)}/{len(prompts)} greedy outputs differ, first: {off[different[0]]!r} vs " \
                          f"{mtp[different[0]]!r}"
    assert any(off), "all outputs are empty"


def test_bench_accept_length_equals_lmdeploy_counters(engines, checkpoint, prompts) -> None:
    from tokenizers import Tokenizer

    from tuning.bench import accept_length_from_counters, benchmark
    from tuning.workload import HFTokenCounter, Workload

    eng = engines["mtp"]
    counter = HFTokenCounter(Tokenizer.from_file(str(checkpoint[0] / "tokenizer.json")), name="ckpt",
                             corpus_text="\n".join(prompts))
    wl = Workload(dataset="random", input_len=128, output_len=MAX_TOKENS, range_ratio=1.0, num_prompts=8,
                  max_concurrency=8, temperature=0.0, ignore_eos=True, name="gpu-test")
    before = spec_counters(eng.base_url)
    result = benchmark(eng.base_url, wl, tokenizer=counter, engine_config=eng.config)
    after = spec_counters(eng.base_url)
    assert result.completed == 8 and result.failed == 0, result.failure_reasons
    direct = accept_length_from_counters({k: after[k] - before.get(k, 0.0) for k in after}, NUM_DRAFT)
    assert direct is not None and result.accept_length == pytest.approx(direct, abs=1e-9)
    assert 1.0 <= result.accept_length <= 1 + NUM_DRAFT
    if checkpoint[1]:  # oracle weights: every draft accepted
        assert result.accept_length >= 1 + NUM_DRAFT - 0.05
    # LMDeploy counts one draft event per verification step: draft tokens = N x drafts
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["num_draft_tokens"] == pytest.approx(NUM_DRAFT * delta["num_drafts"])


def test_no_spec_counters_without_mtp(engines, prompts) -> None:
    eng = engines["off"]
    before = spec_counters(eng.base_url)
    complete(eng.base_url, prompts[0], 16)
    after = spec_counters(eng.base_url)
    assert after.get("num_draft_tokens", 0.0) == before.get("num_draft_tokens", 0.0)


def test_kill_9_detected_and_gpu_memory_freed(engines) -> None:
    """kill -9 of the server process: check_health reports it dead; stop() then frees its GPU memory
    (LMDeploy's engine process is a child in the same process group and survives the parent)."""
    kill_9_and_check_memory_freed(engines, "off")
