"""Search space: conditional knobs, dedupe by engine command, baselines inside the space, YAML."""
from __future__ import annotations

import optuna
import pytest

from orchestrator.config import Backend
from orchestrator.errors import ConfigError
from tuning.buckets import make_buckets
from tuning.sweep.space import (
    ROLE_MTP_OFF,
    ROLE_SEARCH,
    ROLE_STATIC,
    NamedPoint,
    SearchSpace,
    from_sglang,
    load_space_file,
    to_sglang,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _lmdeploy(**kw) -> SearchSpace:
    return SearchSpace(engine="lmdeploy", model="/models/intern-s2-preview", tp=8, **kw)


def test_draft_knob_is_suggested_only_with_speculation():
    space = _lmdeploy()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_on = seen_off = 0
    for _ in range(60):
        trial = study.ask()
        out = space(trial)
        if trial.params["speculative"]:
            seen_on += 1
            assert "num_draft_tokens" in trial.params and "backend" not in trial.params
            assert space.to_engine_config(trial.params).backend == Backend.PYTORCH
        else:
            seen_off += 1
            assert "num_draft_tokens" not in trial.params and "backend" in trial.params
        assert out["role"] == ROLE_SEARCH and out["extra_flags"] == []
        study.tell(trial, 1.0)
    assert seen_on and seen_off


def test_sim_space_has_no_backend_knob():
    space = SearchSpace(engine="sim", model="intern-s2-preview-8xh200", tp=8)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, multivariate=True, group=True,
                                                                   n_startup_trials=4))
    for _ in range(20):
        t = study.ask()
        space(t)
        assert "backend" not in t.params
        assert space.to_engine_config(t.params).backend == Backend.SIM
        study.tell(t, 0.0)


def test_grid_dedupes_points_with_the_same_engine_command():
    space = _lmdeploy(num_draft_tokens=(1, 2, 3), memory_fraction=(0.7, 0.8), max_batch_size=(64, 128))
    grid = space.grid()
    keys = [cfg.key() for _, cfg in grid]
    assert len(keys) == len(set(keys))
    # off: 2 backends x 2 mem x 2 bs; on: 3 drafts x 2 x 2
    assert len(grid) == 2 * 2 * 2 + 3 * 2 * 2
    # A draft value given with speculation off is the same engine as no draft value.
    a = space.to_engine_config({"speculative": False, "num_draft_tokens": 3, "memory_fraction": 0.8,
                                "max_batch_size": 64, "backend": "pytorch"})
    b = space.to_engine_config({"speculative": False, "memory_fraction": 0.8, "max_batch_size": 64,
                                "backend": "pytorch"})
    assert a.key() == b.key()
    # Float noise from a stepped distribution does not make a new engine.
    c = space.to_engine_config({"speculative": False, "memory_fraction": 0.7999999999999999, "max_batch_size": 64,
                                "backend": "pytorch"})
    assert c.key() == b.key()


def test_sglang_steps_map_to_lmdeploy_draft_tokens():
    assert from_sglang(3, 4) == 3
    assert to_sglang(3) == (3, 4)
    with pytest.raises(ConfigError, match="steps \\+ 1"):
        from_sglang(3, 3)
    space = _lmdeploy()
    cfg = space.to_engine_config({"speculative": True, "num_draft_tokens": from_sglang(3, 4)})
    argv = cfg.command(host="h", port=1)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "3"


def test_baselines_come_first_without_widening_the_searched_space():
    space = _lmdeploy(num_draft_tokens=(1, 2), memory_fraction=(0.6, 0.7)).with_baselines()
    # (a space offering TurboMind next to the PyTorch engine also measures one TurboMind search point)
    assert [p.role for p in space.points] == [ROLE_MTP_OFF, ROLE_STATIC, ROLE_SEARCH]
    assert space.num_draft_tokens == (1, 2) and space.memory_fraction == (0.6, 0.7)
    off = space.to_engine_config(space.points[0].params)
    static = space.to_engine_config(space.points[1].params)
    assert not off.speculative and off.backend == Backend.PYTORCH and off.memory_fraction == 0.8
    assert static.speculative and static.num_draft_tokens == 4 and static.memory_fraction == 0.8
    grid_keys = {cfg.key() for _, cfg in space.grid()}
    assert off.key() not in grid_keys and static.key() not in grid_keys
    # A point outside the space is all constants (no score credited to its in-space values); a point
    # inside it is all suggestions (TPE learns from it).
    assert space.split_point(space.points[1].params) == ({}, dict(space.points[1].params))
    inside = {"speculative": True, "num_draft_tokens": 2, "memory_fraction": 0.7, "max_batch_size": 256}
    assert space.split_point(inside) == (inside, {})


