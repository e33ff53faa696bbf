"""The cost of a tick: the claim path against the hold path, at 1 and 1,000 jobs due together.

    python benchmarks/tick_claims.py           # file, PostgreSQL, Redis, ZooKeeper
    python benchmarks/tick_claims.py --quick   # fewer repetitions (CI)

What the scheduler asks of the backend per tick, on one async locker, timed as it
does it. The *hold path*: the winner takes the N jobs' locks (one
``try_acquire_many``) and, its hold over, releases them (one release of many); a
loser's ``try_acquire_many`` is refused. The *claim path*: the winner claims the N
ticks (one ``claim_ticks``), takes the locks, and releases them as the runs end; a
loser's claim is refused and it stops there. Each repetition is a new tick (a later
fire time); the paths alternate; the median is kept. Bodies, timers and the hold's
wait are not counted: only the backend's part.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

from _cycle import reachable, server_url

import multilock

SIZES = (1, 1000)
REPEATS, QUICK_REPEATS = 10, 3
_BACKENDS = ("file", "postgresql", "redis", "zookeeper")


@dataclass(frozen=True)
class Row:
    """One backend, one size: median milliseconds per tick, winner and loser, each path."""

    backend: str
    n: int
    hold_win_ms: float
    hold_lose_ms: float
    claim_win_ms: float
    claim_lose_ms: float


async def _tick(
    winner: Any, loser: Any, names: list[str], fire: float, claim: bool
) -> tuple[float, float]:
    """One tick of ``names`` on both replicas: (winner's ms, loser's ms)."""
    start = time.perf_counter()
    if claim:
        won = await winner.claim_ticks(dict.fromkeys(names, fire))
        assert all(won.values())
    leases = await winner.try_acquire_many(names)
    assert all(lease is not None for lease in leases.values())
    middle = time.perf_counter()
    if claim:
        lost = await loser.claim_ticks(dict.fromkeys(names, fire))
        assert not any(lost.values())
    else:
        refused = await loser.try_acquire_many(names)
        assert not any(refused.values())
    end = time.perf_counter()
    await winner.release_many(list(leases.values()))
    released = time.perf_counter()
    return ((middle - start) + (released - end)) * 1000, (end - middle) * 1000


async def _measure(backend: str, url: str, n: int, repeats: int) -> Row:
    names = [f"bench-claims-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
    times: dict[tuple[bool, bool], list[float]] = {
        (c, w): [] for c in (False, True) for w in (False, True)
    }
    async with multilock.connect_async(url) as winner, multilock.connect_async(url) as loser:
        fire = time.time()
        await _tick(winner, loser, names, fire, True)  # connects, makes tables, warms caches
        await _tick(winner, loser, names, fire, False)
        for i in range(repeats):
            for claim in (i % 2 == 0, i % 2 == 1):  # ABBA-ish: the paths alternate first
                fire += 1.0
                won, lost = await _tick(winner, loser, names, fire, claim)
                times[claim, True].append(won)
                times[claim, False].append(lost)
    median = {key: statistics.median(values) for key, values in times.items()}
    return Row(
        backend,
        n,
        median[False, True],
        median[False, False],
        median[True, True],
        median[True, False],
    )


def measure(quick: bool, skipped: list[str]) -> list[Row]:
    """Every reachable backend at each size; unreachable ones go to ``skipped``."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="multilock-bench-claims-") as directory:
        for backend in _BACKENDS:
            url = f"file://{directory}" if backend == "file" else server_url(backend)
            if not reachable(url):
                skipped.append(f"claims on {backend}: server unreachable")
                continue
            for n in SIZES:
                rows.append(
                    asyncio.run(_measure(backend, url, n, QUICK_REPEATS if quick else REPEATS))
                )
                print(rows[-1], flush=True)
    return rows


def table(rows: list[Row]) -> list[str]:
    """The Markdown table of ``rows``."""
    out = [
        "| backend | jobs due | hold: winner ms | hold: loser ms | claim: winner ms"
        " | claim: loser ms | claim / hold, winner |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r.claim_win_ms / r.hold_win_ms if r.hold_win_ms else float("nan")
        out.append(
            f"| {r.backend} | {r.n} | {r.hold_win_ms:.2f} | {r.hold_lose_ms:.2f} |"
            f" {r.claim_win_ms:.2f} | {r.claim_lose_ms:.2f} | {ratio:.2f}x |"
        )
    return out


def main() -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    skipped: list[str] = []
    rows = measure(args.quick, skipped)
    print("\n".join(table(rows)))
    for reason in skipped:
        print(f"- not run: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
