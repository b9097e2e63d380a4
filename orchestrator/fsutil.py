"""Files that readers may open at any moment, and the one way this project stamps times."""
from __future__ import annotations

import datetime as _dt
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_text", "utc_now_iso"]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part:
    a unique temp file in the same folder, flushed to disk, then ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def utc_now_iso() -> str:
    """Now, in UTC, to the second (``2026-12-01T14:38:45+00:00``)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
