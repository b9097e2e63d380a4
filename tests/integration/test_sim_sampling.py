"""Sampling correctness on the simulator (#18 item 4): with MTP on, sampled outputs keep the target
distribution -- the property the GPU test asserts for LMDeploy, asserted for the simulated engine.

What the simulator's text depends on (``orchestrator/sim/textmodel.py``): the prompt, the temperature
and the seed, drawn when the request arrives; the draft count and the stream's event boundaries only
decide when the drawn tokens go out. So the honest property is "the text is independent of the draft
config and of the emission schedule". It is checked two ways, over real HTTP with the openai client:

- exactly: one request seed gives one text on an engine with MTP off and on one with 4 draft tokens,
  streamed or not;
- statistically, as on the GPU: many completions of one fixed prompt at temperature 1.0 without a
  seed (independent draws; the engines have different ``--seed``), outcome = the first four tokens,
  compared by a permutation chi-square test (``tuning.stats.categorical_homogeneity_test``). Same
  distribution is rejected at p < ALPHA = 0.01, so the test's false-alarm rate is 1 %; the engines'
  seeds and the permutation seed are fixed, so a run is reproducible. The same test must reject
  where the distribution does change -- another temperature (0.5), another prompt -- or passing it
  would say nothing.
"""
from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack

import openai
import pytest

from orchestrator.config import EngineConfig
from orchestrator.engine import EngineProcess
from orchestrator.serve.metrics import ACCEPTED_TOKENS, DRAFT_TOKENS, parse_prometheus_text
from orchestrator.sim.model import DEFAULT_PROFILE
from tuning.stats import categorical_homogeneity_test

ALPHA = 0.01
SAMPLES = 300  # per engine and condition
PROMPT = "Explain how a hash table resolves collisions."
OTHER_PROMPT = "Write a haiku about the sea."
OUTCOME_TOKENS = 4
MAX_TOKENS = 12  # several decode steps, so MTP's multi-token events cut the text differently


def _config(num_draft_tokens: int, seed: int) -> EngineConfig:
    spec = {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": num_draft_tokens} if num_draft_tokens else {}
    return EngineConfig(backend="sim", model=DEFAULT_PROFILE, tp=8, extra_flags=("--seed", str(seed)), **spec)


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Iterator[dict[str, EngineProcess]]:
    logs = tmp_path_factory.mktemp("sim-sampling-logs")
    with ExitStack() as stack:
        yield {name: stack.enter_context(EngineProcess(cfg, log_dir=logs, sim_time_scale=50.0, ready_timeout_s=60))
               for name, cfg in (("off", _config(0, seed=1)), ("mtp4", _config(4, seed=2)))}


def _client(engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.base_url + "/v1", api_key="unused", timeout=30.0, max_retries=0)


def _complete(client: openai.OpenAI, prompt: str, temperature: float, *, seed: int | None = None,
              stream: bool = True) -> str:
    kwargs = dict(model=DEFAULT_PROFILE, prompt=prompt, max_tokens=MAX_TOKENS, temperature=temperature,
                  extra_body={"ignore_eos": True}, **({"seed": seed} if seed is not None else {}))
    if stream:
        text = "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs)
                       if chunk.choices)
    else:
        text = client.completions.create(**kwargs).choices[0].text
    return " ".join(text.split())  # the tokens, whatever the whitespace between events


def _outcomes(engine: EngineProcess, prompt: str, temperature: float) -> list[str]:
    client = _client(engine)
    out = []
    for _ in range(SAMPLES):
        tokens = _complete(client, prompt, temperature).split()
        assert len(tokens) == MAX_TOKENS
        out.append(" ".join(tokens[:OUTCOME_TOKENS]))
    return out


def _counters(engine: EngineProcess) -> dict[str, float]:
    with urllib.request.urlopen(engine.base_url + "/metrics", timeout=10) as r:
        return parse_prometheus_text(r.read().decode())


def test_one_seed_gives_one_text_whatever_the_drafts_and_the_stream(engines):
    off, mtp = _client(engines["off"]), _client(engines["mtp4"])
    for seed in range(5):
        texts = {_complete(c, PROMPT, 1.0, seed=seed, stream=s) for c in (off, mtp) for s in (True, False)}
        assert len(texts) == 1, texts
    greedy = {_complete(c, PROMPT, 0.0, stream=s) for c in (off, mtp) for s in (True, False)}
    assert len(greedy) == 1  # greedy: one prompt, one text, with or without a seed


def test_mtp_keeps_the_sampled_distribution_and_the_test_can_tell_distributions_apart(engines):
    before = _counters(engines["mtp4"])
    off = _outcomes(engines["off"], PROMPT, 1.0)
    mtp = _outcomes(engines["mtp4"], PROMPT, 1.0)
    after = _counters(engines["mtp4"])
    # The MTP engine really speculated and really rejected drafts at T = 1.0 (not a trivial all-accept).
    drafted = after[DRAFT_TOKENS] - before[DRAFT_TOKENS]
    accepted = after[ACCEPTED_TOKENS] - before[ACCEPTED_TOKENS]
    assert drafted > 0 and 0 < accepted < drafted
    assert len(set(off)) > 20  # a spread-out distribution, not one text

    p_same = categorical_homogeneity_test(off, mtp, permutations=2000, seed=0)
    assert p_same >= ALPHA, f"MTP-4 and MTP-off samples differ at p={p_same:.4f}"

    # Power: the same test, same sizes, where the simulator's distribution does change.
    cooler = _outcomes(engines["mtp4"], PROMPT, 0.5)
    assert categorical_homogeneity_test(off, cooler, permutations=2000, seed=0) < ALPHA
    other_prompt = _outcomes(engines["mtp4"], OTHER_PROMPT, 1.0)
    assert categorical_homogeneity_test(off, other_prompt, permutations=2000, seed=0) < ALPHA
