"""Clock skew: the fleet test's replica processes (tests/fleet_replica.py, driven by
tests/test_fleet.py's ``Fleet``). On the hold path (``claims=0``), clock offsets up to
±(skew_tolerance - 100 ms) run every tick exactly once, and with offsets beyond the
tolerance a behind replica runs ticks again, as docs/scheduler.md says; with tick
claims (the default where the backend claims), the same offsets run every tick once."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.reliability.conftest import Measured
from tests.test_fleet import Fleet

pytestmark = [pytest.mark.faults, pytest.mark.slow]

TICKS = 8
LEASE_TTL = 1.0
LEADER_POLL = 0.25  # unused: per-job locks


class Counted(NamedTuple):
    """What a fleet run did with its (job, tick) pairs."""

    twice: int  # run more than once
    missed: int  # never run
    expected: int

    @property
    def said(self) -> str:
        """The measurement, as a row of the results table says it."""
        return f"{self.expected} (job, tick): {self.twice} twice, {self.missed} missed"


def _run(
    url: str,
    workdir: Path,
    offsets: tuple[float, ...],
    skew: float,
    grace: float,
    claims: bool = False,
) -> Counted:
    """Run the fleet for ``TICKS`` one-second ticks, on the hold path unless ``claims``."""
    path = () if claims else ("claims=0",)
    timing = (skew, grace, LEASE_TTL, LEADER_POLL)
    fleet = Fleet(url, workdir, "lock", offsets, timing, options=(path,) * len(offsets))
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
    twice = sum(1 for key, n in runs.items() if key in expected and n > 1)
    return Counted(twice, len(expected - set(runs)), len(expected))


@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_skew_within_the_tolerance_runs_every_tick_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, measured: Measured
) -> None:
    # The hold is 2 x 0.4 + 0.1 = 0.9 s, within the 1 s interval.
    skew, grace = 0.4, 0.1
    offset = skew - 0.1
    offsets = (-offset, 0.0, offset)
    url = request.getfixturevalue(f"{backend}_url")
    counted = _run(url, tmp_path, offsets, skew, grace)
    measured(
        f"clock offsets ±{offset * 1000:.0f} ms, skew_tolerance {skew:g} s",
        backend,
        "every (job, tick) exactly once",
        counted.said,
    )
    assert not counted.twice
    assert not counted.missed


def test_skew_beyond_the_tolerance_runs_ticks_again(
    postgres_url: str, tmp_path: Path, measured: Measured
) -> None:
    # Offsets ±250 ms against a 150 ms tolerance: the behind replica fires 500 ms
    # after the ahead one, after the winner's hold (2 x 0.15 + 0.05 = 0.35 s) ended,
    # and its own hold of the tick ends 150 ms before the ahead one tries the next.
    skew, grace, offset = 0.15, 0.05, 0.25
    offsets = (-offset, offset)
    counted = _run(postgres_url, tmp_path, offsets, skew, grace)
    measured(
        f"clock offsets ±{offset * 1000:.0f} ms, skew_tolerance {skew:g} s",
        "postgres",
        "the behind replica runs ticks again (docs/scheduler.md, its limits)",
        counted.said,
    )
    assert counted.twice > counted.expected / 2, "skew beyond the tolerance should duplicate ticks"
    assert not counted.missed


def test_skew_beyond_the_tolerance_with_tick_claims_runs_every_tick_once(
    postgres_url: str, tmp_path: Path, measured: Measured
) -> None:
    """The offsets that duplicate ticks on the hold path, with tick claims: each tick once."""
    skew, grace, offset = 0.15, 0.05, 0.25
    offsets = (-offset, offset)
    counted = _run(postgres_url, tmp_path, offsets, skew, grace, claims=True)
    measured(
        f"clock offsets ±{offset * 1000:.0f} ms, skew_tolerance {skew:g} s, tick claims",
        "postgres",
        "every (job, tick) exactly once (docs/scheduler.md, tick claims)",
        counted.said,
    )
    assert not counted.twice
    assert not counted.missed
