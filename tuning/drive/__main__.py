"""``python -m tuning.drive``."""
from __future__ import annotations

import sys

from tuning.drive.cli import main

sys.exit(main())
