"""The simulation's helpers beside this file are imported as ``tests.sim.*``: the
repository root must be importable (pytest's importlib mode does not add it)."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
