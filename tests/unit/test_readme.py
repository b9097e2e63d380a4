"""The README stays a README: at most 350 lines (depth lives in docs/), its set-up and test commands
are the ones CI runs, and the relative links of the README and the docs pages it sends readers to
name files that exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 350
LINKED_PAGES = (README, ROOT / "docs/sweep.md", ROOT / "docs/serving.md",
                ROOT / "docs/analyses/sim_engine_cpu_2026-12-06.md")


def test_the_readme_has_at_most_350_lines():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_every_python_command_ci_runs_is_in_the_readme():
    ci = [ln.strip() for ln in (ROOT / ".ci/run").read_text().splitlines() if ln.strip().startswith("python3 -m")]
    assert len(ci) >= 3, ci  # the two installs and the test command
    readme = README.read_text()
    for command in ci:
        assert command in readme, command


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_name_existing_files(page: Path):
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    missing = [t for t in local if t and not (page.parent / t).exists()]
    assert not missing, missing
