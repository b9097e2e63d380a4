"""Preflight on tiny fake checkpoints and fake installed packages (real files on sys.path, no mocks)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import shutil
import struct
import subprocess
import sys
import sysconfig
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
    check_turbomind,
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
    """Non-speculative PyTorch: no MTP, LMDeploy-version or FA3 checks."""
    preflight(EngineConfig(backend="pytorch", model="internlm/Intern-S2-Preview", tp=2))
    with pytest.raises(PreflightError, match="does not exist"):
        preflight(EngineConfig(backend="pytorch", model=str(tmp_path / "missing")))


# ----- TurboMind's binary: real shared objects, loaded for real in a child Python --------------------
CC = shutil.which("gcc") or shutil.which("cc")
PY_INCLUDE = sysconfig.get_paths()["include"]
needs_cc = pytest.mark.skipif(CC is None or not (Path(PY_INCLUDE) / "Python.h").is_file(),
                              reason="needs a C compiler and Python's headers to build test binaries")
EXTENSION = "_turbomind" + importlib.machinery.EXTENSION_SUFFIXES[0]
MODULE_C = """#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_turbomind", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__turbomind(void) { return PyModule_Create(&def); }
"""


def _cc(*args: str | Path) -> None:
    subprocess.run([CC, *map(str, args)], check=True, capture_output=True)


def build_shared_library(folder: Path, soname: str) -> Path:
    """A real (empty) shared object named ``soname``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.c").write_text("int mtp_autotune_test_symbol;\n")
    _cc("-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", folder / soname, folder / "empty.c")
    return folder / soname


def install_fake_turbomind(site: Path, tmp_path: Path, needs: str) -> Path:
    """LMDeploy's layout (``lmdeploy/turbomind/_turbomind*.so`` with RUNPATH ``$ORIGIN/lib``): a real
    Python extension linked against a library ``needs``, which is then removed, as a CUDA 12 build of
    TurboMind finds no ``libcudart.so.12`` on a CUDA 13 node. Returns ``lmdeploy/turbomind/lib``."""
    install_fake_lmdeploy(site, "0.18.0")
    folder = site / "lmdeploy" / "turbomind"
    folder.mkdir()
    (folder / "module.c").write_text(MODULE_C)
    linked = build_shared_library(tmp_path / "linked", needs)
    _cc("-shared", "-fPIC", f"-I{PY_INCLUDE}", "-o", folder / EXTENSION, folder / "module.c",
        "-Wl,--no-as-needed", f"-L{linked.parent}", f"-l:{needs}", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib")
    shutil.rmtree(linked.parent)
    return folder / "lib"


def _child_path(site: Path) -> dict[str, str]:
    """The child Python finds the fake install first (``sys.path`` of the probe)."""
    return {"PYTHONPATH": str(site)}


@needs_cc
def test_turbomind_missing_cudart_names_it_and_the_fix_then_loads_once_it_is_there(
    site: Path, tmp_path: Path
) -> None:
    import ctypes

    try:
        ctypes.CDLL("libcudart.so.12")
        pytest.skip("this node has a real libcudart.so.12 on its library path")
    except OSError:
        pass
    lib = install_fake_turbomind(site, tmp_path, "libcudart.so.12")
    with pytest.raises(PreflightError) as info:
        check_turbomind(env=_child_path(site))
    message = str(info.value)
    assert "libcudart.so.12 is missing" in message
    assert "pip install lmdeploy==0.18.0" in message and "nvidia-cuda-runtime-cu12" in message
    assert str(lib) in message and "docs/turbomind.md" in message
    assert "cannot open shared object file" in message  # the loader's own words are kept

    build_shared_library(lib, "libcudart.so.12")  # the fix: the library where the binary looks first
    assert check_turbomind(env=_child_path(site)) == str(lib.parent / EXTENSION)


@needs_cc
def test_turbomind_any_missing_library_is_named(site: Path, tmp_path: Path) -> None:
    install_fake_turbomind(site, tmp_path, "libmtp_autotune_absent.so.7")
    problems = preflight_report(EngineConfig(backend="turbomind", model=str(tmp_path)), env=_child_path(site))
    assert len(problems) == 1
    assert "libmtp_autotune_absent.so.7 is missing" in problems[0]
    assert "LD_LIBRARY_PATH" in problems[0]


def test_turbomind_binary_absent_says_reinstall(site: Path, tmp_path: Path) -> None:
    """The repacked wheel the project carries for the PyTorch engine alone has no ``_turbomind``."""
    install_fake_lmdeploy(site, "0.18.0")
    (site / "lmdeploy" / "turbomind").mkdir()
    with pytest.raises(PreflightError, match=r"without TurboMind's native module .*lmdeploy==0\.18\.0"):
        check_turbomind(env=_child_path(site))


@pytest.mark.skipif(HAVE_LMDEPLOY, reason="LMDeploy is installed here")
def test_turbomind_without_lmdeploy_says_install(tmp_path: Path) -> None:
    problems = preflight_report(EngineConfig(backend="turbomind", model=str(tmp_path / "missing")))
    assert len(problems) == 2  # every problem at once: the engine and the model
    assert "needs LMDeploy: pip install lmdeploy==0.18.0" in problems[0]
    assert "does not exist" in problems[1]


def test_turbomind_check_runs_the_engines_python() -> None:
    with pytest.raises(PreflightError, match="cannot run '/no/such/python'"):
        check_turbomind(python="/no/such/python")


def test_sim_profiles() -> None:
    check_sim_profile("intern-s2-preview-8xh200")
    preflight(EngineConfig(backend="sim", model="intern-s2-preview-8xh200", tp=8))
    with pytest.raises(PreflightError, match=r"simulator profile 'no-such-profile'.*known profiles"):
        check_sim_profile("no-such-profile")
