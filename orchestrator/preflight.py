"""Preflight: can this node run the requested engine? Checked before an engine starts, because the
engine's own failures arrive minutes later (after weights load) and say less.

For LMDeploy's PyTorch engine with MTP speculation (LMDeploy 0.18 facts):

- the checkpoint must carry MTP heads: ``mtp_num_hidden_layers >= 1`` in ``config.json`` (top level
  or under ``text_config`` for multimodal checkpoints) *and* ``mtp.*`` tensors in the safetensors
  weights — a checkpoint converted or quantised without them loads, then fails or silently drafts
  nothing;
- LMDeploy >= 0.14 (first release with ``--speculative-algorithm qwen3_5_mtp``);
- FlashAttention-3 (``flash_attn_interface``): LMDeploy refuses speculation on CUDA without it.

For LMDeploy's TurboMind engine: its native module ``lmdeploy/turbomind/_turbomind*.so`` loads.
LMDeploy catches that import's failure and only says "native module is unavailable" once the server
has started, without naming the cause; the wheel's binary is a CUDA 12 build, so on a CUDA 13 node
it misses ``libcudart.so.12`` and ``libcublas.so.12`` (docs/turbomind.md). The load is attempted for
real in a child Python (the engine's interpreter and environment), so the loader names what is
missing and nothing CUDA-related is loaded into the orchestrating process.

Which checks an engine gets is its backend's word (``EngineBackend.preflight_checks``, e.g. vLLM's own
version check lives in :mod:`orchestrator.backends.vllm`); the checks themselves are here.

Weights are inspected by reading safetensors headers directly (8-byte little-endian length, then a
JSON header), so no torch is needed on the orchestrating node. Every failure says what to do.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator.config import EngineConfig
from orchestrator.errors import PreflightError
from orchestrator.hostinfo import package_version

__all__ = [
    "MIN_LMDEPLOY_VERSION",
    "check_fa3",
    "check_lmdeploy_version",
    "check_mtp_checkpoint",
    "check_model_path",
    "check_mtp_weights",
    "check_sim_profile",
    "check_turbomind",
    "is_hub_id",
    "preflight",
    "preflight_report",
    "safetensors_tensor_names",
]

logger = logging.getLogger(__name__)

MIN_LMDEPLOY_VERSION = "0.14"
_SIM_PROFILES_DIR = Path(__file__).resolve().parent / "sim" / "profiles"
_MAX_SAFETENSORS_HEADER = 512 * 1024 * 1024  # a header larger than this means the file is not safetensors

FA3_FIX = (
    "MTP speculative decoding on CUDA needs FlashAttention-3 (module `flash_attn_interface`); LMDeploy "
    "refuses speculation without it. A prebuilt `flash-attn-3` wheel is not on PyPI for every torch/CUDA "
    "pair, so build it for this node's torch and CUDA (Hopper GPUs, e.g. H100/H200): "
    "`git clone https://github.com/Dao-AILab/flash-attention && cd flash-attention/hopper && "
    "python setup.py install`. See the README's GPU section. Or run without speculation "
    "(speculative_algorithm=None)."
)


# ----- single checks --------------------------------------------------------------------------------
def check_lmdeploy_version(min: str = MIN_LMDEPLOY_VERSION) -> str:  # noqa: A002 (name from the brief)
    """LMDeploy is installed (without importing it: that pulls in torch) and ``>= min``.

    Returns the installed version.
    """
    fix = f"pip install 'lmdeploy>={min}' (or install this project with its [gpu] extra: pip install -e '.[gpu]')"
    version = package_version("lmdeploy")
    if version is None:
        raise PreflightError(f"LMDeploy is not installed in this Python environment; {fix}")
    if importlib.util.find_spec("lmdeploy") is None:
        raise PreflightError(
            f"LMDeploy {version} has package metadata but `import lmdeploy` cannot find the module "
            f"(a broken install?); reinstall: {fix}"
        )
    if _version_tuple(version) < _version_tuple(min):
        raise PreflightError(
            f"LMDeploy {version} is too old: MTP speculative decoding (qwen3_5_mtp) needs >= {min}; {fix}"
        )
    return version


def check_fa3() -> None:
    """FlashAttention-3 is importable (``import flash_attn_interface``).

    Imported for real, not just located: a build for another torch/CUDA is found but fails to load.
    """
    if importlib.util.find_spec("flash_attn_interface") is None:
        raise PreflightError(f"FlashAttention-3 is not installed. {FA3_FIX}")
    try:
        importlib.import_module("flash_attn_interface")
    except Exception as exc:  # ImportError, OSError (undefined symbol), RuntimeError from torch
        raise PreflightError(
            f"FlashAttention-3 is installed but fails to import ({type(exc).__name__}: {exc}); it was "
            f"probably built for another torch/CUDA. Rebuild it here. {FA3_FIX}"
        ) from None


_TURBOMIND_PROBE = r"""
import glob, importlib.machinery, importlib.util, json, os
def say(**kw):
    print("TURBOMIND_PROBE " + json.dumps(kw))
