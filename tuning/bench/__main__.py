"""``python -m tuning.bench`` (see :mod:`tuning.bench.cli`)."""
from __future__ import annotations

import sys

from tuning.bench.cli import main

sys.exit(main())
