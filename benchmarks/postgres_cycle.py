"""An uncontended try_acquire + release cycle of ``postgresql://``, against raw psycopg.

    python benchmarks/postgres_cycle.py           # the full run (about a minute)
    python benchmarks/postgres_cycle.py --quick   # a smoke run of a few seconds (CI)

Variants, sync and async, each timed per cycle on its own connection:

* ``multilock``: ``lease = locker.try_acquire(name)`` then ``lease.release()``;
* ``raw``: the seed's pattern on one psycopg connection, ``SELECT
  pg_try_advisory_lock(k)`` then ``SELECT pg_advisory_unlock(k)``;
* ``select1``: one ``SELECT 1`` round trip, the floor of any query.

Rounds interleave the variants in a shuffled order, so that drift in the machine's
load lands on all of them alike. Reported: median and p99 per cycle, and the
ratios multilock/raw (targets: sync at most 1.10, async 1.30). The server comes
from ``MULTILOCK_POSTGRES_URL`` (default: the local test database).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
from typing import Any

import psycopg
from _cycle import interleave, interleave_async, main, p99

import multilock
from multilock import advisory_key
from multilock.backend import LockURL
from multilock_postgres._config import parse_settings

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
TARGETS = {"sync": 1.10, "async": 1.30}
NAME = "multilock-benchmark-cycle"
KEY = advisory_key(NAME)


def _raw_connect_args(url: str) -> tuple[str, dict[str, Any]]:
    settings = parse_settings(LockURL.parse(url))
    return settings.conninfo, {"password": settings.password, "autocommit": True}


def run_sync(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the sync variants; returns microseconds per cycle by variant."""
    conninfo, kwargs = _raw_connect_args(url)
    with multilock.connect(url) as locker, psycopg.Connection.connect(conninfo, **kwargs) as conn:

        def ours() -> None:
            lease = locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            lease.release()

        def raw() -> None:
            conn.execute("SELECT pg_try_advisory_lock(%s)", (KEY,)).fetchone()
            conn.execute("SELECT pg_advisory_unlock(%s)", (KEY,)).fetchone()

        def select1() -> None:
            conn.execute("SELECT 1").fetchone()

        return interleave({"multilock": ours, "raw": raw, "select1": select1}, rounds, per_round)


async def run_async(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the async variants; returns microseconds per cycle by variant."""
    conninfo, kwargs = _raw_connect_args(url)
    locker = multilock.connect_async(url)
    conn = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
    try:

        async def ours() -> None:
            lease = await locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            await lease.release()

        async def raw() -> None:
            await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (KEY,))).fetchone()
            await (await conn.execute("SELECT pg_advisory_unlock(%s)", (KEY,))).fetchone()

        async def select1() -> None:
            await (await conn.execute("SELECT 1")).fetchone()

        variants = {"multilock": ours, "raw": raw, "select1": select1}
        return await interleave_async(variants, rounds, per_round)
    finally:
        await conn.close()
        await locker.aclose()


def report(api: str, samples: dict[str, list[float]]) -> float:
    """Print one API's table; return its multilock/raw median ratio."""
    medians = {variant: statistics.median(values) for variant, values in samples.items()}
    print(f"\n{api} API ({len(samples['raw'])} cycles per variant)")
    print(f"  {'variant':<10} {'median µs':>10} {'p99 µs':>10}")
    for variant, values in samples.items():
        print(f"  {variant:<10} {medians[variant]:>10.1f} {p99(values):>10.1f}")
    ratio = medians["multilock"] / medians["raw"]
    p99_ratio = p99(samples["multilock"]) / p99(samples["raw"])
    floor = medians["raw"] / medians["select1"]
    verdict = "meets" if ratio <= TARGETS[api] else "MISSES"
    print(
        f"  multilock/raw: median {ratio:.3f}x, p99 {p99_ratio:.3f}x"
        f" ({verdict} the {TARGETS[api]:.2f}x target); raw cycle = {floor:.2f} SELECT 1"
    )
    return ratio


def run(url: str, rounds: int, per_round: int) -> None:
    """Both APIs, one after the other."""
    report("sync", run_sync(url, rounds, per_round))
    report("async", asyncio.run(run_async(url, rounds, per_round)))


if __name__ == "__main__":
    url = os.environ.get("MULTILOCK_POSTGRES_URL", DEFAULT_URL)
    sys.exit(main(__doc__ or "", url, run))
