"""Clock skew: the fleet test's replica processes (tests/fleet_replica.py, driven by
tests/test_fleet.py's ``Fleet``) with clock offsets up to ±(skew_tolerance - 100 ms)
run every tick exactly once; with offsets beyond the tolerance, a behind replica runs
ticks again, as docs/scheduler.md says ("Skew beyond the tolerance")."""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.reliability.conftest import Measured
from tests.test_fleet import Fleet

pytestmark = [pytest.mark.faults, pytest.mark.slow]

TICKS = 8
LEASE_TTL = 1.0
LEADER_POLL = 0.25  # unused: per-job locks


def _run(
    url: str, workdir: Path, offsets: tuple[float, ...], skew: float, grace: float
) -> tuple[Counter[tuple[str, int]], set[tuple[str, int]]]:
    """Run the fleet for ``TICKS`` one-second ticks; (runs per (job, tick), expected)."""
    fleet = Fleet(url, workdir, "lock", offsets, (skew, grace, LEASE_TTL, LEADER_POLL))
    fleet.start()
    try:
        first = math.ceil(time.time() + 1.5)  # every replica is scheduling by then
        last = first + TICKS
        time.sleep(max(0.0, last + 1.5 - time.time()))  # the latest replica has fired
    finally:
        codes = fleet.stop()
    assert codes == [0] * len(offsets), [fleet.stderr(i) for i in range(len(offsets))]
    runs = fleet.runs()
    expected = fleet.expected(first, last)
    return Counter({key: n for key, n in runs.items() if key in expected}), expected


@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_skew_within_the_tolerance_runs_every_tick_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, measured: Measured
) -> None:
    # The hold is 2 x 0.4 + 0.1 = 0.9 s, within the 1 s interval.
    skew, grace = 0.4, 0.1
    offset = skew - 0.1
    offsets = (-offset, 0.0, offset)
    runs, expected = _run(request.getfixturevalue(f"{backend}_url"), tmp_path, offsets, skew, grace)
    twice = sum(1 for n in runs.values() if n > 1)
    missed = len(expected - set(runs))
    measured(
        f"clock offsets ±{offset * 1000:.0f} ms, skew_tolerance {skew:g} s",
        backend,
        "every (job, tick) exactly once",
        f"{len(expected)} (job, tick): {twice} twice, {missed} missed",
    )
    assert not twice
    assert not missed


def test_skew_beyond_the_tolerance_runs_ticks_again(
    postgres_url: str, tmp_path: Path, measured: Measured
) -> None:
    # Offsets ±250 ms against a 150 ms tolerance: the behind replica fires 500 ms
    # after the ahead one, after the winner's hold (2 x 0.15 + 0.05 = 0.35 s) ended,
    # and its own hold of the tick ends 150 ms before the ahead one tries the next.
    skew, grace, offset = 0.15, 0.05, 0.25
    offsets = (-offset, offset)
    runs, expected = _run(postgres_url, tmp_path, offsets, skew, grace)
    twice = sum(1 for n in runs.values() if n > 1)
    missed = len(expected - set(runs))
    measured(
        f"clock offsets ±{offset * 1000:.0f} ms, skew_tolerance {skew:g} s",
        "postgres",
        "the behind replica runs ticks again (docs/scheduler.md, its limits)",
        f"{len(expected)} (job, tick): {twice} twice, {missed} missed",
    )
    assert twice > len(expected) / 2, "skew beyond the tolerance should duplicate ticks"
    assert not missed
