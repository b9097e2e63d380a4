"""MTP keeps the target distribution: sampled completions of LMDeploy's PyTorch engine with MTP
(4 draft tokens) are drawn from the same distribution as without MTP (issue #18 item 4).

Why a statistical test: speculative sampling is only lossless when the verifier accepts a draft with
the right probability and, on a rejection, samples from the right residual. A mistake there (say,
resampling from the full target distribution) gives the drafted token extra mass at every rejected
position, which a throughput or accept-length figure never shows. So: many sampled completions of
fixed prompts (temperature 1.0, where about half the drafts are rejected), MTP on against MTP off,
compared with a permutation chi-square test (``tuning.stats.categorical_homogeneity_test``) on the
joint completion and on each re-tokenized position. Significance: the family of comparisons is held
at 1 % (Bonferroni); a true difference of the size a wrong residual gives is found with near
certainty at these sample sizes (``tests/unit/test_stats_homogeneity.py``), and the test proves its
power here by telling temperature 1.0 from 0.7 on the plain engine with the same sample size.

Needs a checkpoint whose next-token distribution is not one-hot: the trained one
(``$MTP_TEST_CHECKPOINT``); an oracle checkpoint is skipped (its MTP head is always right, so no
draft is ever rejected and nothing would be tested).
"""
from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gpu_helpers import model_name, spec_counters

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(1500)]

NUM_DRAFT = 4
SAMPLES = 1500          # per engine, prompt and temperature
MAX_TOKENS = 3          # positions 2 and 3 are the ones a draft can decide
PROMPTS = 2
ALPHA = 0.01            # family-wise
CONCURRENCY = 128


def _sample(base_url: str, prompt: str, temperature: float, n: int) -> list[str]:
    model = model_name(base_url)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": temperature,
                       "top_p": 1.0, "top_k": 0, "ignore_eos": True}).encode()

    def one(_: int) -> str:
        req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())["choices"][0]["text"]

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(one, range(n)))


@pytest.fixture(scope="module")
def samples(checkpoint: tuple[Path, bool], prompts: list[str], tmp_path_factory: pytest.TempPathFactory):
    """{(engine, prompt index, temperature): [completion text]} and the MTP engine's accept length,
    one engine on the GPU at a time."""
    if checkpoint[1]:
        pytest.skip("an oracle checkpoint never rejects a draft; set MTP_TEST_CHECKPOINT to the trained one")
    from orchestrator.config import EngineConfig
    from orchestrator.engine import EngineProcess
    from tuning.bench import accept_length_from_counters

    log_dir = tmp_path_factory.mktemp("engine_logs")
    base = EngineConfig(backend="pytorch", model=str(checkpoint[0]), memory_fraction=0.1,
                        max_batch_size=CONCURRENCY, extra_flags=("--language-model-only",))
    plan = {"off": (base, (1.0, 0.7)),
            "mtp": (base.replace(speculative_algorithm="qwen3_5_mtp", num_draft_tokens=NUM_DRAFT), (1.0,))}
    out: dict[tuple[str, int, float], list[str]] = {}
    accept = None
    for name, (config, temps) in plan.items():
        proc = EngineProcess(config, log_dir=log_dir, ready_timeout_s=900)
        t0 = time.monotonic()
        proc.start()
        try:
            proc.wait_until_ready()
            print(f"engine {name} ready in {time.monotonic() - t0:.0f} s")
            _sample(proc.base_url, prompts[0], 1.0, CONCURRENCY)  # warm the sampling path
            before = spec_counters(proc.base_url) if name == "mtp" else {}
            for i in range(PROMPTS):
                for t in temps:
                    out[(name, i, t)] = _sample(proc.base_url, prompts[i], t, SAMPLES)
            if name == "mtp":
                after = spec_counters(proc.base_url)
                accept = accept_length_from_counters({k: after[k] - before.get(k, 0.0) for k in after}, NUM_DRAFT)
        finally:
            proc.stop()
    return out, accept


def _views(texts: list[str], tokenizer) -> dict[str, list]:
    """The joint completion and each re-tokenized position (functions of the output, the same for both
    engines, so equal distributions stay equal)."""
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    views: dict[str, list] = {"joint": list(texts)}
    for pos in range(MAX_TOKENS):
        views[f"token{pos + 1}"] = [x[pos] if len(x) > pos else -1 for x in ids]
    return views


def test_mtp_sampling_keeps_the_target_distribution(samples, checkpoint) -> None:
    from tokenizers import Tokenizer

    from tuning.stats import categorical_homogeneity_test

    data, accept = samples
    tok = Tokenizer.from_file(str(checkpoint[0] / "tokenizer.json"))
    # Rejections must have happened, or nothing about the residual was exercised.
    assert accept is not None and accept < 1 + NUM_DRAFT - 0.5, accept
    tests = PROMPTS * (1 + MAX_TOKENS)
    per_test_alpha = ALPHA / tests
    report = {}
    for i in range(PROMPTS):
        off, mtp = _views(data[("off", i, 1.0)], tok), _views(data[("mtp", i, 1.0)], tok)
        for view in off:
            p = categorical_homogeneity_test(off[view], mtp[view], permutations=2000, seed=i)
            report[f"prompt{i} {view}"] = (p, len(set(off[view]) | set(mtp[view])))
    print(f"MTP-{NUM_DRAFT} accept length at T=1.0: {accept:.3f}; per-test alpha {per_test_alpha:.5f}")
    for key, (p, cats) in report.items():
        print(f"  {key}: p = {p:.4f} over {cats} categories")
    assert all(p >= per_test_alpha for p, _ in report.values()), report

    # Power, with the same sample size: the plain engine at T=1.0 vs T=0.7 must be told apart.
    for i in range(PROMPTS):
        p = categorical_homogeneity_test(data[("off", i, 1.0)], data[("off", i, 0.7)], permutations=2000, seed=i)
        print(f"  power check prompt{i} joint T=1.0 vs 0.7: p = {p:.4f}")
        assert p < per_test_alpha, f"prompt {i}: T=1.0 and T=0.7 not told apart (p={p}); the test has no power"
