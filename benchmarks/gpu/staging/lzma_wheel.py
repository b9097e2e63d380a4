"""Rewrite a wheel with its members LZMA-compressed (zip method 14) instead of deflated.

Why: the device tool carries at most 64 MiB a call, and the large binaries in LMDeploy's, TileLang's
and z3's wheels shrink by a third or more under LZMA (TurboMind's 347 MB ``_turbomind`` module: 87 MB
deflated). pip installs such a wheel as it is (it reads wheels with :mod:`zipfile`, which reads
LZMA members), so the device's install step does not change. RECORD stays valid (its hashes are over
the uncompressed files); ``--drop MEMBER`` leaves a member out and its RECORD line with it (LMDeploy's
``lib64/libxgrammar.a``: a static library for builds, 11 MiB compressed, never loaded).

    python3 benchmarks/gpu/staging/lzma_wheel.py SRC.whl DST_DIR [--drop MEMBER ...]   # writes DST_DIR/<same name>
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import zipfile
from pathlib import Path

__all__ = ["lzma_wheel"]


def lzma_wheel(src: Path, dst_dir: Path, drop: frozenset[str] = frozenset()) -> Path:
    """The wheel at ``src`` rewritten under ``dst_dir`` with every member LZMA-compressed, less ``drop``."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / src.name
    tmp = dst.with_suffix(".tmp")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w") as zout:
        for info in zin.infolist():
            if info.filename in drop:
                continue
            if info.filename.endswith(".dist-info/RECORD") and drop:
                kept = [ln for ln in zin.read(info).decode().splitlines() if ln.split(",")[0] not in drop]
                zout.writestr(info.filename, "\n".join(kept) + "\n", compress_type=zipfile.ZIP_LZMA)
                continue
            out = copy.copy(info)  # the reader still needs the original's method
            out.compress_type = zipfile.ZIP_LZMA
            with zin.open(info) as fin, zout.open(out, "w") as fout:
                while chunk := fin.read(1 << 24):
                    fout.write(chunk)
    os.replace(tmp, dst)
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lzma_wheel.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst_dir", type=Path)
    ap.add_argument("--drop", action="append", default=[], help="a member to leave out (repeatable)")
    a = ap.parse_args(argv)
    dst = lzma_wheel(a.src, a.dst_dir, frozenset(a.drop))
    print(f"{a.src.name}: {a.src.stat().st_size / 2**20:.1f} MiB -> {dst.stat().st_size / 2**20:.1f} MiB (LZMA)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
