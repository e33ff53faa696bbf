"""The old name of scripts/async_to_sync.py, kept while branches still call it.

    python scripts/unasync.py [--check]  # the same as python scripts/async_to_sync.py

Its rules moved to scripts/async_to_sync.toml; this alias goes once nothing calls it.
"""

from __future__ import annotations

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).with_name("async_to_sync.py")), run_name="__main__")
