"""EngineConfig: validation at the edge, identity, and the one table that renders command lines."""
from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys

import pytest

from orchestrator.config import FLAG_TABLE, MAX_DRAFT_TOKENS, Backend, EngineConfig
from orchestrator.engine import engine_argv
from orchestrator.errors import ConfigError

MTP = dict(backend="pytorch", model="/models/Intern-S2-Preview", tp=8, speculative_algorithm="qwen3_5_mtp",
           num_draft_tokens=3, memory_fraction=0.85, max_batch_size=256, session_len=32768,
           max_prefill_tokens=8192)


# ----- validation ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("backend", "sglang", "known: ['pytorch', 'sim', 'turbomind', 'vllm']"),
        ("speculative_algorithm", "eagle3", "allowed: ['qwen3_5_mtp'] or None"),
        ("model", "  ", "non-empty"),
        ("tp", 0, "allowed: integers 1..64"),
        ("tp", 2.0, "allowed: integers 1..64"),
        ("num_draft_tokens", MAX_DRAFT_TOKENS + 1, f"allowed: integers 0..{MAX_DRAFT_TOKENS}"),
        ("num_draft_tokens", -1, f"allowed: integers 0..{MAX_DRAFT_TOKENS}"),
        ("memory_fraction", 0.0, "allowed: (0, 0.99]"),
        ("memory_fraction", 1.0, "allowed: (0, 0.99]"),
        ("memory_fraction", True, "allowed: (0, 0.99]"),
        ("max_batch_size", 0, "allowed: integers 1..4096"),
        ("session_len", 10, "allowed: integers 64..2097152"),
        ("max_prefill_tokens", 8, "allowed: integers 16..1048576"),
        ("extra_flags", "--eager-mode", "sequence of strings"),
    ],
)
def test_invalid_field_is_named_with_its_allowed_values(field: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig(**{**MTP, field: value})
    message = str(info.value)
    assert field in message or field == "model"
    assert allowed in message


def test_speculation_on_needs_draft_tokens() -> None:
    with pytest.raises(ConfigError, match=r"num_draft_tokens=0 .*allowed: 1\.\.8"):
        EngineConfig(**{**MTP, "num_draft_tokens": 0})


def test_turbomind_with_speculation_is_rejected_with_the_reason() -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig(**{**MTP, "backend": "turbomind"})
    message = str(info.value)
    assert "TurboMind" in message and "ignores speculative decoding" in message
    assert "backend='pytorch'" in message


def test_speculation_off_ignores_draft_count() -> None:
    off = dict(MTP, speculative_algorithm=None, num_draft_tokens=0)
    with_drafts = EngineConfig(**dict(off, num_draft_tokens=4))
    plain = EngineConfig(**off)
    assert with_drafts == plain
    assert with_drafts.key() == plain.key()
    assert with_drafts.num_draft_tokens == 0
    assert EngineConfig(**dict(off, speculative_algorithm="none")) == plain


# ----- identity --------------------------------------------------------------------------------------
def test_equal_configs_have_equal_keys_and_hash() -> None:
    a = EngineConfig(**MTP)
    b = EngineConfig(**{**MTP, "memory_fraction": 0.85000001, "backend": Backend.PYTORCH})
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert a.key() != a.replace(num_draft_tokens=2).key()
    assert a.key() != a.replace(extra_flags=("--eager-mode",)).key()
    assert a.key().startswith(a.label() + "-")


def test_key_is_stable_across_processes() -> None:
    """Keys name log files and result rows written by other processes; they must not depend on
    hash seeds or dict order."""
    code = (
        "import json,sys; from orchestrator.config import EngineConfig; "
        "print(EngineConfig(**json.loads(sys.argv[1])).key())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(MTP)], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
    )
    assert out.stdout.strip() == EngineConfig(**MTP).key()


def test_dict_round_trip_through_json() -> None:
    config = EngineConfig(**{**MTP, "extra_flags": ("--eager-mode",)})
    data = json.loads(json.dumps(config.to_dict()))
    assert data["backend"] == "pytorch" and data["extra_flags"] == ["--eager-mode"]
    assert EngineConfig.from_dict(data) == config


def test_unknown_key_is_rejected_by_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown engine config field\(s\) \['draft_tokens'\]"):
        EngineConfig.from_dict({**MTP, "draft_tokens": 3})


def test_configs_pickle() -> None:
    """Configs travel to Ray actors and Tune trials."""
    import pickle

    config = EngineConfig(**MTP)
    assert pickle.loads(pickle.dumps(config)) == config


# ----- command lines ---------------------------------------------------------------------------------
def test_pytorch_mtp_command() -> None:
    argv = EngineConfig(**MTP).command(host="127.0.0.1", port=23333, served_model_name="intern-s2")
    assert argv == [
        sys.executable, "-m", "lmdeploy", "serve", "api_server", "/models/Intern-S2-Preview", "--backend", "pytorch",
        "--server-name", "127.0.0.1", "--server-port", "23333", "--model-name", "intern-s2",
        "--tp", "8", "--cache-max-entry-count", "0.85", "--max-batch-size", "256",
        "--session-len", "32768", "--max-prefill-token-num", "8192",
        "--speculative-algorithm", "qwen3_5_mtp", "--speculative-num-draft-tokens", "3",
        "--distributed-executor-backend", "mp",  # tp > 1: TP workers stay off Ray (test below)
    ]


def test_turbomind_command_has_no_speculation_flags() -> None:
    config = EngineConfig(backend="turbomind", model="/m", tp=2, memory_fraction=0.9)
    argv = config.command(host="0.0.0.0", port=8000)
    assert argv == [
        sys.executable, "-m", "lmdeploy", "serve", "api_server", "/m", "--backend", "turbomind",
        "--server-name", "0.0.0.0", "--server-port", "8000",
        "--tp", "2", "--cache-max-entry-count", "0.9", "--max-prefill-token-num", "8192",
    ]


def test_sim_command_uses_the_same_flag_names() -> None:
    config = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8,
                          speculative_algorithm="qwen3_5_mtp", num_draft_tokens=4, max_batch_size=64)
    argv = config.command(host="127.0.0.1", port=9000)
    assert argv[:5] == [sys.executable, "-m", "orchestrator.sim", "--profile", "intern-s2-preview-8xh200"]
    assert argv[5:] == [
        "--server-name", "127.0.0.1", "--server-port", "9000", "--tp", "8",
        "--cache-max-entry-count", "0.8", "--max-batch-size", "64", "--max-prefill-token-num", "8192",
        "--speculative-algorithm", "qwen3_5_mtp", "--speculative-num-draft-tokens", "4",
    ]
    lmdeploy_flags = {spec.flag for spec in FLAG_TABLE}
    assert {a for a in argv[5:] if a.startswith("--")} <= lmdeploy_flags | {"--server-name", "--server-port"}


