"""examples/replicas.py, the demo behind scripts/demo: exactly one run per tick."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "replicas.py"


def test_every_tick_runs_exactly_once() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--replicas=3", "--ticks=2", "--interval=1", "--skew=0.05"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    ticks = [line for line in lines if line.startswith("tick ")]
    assert len(ticks) == 2
    # A replica slowed past the misfire grace reports "late" rather than "skipped".
    assert all("(ran=1 " in line for line in ticks), ticks
    assert lines[-1] == "2 ticks, 2 runs, 0 duplicates, 0 missed"


def test_bad_arguments_are_refused() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--skew=0.9", "--interval=1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert re.search(r"need 0 <= --skew < --interval/2", result.stderr)
