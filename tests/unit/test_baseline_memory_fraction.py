"""``--baseline-memory-fraction``: the baselines at a memory fraction of the user's choosing, so that on a
shared GPU (``--share-gpu``) their engines, and a decide phase's fresh ones, can start beside each other."""
from __future__ import annotations

import json

import pytest

from orchestrator.config import EngineConfig
from orchestrator.errors import ConfigError
from tuning.sweep import SweepSpec, _parser, build_spec
from tuning.sweep.space import ROLE_MTP_OFF, ROLE_STATIC, SearchSpace


def _baselines(space: SearchSpace) -> dict[str, dict]:
    return {p.role: p.params for p in space.with_baselines().points if p.role in (ROLE_MTP_OFF, ROLE_STATIC)}


def test_the_baselines_stay_at_lmdeploys_default_unless_told():
    space = SearchSpace(engine="sim", model="m", tp=1, memory_fraction=(0.06,))
    assert {p["memory_fraction"] for p in _baselines(space).values()} == {0.8}
    small = _baselines(space.replace(baseline_memory_fraction=0.06))
    assert {p["memory_fraction"] for p in small.values()} == {0.06}
    # at 0.8 a baseline reserves 0.9 of a shared GPU, at 0.06 0.16: six fit where one did
    assert EngineConfig(model="m", memory_fraction=0.8).gpu_request(share_gpu=True) == pytest.approx(0.9)
    assert EngineConfig(model="m", memory_fraction=0.06).gpu_request(share_gpu=True) == pytest.approx(0.16)


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, "lots"])
def test_a_fraction_outside_zero_to_one_is_refused(bad):
    with pytest.raises(ConfigError, match="baseline_memory_fraction"):
        SearchSpace(engine="sim", model="m", tp=1, baseline_memory_fraction=bad)


def test_the_flag_reaches_the_spec_and_its_saved_form(tmp_path):
    args = _parser().parse_args(["--model", str(tmp_path), "--tp", "1", "--share-gpu", "--memory-fraction", "0.06",
                                 "--baseline-memory-fraction", "0.06", "--buckets", "1024",
                                 "--run-dir", str(tmp_path / "run")])
    spec = build_spec(args)
    assert spec.space.baseline_memory_fraction == 0.06
    assert {p.params["memory_fraction"] for p in spec.space.points if p.role in (ROLE_MTP_OFF, ROLE_STATIC)} == {0.06}
    saved = json.loads(json.dumps(spec.to_dict()))
    assert SweepSpec.from_dict(saved).space == spec.space
    old = {**saved, "space": {k: v for k, v in saved["space"].items() if k != "baseline_memory_fraction"}}
    assert SweepSpec.from_dict(old).space.baseline_memory_fraction == 0.8  # a sweep.json from before the flag
    assert "--baseline-memory-fraction F" in " ".join(_parser().format_help().split())