spec = importlib.util.find_spec("lmdeploy")  # locates the package without running its __init__
if spec is None or not spec.submodule_search_locations:
    say(status="no-lmdeploy")
    raise SystemExit
folder = os.path.join(list(spec.submodule_search_locations)[0], "turbomind")
binary = sorted(p for p in glob.glob(os.path.join(folder, "_turbomind*"))
                if p.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)))
if not binary:
    say(status="no-binary", folder=folder)
    raise SystemExit
try:
    import torch  # noqa: F401  (as lmdeploy.turbomind does first: its CUDA libraries load first)
except ImportError:
    pass
name = "lmdeploy.turbomind._turbomind"
loader = importlib.machinery.ExtensionFileLoader(name, binary[0])
try:
    importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, binary[0], loader=loader))
except (ImportError, OSError) as exc:
    say(status="load-failed", binary=binary[0], error=f"{type(exc).__name__}: {exc}")
else:
    say(status="ok", binary=binary[0])
"""
"""Run in the engine's Python: loads TurboMind's binary the way ``lmdeploy.turbomind`` does (torch
first), without importing LMDeploy itself, and prints one ``TURBOMIND_PROBE {json}`` line."""

TURBOMIND_DOC = "docs/turbomind.md"

_MISSING_LIBRARY_FIX = {
    "libcudart.so.12": (
        "the CUDA 12 runtime. On a CUDA 12 node `pip install lmdeploy==0.18.0` brings it "
        "(nvidia-cuda-runtime-cu12); on a CUDA 13 node install that wheel too "
        "(`pip install nvidia-cuda-runtime-cu12`, ~3.5 MB) or copy its libcudart.so.12 into {lib}"
    ),
    "libcublas.so.12": (
        "cuBLAS 12. On a CUDA 12 node `pip install nvidia-cublas-cu12`; on a CUDA 13 node either that "
        "wheel (~580 MB) or the six-call pass-through to cuBLAS 13: "
        "`bash benchmarks/gpu/staging/turbomind/build_shim.sh {lib}`"
    ),
    "libcublasLt.so.12": (
        "cuBLASLt 12 (linked, never called). `pip install nvidia-cublas-cu12`, or on a CUDA 13 node "
        "`bash benchmarks/gpu/staging/turbomind/build_shim.sh {lib}` (builds an empty stand-in with the cuBLAS shim)"
    ),
    "libnccl.so.2": (
        "NCCL. `pip install nvidia-nccl-cu12` (CUDA 12) or nvidia-nccl-cu13 (torch's CUDA 13 build brings "
        "it); or put its lib folder on LD_LIBRARY_PATH"
    ),
    "libcuda.so.1": "the NVIDIA driver's library: this node has no NVIDIA driver (TurboMind needs a GPU node)",
}


def check_turbomind(*, python: str | None = None, env: Mapping[str, str] | None = None,
                    timeout_s: float = 180.0) -> str:
    """LMDeploy's TurboMind binary loads in ``python`` (default: this interpreter) under ``env``
    (merged over this environment: pass the engine's own, e.g. its ``LD_LIBRARY_PATH``).

    Returns the binary's path. Raises :class:`PreflightError` naming the missing library and its fix.
    """
    argv = [python or sys.executable, "-c", _TURBOMIND_PROBE]
    full_env = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=full_env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(f"cannot run {argv[0]!r} to check TurboMind's binary ({exc})") from None
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("TURBOMIND_PROBE ")), None)
    if line is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PreflightError(
            f"the TurboMind check in {argv[0]!r} ended without an answer (exit {done.returncode}): "
            f"{' / '.join(tail) or 'no output'}"
        )
    probe = json.loads(line.split(" ", 1)[1])
    return _turbomind_verdict(probe)


def _turbomind_verdict(probe: Mapping[str, str]) -> str:
    status = probe.get("status")
    if status == "ok":
        return probe["binary"]
    if status == "no-lmdeploy":
        raise PreflightError(
            "backend 'turbomind' needs LMDeploy: pip install lmdeploy==0.18.0 (it carries TurboMind's binary)"
        )
    if status == "no-binary":
        raise PreflightError(
            f"LMDeploy is installed without TurboMind's native module (no _turbomind*.so in {probe['folder']}; "
            f"a source or repacked install). Install the PyPI wheel (pip install --force-reinstall "
            f"lmdeploy==0.18.0) or build LMDeploy with TurboMind; see {TURBOMIND_DOC}"
        )
    error = probe.get("error", "")
    binary = probe.get("binary", "_turbomind")
    lib = os.path.join(os.path.dirname(binary), "lib")
    missing = re.search(r"([\w.+-]+\.so(?:\.[\w]+)*): cannot open shared object file", error)
    if missing:
        name = missing.group(1)
        fix = _MISSING_LIBRARY_FIX.get(name, "install the package that provides it, or put its folder on "
                                            "LD_LIBRARY_PATH").format(lib=lib)
        raise PreflightError(
            f"TurboMind's binary {binary} cannot load: {name} is missing. It needs {fix}. "
            f"The binary searches {lib} first. See {TURBOMIND_DOC}. (loader: {error})"
        )
    symbol = re.search(r"undefined symbol: (\S+)", error)
    if symbol:
        raise PreflightError(
            f"TurboMind's binary {binary} cannot load: a library it links lacks symbol {symbol.group(1)} "
            f"(another version than the one LMDeploy was built against); see {TURBOMIND_DOC}. (loader: {error})"
        )
    raise PreflightError(
        f"TurboMind's binary {binary} cannot load ({error}); it must match this Python and LMDeploy 0.18's "
        f"wheel (cp312 on PyPI); see {TURBOMIND_DOC}"
    )


def is_hub_id(model: str) -> bool:
    """``org/name`` of a model hub (not a local path): nothing to inspect offline."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model)) and not Path(model).exists()


def check_model_path(model: str) -> Path | None:
    """The model is an existing directory (returned) or a hub id (``None``, with a logged warning)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if is_hub_id(model):
        logger.warning(
            "model %r is not a local directory; treating it as a hub id and skipping the offline "
            "checkpoint checks (MTP weights). Download it first to have them checked.", model,
        )
        return None
    if path.exists():
        raise PreflightError(f"model path {model!r} is a file; pass the checkpoint directory (with config.json)")
    raise PreflightError(
        f"model path {model!r} does not exist; pass a checkpoint directory or a hub id like 'org/name'"
    )


def check_mtp_weights(model_dir: str | Path) -> None:
    """The checkpoint in ``model_dir`` declares MTP layers and ships their tensors."""
    model_dir = Path(model_dir)
    no_mtp_fix = (
        "use the original checkpoint with its MTP heads (quantised or converted copies often drop them), "
        "or run without speculation (speculative_algorithm=None)"
    )
    config_path = model_dir / "config.json"
    try:
        hf_config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise PreflightError(f"{config_path} not found; {model_dir} is not a Hugging Face checkpoint directory") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PreflightError(f"cannot read {config_path}: {exc}") from None
    layers = _mtp_layers(hf_config)
    if not layers:
        raise PreflightError(
            f"{config_path} declares no MTP layers (mtp_num_hidden_layers missing or 0, at top level and "
            f"under text_config), so MTP speculation has no draft heads; {no_mtp_fix}"
        )

    names, where = _checkpoint_tensor_names(model_dir)
    mtp_names = [n for n in names if _is_mtp_tensor(n)]
    if not mtp_names:
        raise PreflightError(
            f"{config_path} declares mtp_num_hidden_layers={layers} but {where} has no mtp.* tensors; "
            f"{no_mtp_fix}"
        )
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map", {})
        missing = sorted({weight_map[n] for n in mtp_names} - {p.name for p in model_dir.glob("*.safetensors")})
        if missing:
            raise PreflightError(
                f"{index_path.name} maps the mtp.* tensors to {missing}, which are missing from {model_dir}; "
                f"the download is incomplete — fetch those shards again"
            )


def check_sim_profile(name: str) -> None:
    """The simulator can load profile ``name`` (a shipped profile name or a path to a JSON file)."""
    try:
        from orchestrator.sim.model import load_profile
    except ImportError:
        load_profile = None
    if load_profile is not None:
        try:
            load_profile(name)
        except Exception as exc:
            raise PreflightError(
                f"simulator profile {name!r} cannot be loaded ({type(exc).__name__}: {exc}); "
                f"known profiles: {_known_profiles()}, or pass a path to a profile JSON file"
            ) from None
        return
    if (_SIM_PROFILES_DIR / f"{name}.json").is_file() or Path(name).is_file():
        return
    raise PreflightError(
        f"simulator profile {name!r} not found; known profiles: {_known_profiles()}, "
        f"or pass a path to a profile JSON file"
    )


# ----- all checks for a config ------------------------------------------------------------------
def preflight_report(config: EngineConfig, *, env: Mapping[str, str] | None = None) -> list[str]:
    """Every problem that stops ``config`` from running on this node (empty list: good to go).

    All checks run, so one report lists everything to fix. ``env``: what the engine's environment
    adds to this one (the TurboMind check loads the binary under it).
    """
    problems: list[str] = []
    for check in _checks_for(config, env):
        try:
            check()
        except PreflightError as exc:
            problems.append(str(exc))
    return problems


def preflight(config: EngineConfig, *, env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`PreflightError` listing every problem :func:`preflight_report` finds."""
    problems = preflight_report(config, env=env)
    if len(problems) == 1:
        raise PreflightError(problems[0])
    if problems:
        raise PreflightError(
            f"{len(problems)} problems with engine {config.label()}:\n" + "\n".join(f"- {p}" for p in problems)
        )


def _checks_for(config: EngineConfig, env: Mapping[str, str] | None = None) -> list[Callable[[], object]]:
    return config.engine.preflight_checks(config, env)


def check_mtp_checkpoint(model: str) -> None:
    """A local checkpoint carries MTP heads (:func:`check_mtp_weights`); a hub id is checked by the engine."""
    model_dir = check_model_path(model)
    if model_dir is not None:
        check_mtp_weights(model_dir)


# ----- helpers -------------------------------------------------------------------------------------
def _mtp_layers(hf_config: dict) -> int:
    for section in (hf_config, hf_config.get("text_config") or {}):
        value = section.get("mtp_num_hidden_layers") if isinstance(section, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return 0


def _is_mtp_tensor(name: str) -> bool:
    """``mtp.*`` — also under a prefix (``model.language_model.mtp.*``), as multimodal checkpoints nest it."""
    return name.startswith("mtp.") or ".mtp." in name


def _checkpoint_tensor_names(model_dir: Path) -> tuple[list[str], str]:
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PreflightError(f"cannot read the weight_map of {index_path}: {exc!r}") from None
        return list(weight_map), index_path.name
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise PreflightError(
            f"no safetensors weights (*.safetensors or model.safetensors.index.json) in {model_dir}; the MTP "
            f"check reads safetensors headers — convert or download the checkpoint in safetensors format"
        )
    names: list[str] = []
    for f in files:
        names += safetensors_tensor_names(f)
    return names, f"{len(files)} safetensors file(s)"


def safetensors_tensor_names(path: str | Path) -> list[str]:
    """Tensor names in a ``.safetensors`` file, from its header alone (no torch, no tensor data read)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise ValueError("file shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > _MAX_SAFETENSORS_HEADER:
                raise ValueError(f"header length {header_len} is implausible")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as exc:
        raise PreflightError(f"{path} is not a readable safetensors file ({exc}); re-download it") from None
    if not isinstance(header, dict):
        raise PreflightError(f"{path} has a malformed safetensors header; re-download it")
    return [k for k in header if k != "__metadata__"]


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def _known_profiles() -> list[str]:
    return sorted(p.stem for p in _SIM_PROFILES_DIR.glob("*.json"))
