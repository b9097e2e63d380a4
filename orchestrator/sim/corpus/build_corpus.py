"""Build ``corpus/stdlib_docs.txt``: real English/code text from the Python standard library's docstrings.

Run once (``python orchestrator/sim/corpus/build_corpus.py``) and commit the output; the simulator
never rebuilds it at run time so token counts stay identical across machines and Python versions.
Why docstrings: they are real prose with code mixed in (like LLM prompts), ship with every Python,
and carry no licence surprises (PSF). The size is capped so the package stays small.
"""
from __future__ import annotations

import importlib
import inspect
import io
import re
from contextlib import redirect_stdout
from pathlib import Path

MODULES = (
    "os", "json", "re", "collections", "functools", "itertools", "asyncio", "pathlib", "argparse",
    "logging", "subprocess", "threading", "statistics", "random", "string", "textwrap", "datetime",
    "decimal", "fractions", "heapq", "bisect", "typing", "dataclasses", "enum", "contextlib",
    "unittest", "email", "http.client", "urllib.parse", "csv", "sqlite3", "zipfile", "tarfile",
)
MAX_BYTES = 250_000
OUT = Path(__file__).with_name("stdlib_docs.txt")


def _docstrings(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    texts = [inspect.getdoc(module) or ""]
    for _, obj in sorted(vars(module).items()):
        if getattr(obj, "__module__", None) == module.__name__ and (inspect.isclass(obj) or inspect.isfunction(obj)):
            texts.append(inspect.getdoc(obj) or "")
    return [t for t in texts if len(t) > 40]


def build() -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        import this  # noqa: F401  (prints the Zen of Python)
    chunks = [buf.getvalue()]
    for name in MODULES:
        chunks.extend(_docstrings(name))
    text = "\n\n".join(chunks)
    text = re.sub(r"[^\x20-\x7e\n]", " ", text)  # plain ASCII: stable tokenization everywhere
    return text[:MAX_BYTES]


if __name__ == "__main__":
    OUT.write_text(build(), encoding="ascii")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
