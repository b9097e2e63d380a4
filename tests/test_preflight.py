"""Preflight on tiny fake checkpoints and fake installed packages (real files on sys.path, no mocks)."""
from __future__ import annotations

import importlib.util
import json
import logging
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config import EngineConfig
from orchestrator.errors import PreflightError
from orchestrator.preflight import (
    check_fa3,
    check_lmdeploy_version,
    check_model_path,
    check_mtp_weights,
    check_sim_profile,
    preflight,
    preflight_report,
    safetensors_tensor_names,
)

HAVE_LMDEPLOY = importlib.util.find_spec("lmdeploy") is not None
HAVE_FA3 = importlib.util.find_spec("flash_attn_interface") is not None


# ----- fake checkpoints ------------------------------------------------------------------------------
def write_safetensors(path: Path, names: list[str]) -> None:
    """A valid safetensors file: 8-byte little-endian header length, JSON header, then tensor bytes
    (one float32 per tensor)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    for i, name in enumerate(names):
        header[name] = {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * (i + 1)]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0\0\0\0" * len(names))


BASE = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"]
MTP_TENSORS = ["mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight"]


def make_checkpoint(
    root: Path, *, mtp_layers: int | None = 1, nested: bool = False, tensors: list[str] | None = None,
    sharded: bool = False,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {"architectures": ["Qwen3_5ForConditionalGeneration"]}
    if mtp_layers is not None:
        if nested:
            config["text_config"] = {"mtp_num_hidden_layers": mtp_layers, "hidden_size": 64}
        else:
            config["mtp_num_hidden_layers"] = mtp_layers
    (root / "config.json").write_text(json.dumps(config))
    tensors = BASE + MTP_TENSORS if tensors is None else tensors
    if sharded:
        half = len(tensors) // 2
        shards = {"model-00001-of-00002.safetensors": tensors[:half],
                  "model-00002-of-00002.safetensors": tensors[half:]}
        for name, shard_tensors in shards.items():
            write_safetensors(root / name, shard_tensors)
        weight_map = {t: name for name, ts in shards.items() for t in ts}
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        write_safetensors(root / "model.safetensors", tensors)
    return root


def test_safetensors_header_names(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "a.safetensors", ["x", "mtp.y"])
    assert safetensors_tensor_names(tmp_path / "a.safetensors") == ["x", "mtp.y"]


@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "text_config"])
@pytest.mark.parametrize("sharded", [False, True], ids=["single-file", "index-json"])
def test_checkpoint_with_mtp_passes(tmp_path: Path, nested: bool, sharded: bool) -> None:
    check_mtp_weights(make_checkpoint(tmp_path / "ckpt", nested=nested, sharded=sharded))


def test_mtp_tensors_under_a_prefix_count(tmp_path: Path) -> None:
    check_mtp_weights(make_checkpoint(tmp_path / "ckpt", tensors=BASE + ["model.language_model.mtp.fc.weight"]))


@pytest.mark.parametrize("mtp_layers", [None, 0])
def test_config_without_mtp_layers_fails(tmp_path: Path, mtp_layers: int | None) -> None:
    with pytest.raises(PreflightError, match="declares no MTP layers") as info:
        check_mtp_weights(make_checkpoint(tmp_path / "ckpt", mtp_layers=mtp_layers))
    assert "speculative_algorithm=None" in str(info.value)


@pytest.mark.parametrize("sharded", [False, True], ids=["single-file", "index-json"])
def test_weights_without_mtp_tensors_fail(tmp_path: Path, sharded: bool) -> None:
    with pytest.raises(PreflightError, match=r"mtp_num_hidden_layers=1 but .* has no mtp\.\* tensors"):
        check_mtp_weights(make_checkpoint(tmp_path / "ckpt", tensors=BASE, sharded=sharded))


def test_missing_mtp_shard_is_an_incomplete_download(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", sharded=True)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(PreflightError, match="download is incomplete"):
        check_mtp_weights(ckpt)


def test_no_weights_or_no_config_fail(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(PreflightError, match="no safetensors weights"):
        check_mtp_weights(ckpt)
    with pytest.raises(PreflightError, match="config.json not found"):
        check_mtp_weights(tmp_path)


def test_corrupt_safetensors_fails(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt")
    (ckpt / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(PreflightError, match="not a readable safetensors file"):
        check_mtp_weights(ckpt)


def test_model_path_vs_hub_id(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert check_model_path(str(tmp_path)) == tmp_path
    with caplog.at_level(logging.WARNING, logger="orchestrator.preflight"):
        assert check_model_path("internlm/Intern-S2-Preview") is None
    assert "skipping the offline checkpoint checks" in caplog.text
    with pytest.raises(PreflightError, match="does not exist"):
        check_model_path(str(tmp_path / "missing"))


# ----- packages: real (absent) and fake installs on sys.path -----------------------------------------
@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path to "install" fake packages into; their modules are forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in ("lmdeploy", "flash_attn_interface"):
        sys.modules.pop(name, None)


def install_fake_lmdeploy(site: Path, version: str) -> None:
    (site / "lmdeploy").mkdir()
    (site / "lmdeploy" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    dist = site / f"lmdeploy-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: lmdeploy\nVersion: {version}\n")


def install_fake_fa3(site: Path, *, broken: bool = False) -> None:
    body = "raise ImportError('undefined symbol: _ZN3c10')\n" if broken else "def flash_attn_func(): pass\n"
    (site / "flash_attn_interface.py").write_text(body)


@pytest.mark.skipif(HAVE_LMDEPLOY, reason="LMDeploy is installed here")
def test_lmdeploy_missing_says_how_to_install() -> None:
    with pytest.raises(PreflightError) as info:
        check_lmdeploy_version()
    assert "not installed" in str(info.value)
    assert "pip install 'lmdeploy>=0.14'" in str(info.value) and "[gpu]" in str(info.value)


@pytest.mark.skipif(HAVE_LMDEPLOY, reason="LMDeploy is installed here")
def test_lmdeploy_version_is_compared(site: Path) -> None:
    install_fake_lmdeploy(site, "0.13.2")
    with pytest.raises(PreflightError, match=r"LMDeploy 0\.13\.2 is too old.*>= 0\.14"):
        check_lmdeploy_version()
    assert check_lmdeploy_version(min="0.13") == "0.13.2"


@pytest.mark.skipif(HAVE_FA3, reason="FlashAttention-3 is installed here")
def test_fa3_missing_explains_the_build() -> None:
    with pytest.raises(PreflightError) as info:
        check_fa3()
    message = str(info.value)
    assert "FlashAttention-3" in message and "flash_attn_interface" in message
    assert "hopper" in message and "python setup.py install" in message


@pytest.mark.skipif(HAVE_FA3, reason="FlashAttention-3 is installed here")
def test_fa3_present_or_broken(site: Path) -> None:
    install_fake_fa3(site, broken=True)
    with pytest.raises(PreflightError, match="installed but fails to import.*undefined symbol"):
        check_fa3()
    sys.modules.pop("flash_attn_interface", None)
    install_fake_fa3(site)
    check_fa3()


# ----- whole configs ---------------------------------------------------------------------------------
def mtp_config(model: str) -> EngineConfig:
    return EngineConfig(backend="pytorch", model=model, tp=8, speculative_algorithm="qwen3_5_mtp", num_draft_tokens=3)


@pytest.mark.skipif(HAVE_LMDEPLOY or HAVE_FA3, reason="needs a node without LMDeploy and FA3")
def test_preflight_lists_every_problem_on_a_cpu_node(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", tensors=BASE)
    problems = preflight_report(mtp_config(str(ckpt)))
    assert len(problems) == 3
    assert "LMDeploy is not installed" in problems[0]
    assert "FlashAttention-3" in problems[1]
    assert "no mtp.* tensors" in problems[2]
    with pytest.raises(PreflightError, match=r"^3 problems with engine pytorch-mtp3"):
        preflight(mtp_config(str(ckpt)))


@pytest.mark.skipif(HAVE_LMDEPLOY or HAVE_FA3, reason="needs a node without LMDeploy and FA3")
def test_preflight_passes_with_everything_in_place(
    site: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install_fake_lmdeploy(site, "0.18.0")
    install_fake_fa3(site)
    preflight(mtp_config(str(make_checkpoint(tmp_path / "ckpt"))))
    with caplog.at_level(logging.WARNING, logger="orchestrator.preflight"):
        preflight(mtp_config("internlm/Intern-S2-Preview"))  # hub id: weights not inspectable offline
    assert "hub id" in caplog.text


def test_preflight_without_speculation_only_needs_the_model(tmp_path: Path) -> None:
    """TurboMind and non-speculative PyTorch: no MTP, LMDeploy-version or FA3 checks."""
    preflight(EngineConfig(backend="turbomind", model=str(tmp_path), tp=2))
    preflight(EngineConfig(backend="pytorch", model="internlm/Intern-S2-Preview", tp=2))
    with pytest.raises(PreflightError, match="does not exist"):
        preflight(EngineConfig(backend="turbomind", model=str(tmp_path / "missing")))


def test_sim_profiles() -> None:
    check_sim_profile("intern-s2-preview-8xh200")
    preflight(EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8))
    with pytest.raises(PreflightError, match=r"simulator profile 'no-such-profile'.*known profiles"):
        check_sim_profile("no-such-profile")
