"""Preflight: can this node run the requested engine? Checked before an engine starts, because the
engine's own failures arrive minutes later (after weights load) and say less.

For LMDeploy's PyTorch engine with MTP speculation (LMDeploy 0.18 facts):

- the checkpoint must carry MTP heads: ``mtp_num_hidden_layers >= 1`` in ``config.json`` (top level
  or under ``text_config`` for multimodal checkpoints) *and* ``mtp.*`` tensors in the safetensors
  weights — a checkpoint converted or quantised without them loads, then fails or silently drafts
  nothing;
- LMDeploy >= 0.14 (first release with ``--speculative-algorithm qwen3_5_mtp``);
- FlashAttention-3 (``flash_attn_interface``): LMDeploy refuses speculation on CUDA without it.

Weights are inspected by reading safetensors headers directly (8-byte little-endian length, then a
JSON header), so no torch is needed on the orchestrating node. Every failure says what to do.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import logging
import re
import struct
from collections.abc import Callable
from pathlib import Path

from orchestrator.config import Backend, EngineConfig
from orchestrator.errors import PreflightError

__all__ = [
    "MIN_LMDEPLOY_VERSION",
    "check_fa3",
    "check_lmdeploy_version",
    "check_model_path",
    "check_mtp_weights",
    "check_sim_profile",
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
    try:
        version = importlib.metadata.version("lmdeploy")
    except importlib.metadata.PackageNotFoundError:
        raise PreflightError(f"LMDeploy is not installed in this Python environment; {fix}") from None
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
def preflight_report(config: EngineConfig) -> list[str]:
    """Every problem that stops ``config`` from running on this node (empty list: good to go).

    All checks run, so one report lists everything to fix.
    """
    problems: list[str] = []
    for check in _checks_for(config):
        try:
            check()
        except PreflightError as exc:
            problems.append(str(exc))
    return problems


def preflight(config: EngineConfig) -> None:
    """Raise :class:`PreflightError` listing every problem :func:`preflight_report` finds."""
    problems = preflight_report(config)
    if len(problems) == 1:
        raise PreflightError(problems[0])
    if problems:
        raise PreflightError(
            f"{len(problems)} problems with engine {config.label()}:\n" + "\n".join(f"- {p}" for p in problems)
        )


def _checks_for(config: EngineConfig) -> list[Callable[[], object]]:
    if config.backend is Backend.SIM:
        return [lambda: check_sim_profile(config.model)]
    checks: list[Callable[[], object]] = []
    if config.backend is Backend.PYTORCH and config.speculative:
        checks += [check_lmdeploy_version, check_fa3]

        def model_checks() -> None:
            model_dir = check_model_path(config.model)
            if model_dir is not None:
                check_mtp_weights(model_dir)

        checks.append(model_checks)
    else:
        checks.append(lambda: check_model_path(config.model))
    return checks


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
