"""The vLLM backend (orchestrator/backends/vllm.py): its command line, checks, metric names, and the
simulator taking the same command line."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from orchestrator import preflight
from orchestrator.backends import get_backend
from orchestrator.backends import vllm as vllm_backend
from orchestrator.config import EngineConfig
from orchestrator.errors import PreflightError
from orchestrator.sim.__main__ import _engine_settings, build_parser

MTP3 = {"backend": "vllm", "model": "/models/q", "tp": 2, "speculative_algorithm": "qwen3_5_mtp", "num_draft_tokens": 3,
        "memory_fraction": 0.9, "max_batch_size": 64, "session_len": 32768}


def test_command_is_vllm_serve_with_mtp() -> None:
    argv = EngineConfig(**MTP3).command(host="127.0.0.1", port=8000, served_model_name="q")
    assert argv == [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/models/q",
        "--host", "127.0.0.1", "--port", "8000", "--served-model-name", "q",
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "64",
        "--max-model-len", "32768", "--max-num-batched-tokens", "8192", "--generation-config", "vllm",
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}',
    ]


def test_mtp_off_has_no_speculative_config_and_extra_flags_come_last() -> None:
    cfg = EngineConfig(**{**MTP3, "speculative_algorithm": None, "extra_flags": ("--enforce-eager",)})
    argv = cfg.command(host="h", port=1)
    assert "--speculative-config" not in argv and argv[-1] == "--enforce-eager"
    assert vllm_backend.speculative_config(cfg) is None
    assert cfg.label() == "vllm-nospec-mem0.9-bs64-tp2"


def test_metric_names_are_vllms_spec_decode_counters() -> None:
    m = get_backend("vllm").metrics
    assert (m.drafts, m.draft_tokens, m.accepted_tokens) == (
        "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total")
    assert (m.running, m.waiting) == ("vllm:num_requests_running", "vllm:num_requests_waiting")


def test_version_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import hostinfo

    for installed, match in ((None, "not installed"), ("0.25.1", "too old")):
        monkeypatch.setattr(hostinfo, "package_version", lambda name, v=installed: v)
        with pytest.raises(PreflightError, match=match):
            vllm_backend.check_vllm_version()
    monkeypatch.setattr(hostinfo, "package_version", lambda name: "0.26.0")
    assert vllm_backend.check_vllm_version() == "0.26.0"


def test_preflight_checks_the_mtp_heads(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_backend, "check_vllm_version", lambda: "0.26.0")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe"}))  # no MTP layers
    problems = preflight.preflight_report(EngineConfig(**{**MTP3, "model": str(tmp_path)}))
    assert len(problems) == 1 and "mtp" in problems[0].lower()
    assert preflight.preflight_report(EngineConfig(**{**MTP3, "model": str(tmp_path),
                                                      "speculative_algorithm": None})) == []


def test_the_simulator_takes_vllms_command_line() -> None:
    """A simulated vLLM is started with the real vLLM flags, and reads the same settings from them."""
    cfg = EngineConfig(**{**MTP3, "backend": "sim", "simulated_backend": "vllm", "model": "intern-s2-preview-8xh200"})
    argv = cfg.command(host="127.0.0.1", port=1)
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":3}'
    args = _engine_settings(build_parser().parse_args(argv[3:]))
    assert (args.backend, args.tp, args.max_batch_size, args.session_len) == ("vllm", 2, 64, 32768)
    assert (args.speculative_algorithm, args.speculative_num_draft_tokens) == ("qwen3_5_mtp", 3)
    assert args.cache_max_entry_count == 0.9
    with pytest.raises(ValueError, match="need --backend vllm"):
        _engine_settings(build_parser().parse_args(["--max-num-seqs", "4"]))
    with pytest.raises(ValueError, match="not LMDeploy's"):
        _engine_settings(build_parser().parse_args(["--backend", "vllm", "--max-batch-size", "4"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--backend", "vllm", "--speculative-config", '{"method": "ngram"}'])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (GPU nodes: docs/gpu.md)")
def test_vllms_own_parser_accepts_our_command() -> None:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = EngineConfig(**MTP3).command(host="127.0.0.1", port=8000, served_model_name="q")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[5:])
    assert args.max_num_seqs == 64 and args.tensor_parallel_size == 2
    assert args.speculative_config == {"method": "mtp", "num_speculative_tokens": 3}


VLLM_PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="q"} 100.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="q"} 300.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="q"} 210.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="q"} 3.0
"""


def test_the_bench_and_the_live_gauge_read_vllms_counters() -> None:
    from orchestrator.serve.metrics import AcceptLengthTracker, parse_prometheus_text
    from tuning.bench.counters import accept_length_from_counters, parse_spec_counters

    counters = parse_spec_counters(VLLM_PAGE)
    assert counters == {"num_drafts": 100.0, "num_draft_tokens": 300.0, "num_accepted_tokens": 210.0}
    assert accept_length_from_counters(counters, 3) == pytest.approx(1 + 210 / 100)
    tracker = AcceptLengthTracker.for_poll(3, 1.0, get_backend("vllm").metrics)
    before = parse_prometheus_text(VLLM_PAGE)
    assert tracker.update(before, 0) is None  # one scrape: no interval yet
    after = {**before, "vllm:spec_decode_num_draft_tokens_total": 600.0,
             "vllm:spec_decode_num_accepted_tokens_total": 450.0, "vllm:spec_decode_num_drafts_total": 200.0}
    assert tracker.update(after, 0) == pytest.approx(1 + 240 / 100)
