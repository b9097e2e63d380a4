"""``python -m tuning.report`` after the base install (no matplotlib): a clear error naming the extra
to install, exit status 2, no traceback; and that extra exists and brings what the sweep's next
commands need (matplotlib for the report, optuna-dashboard for the study)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuning import report

ROOT = Path(__file__).resolve().parents[2]

# Runs the report's command line as ``python -m tuning.report`` does, with matplotlib made unimportable
# (``None`` in sys.modules makes every ``import matplotlib`` raise ImportError), as after the base install.
WITHOUT_MATPLOTLIB = (
    "import runpy, sys\n"
    "sys.modules['matplotlib'] = None\n"
    "sys.argv = ['tuning.report', *sys.argv[1:]]\n"
    "runpy.run_module('tuning.report', run_name='__main__')\n"
)


def test_without_matplotlib_the_report_names_the_extra_and_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert "matplotlib" in r.stderr and f"pip install -e '.[{report.REPORT_EXTRA}]'" in r.stderr, r.stderr
    assert not (tmp_path / "report").exists()


def test_the_hint_is_silent_when_matplotlib_imports(monkeypatch):
    pytest.importorskip("matplotlib")
    assert report.missing_extra_hint() is None
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert f"[{report.REPORT_EXTRA}]" in report.missing_extra_hint()


def test_the_named_extra_installs_matplotlib_and_optuna_dashboard():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extras[report.REPORT_EXTRA]}
    assert {"matplotlib", "optuna-dashboard"} <= names, extras[report.REPORT_EXTRA]
