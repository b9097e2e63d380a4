"""``python -m tuning.sweep``: see :mod:`tuning.sweep.cli`."""
from __future__ import annotations

import sys

from tuning.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