def test_engine_argv_keeps_pytorch_tp_workers_off_ray() -> None:
    config = EngineConfig(**MTP)
    argv = engine_argv(config, host="127.0.0.1", port=1)
    assert argv[-2:] == ["--distributed-executor-backend", "mp"]
    chosen = config.replace(extra_flags=("--distributed-executor-backend=ray",))
    assert "mp" not in engine_argv(chosen, host="127.0.0.1", port=1)
    assert "--distributed-executor-backend" not in engine_argv(config.replace(tp=1), host="h", port=1)
    turbomind = EngineConfig(backend="turbomind", model="/m", tp=4)
    assert "--distributed-executor-backend" not in engine_argv(turbomind, host="h", port=1)


def test_engine_argv_sim_only_flags() -> None:
    sim = EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8)
    argv = engine_argv(sim, host="h", port=1, sim_time_scale=20.0, sim_fault="crash-after:5")
    assert argv[-4:] == ["--time-scale", "20", "--fault", "crash-after:5"]
    with pytest.raises(ConfigError, match="backend='sim' only"):
        engine_argv(EngineConfig(**MTP), host="h", port=1, sim_fault="never-ready")


# ----- LMDeploy's own parser accepts our command line ------------------------------------------------
@functools.lru_cache(maxsize=1)
def _lmdeploy_parser():  # type: ignore[no-untyped-def]
    """LMDeploy's CLI parser with the ``serve api_server`` sub-command registered (once per process:
    registering twice is an argparse conflict)."""
    from lmdeploy.cli.cli import CLI
    from lmdeploy.cli.serve import SubCliServe

    SubCliServe.add_parsers()
    return CLI.parser


@pytest.mark.skipif(importlib.util.find_spec("lmdeploy") is None, reason="needs lmdeploy (GPU nodes: [gpu] extra)")
@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(**MTP),
        EngineConfig(**{**MTP, "speculative_algorithm": None, "max_batch_size": None, "session_len": None}),
        EngineConfig(backend="turbomind", model="/m", tp=2, memory_fraction=0.9, max_batch_size=128),
    ],
    ids=["pytorch-mtp-tp8", "pytorch-nospec", "turbomind"],
)
def test_lmdeploy_api_server_parser_accepts_our_command(config: EngineConfig) -> None:
    argv = engine_argv(config, host="127.0.0.1", port=23333, served_model_name="served")
    assert argv[:5] == [sys.executable, "-m", "lmdeploy", "serve", "api_server"]
    args = _lmdeploy_parser().parse_args(argv[3:])
    assert args.model_path == config.model
    assert args.backend == config.backend
    assert (args.server_name, args.server_port, args.model_name) == ("127.0.0.1", 23333, "served")
    assert args.tp == config.tp
    assert args.cache_max_entry_count == pytest.approx(config.memory_fraction)
    assert args.max_batch_size == config.max_batch_size
    assert args.session_len == config.session_len
    assert args.max_prefill_token_num == config.max_prefill_tokens
    if config.speculative:
        assert args.speculative_algorithm == "qwen3_5_mtp"
        assert args.speculative_num_draft_tokens == config.num_draft_tokens
    else:
        assert getattr(args, "speculative_algorithm", None) is None
    if config.backend == Backend.PYTORCH and config.tp > 1:
        assert args.distributed_executor_backend == "mp"
