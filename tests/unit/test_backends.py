"""The engine-backend seam: registry, the interface every backend keeps, and that an engine is one file."""
from __future__ import annotations

import pkgutil
import sys
import textwrap

import pytest

from orchestrator import backends
from orchestrator.backends import (
    EngineBackend,
    MetricNames,
    get_backend,
    known_backends,
    spec_counter_names,
)
from orchestrator.config import API_DEFAULT_TEMPERATURE, EngineConfig
from orchestrator.errors import ConfigError


def test_every_module_of_the_package_registers_its_engines() -> None:
    modules = {m.name for m in pkgutil.iter_modules(backends.__path__)} - {"base"}
    registered = {type(get_backend(n)).__module__.rsplit(".", 1)[1] for n in known_backends()}
    assert registered == modules
    assert {"pytorch", "turbomind", "vllm", "sim"} <= set(known_backends())
    assert "sim" not in known_backends(simulatable=True)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown engine backend 'sglang'; known: \['pytorch', 'sim'"):
        get_backend("sglang")
    with pytest.raises(ConfigError, match="known:"):
        EngineConfig(backend="sglang", model="/m")


def test_a_name_registers_once() -> None:
    with pytest.raises(ConfigError, match="registered twice"):
        class Again(EngineBackend, name="vllm"):
            pass


@pytest.mark.parametrize("name", ["pytorch", "turbomind", "vllm"])
def test_real_engines_keep_the_interface(name: str) -> None:
    b = get_backend(name)
    cfg = EngineConfig(backend=name, model="/m", tp=2, max_batch_size=32)
    argv = cfg.command(host="127.0.0.1", port=8000, served_model_name="served")
    assert argv[0] == sys.executable and cfg.model in argv and "served" in argv and "8000" in argv
    assert b.memory_flag in argv and argv[argv.index(b.memory_flag) + 1] == "0.8"
    assert all(s.startswith(name.replace("pytorch", "lmdeploy").replace("turbomind", "lmdeploy") + ":")
               for s in (b.metrics.running, b.metrics.drafts, b.metrics.accepted_tokens))
    assert b.environment(cfg, [3, 5], {}) == {"CUDA_VISIBLE_DEVICES": "3,5"}
    assert b.environment(cfg, None, {}) == {}
    assert API_DEFAULT_TEMPERATURE[name] == b.default_temperature > 0
    assert cfg.engine_name == name and not cfg.simulated and cfg.gpu_request() == 2


def test_speculation_support_is_the_backends_word() -> None:
    spec = {"speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 3, "model": "/m"}
    for name in known_backends(simulatable=True):
        if get_backend(name).supports_speculation:
            assert EngineConfig(backend=name, **spec).speculative
        else:
            with pytest.raises(ConfigError, match=get_backend(name).no_speculation_reason[:40]):
                EngineConfig(backend=name, **spec)


@pytest.mark.parametrize("engine", ["pytorch", "turbomind", "vllm"])
def test_the_simulator_presents_itself_as_the_engine_it_stands_in_for(engine: str) -> None:
    sim = EngineConfig(backend="sim", simulated_backend=engine, model="intern-s2-preview-8xh200", tp=8)
    real = EngineConfig(backend=engine, model="/m", tp=8)
    assert sim.simulated and sim.engine_name == engine and sim.gpu_request() == 0
    assert sim.engine.metrics_for(sim) == real.engine.metrics
    # the same engine flags as the real engine's command
    assert sim.command(host="h", port=1)[-len(real.engine.flags(real)):] == real.engine.flags(real)
    env = sim.engine.environment(sim, [0], {"PYTHONPATH": "/x"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTHONPATH"].endswith("/x")


def test_spec_counter_names_cover_every_engine() -> None:
    names = spec_counter_names()
    assert names["lmdeploy:spec_decode_num_drafts_total"] == names["vllm:spec_decode_num_drafts_total"] == "num_drafts"
    assert names["vllm:spec_decode_num_accepted_tokens_total"] == "num_accepted_tokens"
    assert MetricNames.family("vllm:spec_decode_num_drafts_total") == "vllm:spec_decode_num_drafts"


def test_a_new_engine_is_one_module(tmp_path, monkeypatch) -> None:
    """Drop one file into the package and it is an engine: EngineConfig takes it, with its command."""
    pkg = tmp_path / "orchestrator" / "backends"
    pkg.mkdir(parents=True)
    (pkg / "toyengine.py").write_text(textwrap.dedent('''
        from orchestrator.backends.base import EngineBackend, MetricNames

        class Toy(EngineBackend, name="toy"):
            memory_flag = "--mem"
            default_temperature = 0.5
            metrics = MetricNames("toy:r", "toy:w", "toy:d_total", "toy:dt_total", "toy:a_total")

            def flags(self, config):
                return ["--mem", str(config.memory_fraction)]

            def command(self, config, *, host, port, served_model_name=None):
                return ["toy", config.model, "--port", str(port), *self.flags(config)]

            def preflight_checks(self, config, env=None):
                return []
    '''))
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(pkg)])
    backends._register_modules()  # what importing the package does: every module in it registers
    try:
        cfg = EngineConfig(backend="toy", model="/m")
        assert cfg.command(host="h", port=9) == ["toy", "/m", "--port", "9", "--mem", "0.8"]
        assert "toy" in known_backends() and cfg.label().startswith("toy-")
    finally:
        from orchestrator.backends import base

        base._REGISTRY.pop("toy", None)
        sys.modules.pop("orchestrator.backends.toyengine", None)