def test_searcher_never_proposes_a_baseline_value_outside_the_space():
    space = _lmdeploy(num_draft_tokens=(1, 2), memory_fraction=(0.15, 0.25, 0.35),
                      off_backends=("turbomind",)).with_baselines()
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, multivariate=True, group=True,
                                                                   n_startup_trials=4))
    for p in space.points:
        suggested, fixed = space.split_point(p.params)
        study.enqueue_trial(suggested, user_attrs={"role": p.role, "extra_flags": [], "fixed": fixed})
    configs = []
    for _ in range(40):
        t = study.ask()
        out = space(t)
        configs.append((out["role"], space.config_from_trial_config({**t.params, **out})))
        study.tell(t, 1.0)
    (r0, off), (r1, static) = configs[:2]
    assert (r0, r1) == (ROLE_MTP_OFF, ROLE_STATIC)
    assert off.backend == Backend.PYTORCH and not off.speculative and off.memory_fraction == 0.8
    assert static.num_draft_tokens == 4 and static.memory_fraction == 0.8
    searched = [c for role, c in configs[2:]]
    assert all(role == "search" for role, _ in configs[2:])
    assert {c.memory_fraction for c in searched} <= {0.15, 0.25, 0.35}
    assert {c.num_draft_tokens for c in searched if c.speculative} <= {1, 2}
    assert {c.backend for c in searched if not c.speculative} == {Backend.TURBOMIND}
    assert study.trials[0].params == {} and study.trials[1].params == {}  # references, not TPE evidence
    from optuna.search_space import _GroupDecomposedSearchSpace

    groups = _GroupDecomposedSearchSpace().calculate(study).search_spaces
    assert {"memory_fraction", "max_batch_size", "speculative"} <= set().union(*groups)
    assert any({"memory_fraction", "speculative"} <= set(g) for g in groups)  # still modelled jointly


def test_enqueued_point_keeps_role_and_extra_flags():
    space = SearchSpace(engine="sim", model="intern-s2-preview-8xh200", tp=8,
                        points=(NamedPoint("fault", {"speculative": True, "num_draft_tokens": 2,
                                                     "memory_fraction": 0.8, "max_batch_size": 64},
                                           ("--fault", "crash-at-start")),))
    study = optuna.create_study()
    p = space.points[0]
    study.enqueue_trial(dict(p.params), user_attrs={"role": p.role, "extra_flags": list(p.extra_flags)})
    t = study.ask()
    out = space(t)
    assert out["role"] == "fault" and out["extra_flags"] == ["--fault", "crash-at-start"]
    cfg = space.config_from_trial_config({**t.params, **out})
    assert cfg.extra_flags == ("--fault", "crash-at-start") and cfg.num_draft_tokens == 2


def test_yaml_narrows_and_validates(tmp_path):
    f = tmp_path / "space.yaml"
    f.write_text("space:\n  speculative: [true]\n  num_draft_tokens: {low: 2, high: 4}\n"
                 "  memory_fraction: [0.85]\n  max_batch_size: [128]\n")
    data = load_space_file(f)["space"]
    space = SearchSpace.from_mapping(data, engine="lmdeploy", model="/m", tp=8)
    assert space.size() == 3 and space.num_draft_tokens == (2, 3, 4)
    with pytest.raises(ConfigError, match="unknown search-space key"):
        SearchSpace.from_mapping({"num_drafts": [1]}, model="/m")
    with pytest.raises(ConfigError, match="memory_fraction"):
        SearchSpace.from_mapping({"memory_fraction": [1.5]}, model="/m")
    with pytest.raises(ConfigError, match=r"off_backends \['sglang'\] invalid; allowed: \['pytorch', 'turbomind', 'vllm'\]"):
        SearchSpace.from_mapping({"off_backends": ["sglang"]}, model="/m")
    with pytest.raises(ConfigError, match=r"spec_backends \['turbomind'\] invalid; allowed: the engines that speculate"):
        SearchSpace.from_mapping({"spec_backends": ["turbomind"]}, model="/m")


def test_the_engine_axis_spans_engine_families():
    """MTP on: PyTorch or vLLM; MTP off: any engine. Every point renders its own engine's command."""
    space = SearchSpace(model="/m", tp=1, num_draft_tokens=(2, 3), memory_fraction=(0.8,), max_batch_size=(64,),
                        off_backends=("pytorch", "vllm"), spec_backends=("pytorch", "vllm"))
    assert space.engines == ("pytorch", "vllm")
    configs = [cfg for _, cfg in space.grid()]
    assert {(c.backend, c.speculative) for c in configs} == {("pytorch", True), ("vllm", True), ("pytorch", False),
                                                             ("vllm", False)}
    assert len(configs) == 2 * 2 + 2
    vllm_mtp = space.to_engine_config({"speculative": True, "spec_backend": "vllm", "num_draft_tokens": 3,
                                       "memory_fraction": 0.8, "max_batch_size": 64})
    assert "--speculative-config" in vllm_mtp.command(host="h", port=1)
    sim = space.replace(engine="sim", model="intern-s2-preview-8xh200")
    assert {c.engine_name for _, c in sim.grid()} == {"pytorch", "vllm"} and all(c.simulated for _, c in sim.grid())
    with pytest.raises(ConfigError, match="no vllm constants"):
        space.replace(engine="sim", model="tiny-qwen35-1xh200")


def test_buckets_default_names_and_validation():
    buckets = make_buckets()
    assert [b.name for b in buckets] == ["le1024", "le4096", "le8192", "le16384"]
    assert all(b.workload.input_len == 1024 and b.workload.range_ratio == 0.5 and b.workload.temperature == 0
               and b.workload.max_concurrency == 64 for b in buckets)
    two = make_buckets((1024,), concurrency_levels=(64, 128), num_prompts=64)
    assert two[0].workload_at(128).max_concurrency == 128 and two[0].workload_at(128).num_prompts == 128
    with pytest.raises(ConfigError, match="strictly increasing"):
        make_buckets((4096, 1024))
    with pytest.raises(ConfigError, match="strictly increasing"):
        make_buckets((1024,), concurrency_levels=(128, 64))
