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

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

import multilock
from multilock import advisory_key
from multilock.backend import LockURL
from multilock_postgres._config import parse_settings

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
TARGETS = {"sync": 1.10, "async": 1.30}
NAME = "multilock-benchmark-cycle"

SyncCycle = Callable[[], object]
AsyncCycle = Callable[[], Awaitable[object]]


def _time_sync(cycle: SyncCycle, count: int, out: list[float]) -> None:
    clock = time.perf_counter_ns
    for _ in range(count):
        start = clock()
        cycle()
        out.append((clock() - start) / 1000.0)


async def _time_async(cycle: AsyncCycle, count: int, out: list[float]) -> None:
    clock = time.perf_counter_ns
    for _ in range(count):
        start = clock()
        await cycle()
        out.append((clock() - start) / 1000.0)


def _connect_raw(url: str) -> tuple[str, dict[str, Any]]:
    settings = parse_settings(LockURL.parse(url))
    return settings.conninfo, {"password": settings.password, "autocommit": True}


def run_sync(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the sync variants; returns microseconds per cycle by variant."""
    key = advisory_key(NAME)
    conninfo, kwargs = _connect_raw(url)
    samples: dict[str, list[float]] = {"multilock": [], "raw": [], "select1": []}
    with multilock.connect(url) as locker, psycopg.Connection.connect(conninfo, **kwargs) as conn:

        def ours() -> None:
            lease = locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            lease.release()

        def raw() -> None:
            conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()

        def select1() -> None:
            conn.execute("SELECT 1").fetchone()

        variants: dict[str, SyncCycle] = {"multilock": ours, "raw": raw, "select1": select1}
        for cycle in variants.values():  # warm up: connect, prepare, fill caches
            _time_sync(cycle, 50, [])
        order = list(variants)
        for _ in range(rounds):
            random.shuffle(order)
            for variant in order:
                _time_sync(variants[variant], per_round, samples[variant])
    return samples


async def run_async(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the async variants; returns microseconds per cycle by variant."""
    key = advisory_key(NAME)
    conninfo, kwargs = _connect_raw(url)
    samples: dict[str, list[float]] = {"multilock": [], "raw": [], "select1": []}
    locker = multilock.connect_async(url)
    conn = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
    try:

        async def ours() -> None:
            lease = await locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            await lease.release()

        async def raw() -> None:
            await (await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))).fetchone()
            await (await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))).fetchone()

        async def select1() -> None:
            await (await conn.execute("SELECT 1")).fetchone()

        variants: dict[str, AsyncCycle] = {"multilock": ours, "raw": raw, "select1": select1}
        for cycle in variants.values():
            await _time_async(cycle, 50, [])
        order = list(variants)
        for _ in range(rounds):
            random.shuffle(order)
            for variant in order:
                await _time_async(variants[variant], per_round, samples[variant])
    finally:
        await conn.close()
        await locker.aclose()
    return samples


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def report(api: str, samples: dict[str, list[float]]) -> float:
    """Print one API's table; return its multilock/raw median ratio."""
    medians = {variant: statistics.median(values) for variant, values in samples.items()}
    print(f"\n{api} API ({len(samples['raw'])} cycles per variant)")
    print(f"  {'variant':<10} {'median µs':>10} {'p99 µs':>10}")
    for variant, values in samples.items():
        print(f"  {variant:<10} {medians[variant]:>10.1f} {_p99(values):>10.1f}")
    ratio = medians["multilock"] / medians["raw"]
    p99_ratio = _p99(samples["multilock"]) / _p99(samples["raw"])
    floor = medians["raw"] / medians["select1"]
    verdict = "meets" if ratio <= TARGETS[api] else "MISSES"
    print(
        f"  multilock/raw: median {ratio:.3f}x, p99 {p99_ratio:.3f}x"
        f" ({verdict} the {TARGETS[api]:.2f}x target); raw cycle = {floor:.2f} SELECT 1"
    )
    return ratio


def main() -> int:
    """Run the benchmark; the exit status is 0 unless it could not run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--rounds", type=int, help="rounds of interleaved variants")
    parser.add_argument("--per-round", type=int, help="cycles per variant per round")
    args = parser.parse_args()
    rounds = args.rounds or (5 if args.quick else 40)
    per_round = args.per_round or (100 if args.quick else 500)
    url = os.environ.get("MULTILOCK_POSTGRES_URL", DEFAULT_URL)
    print(f"postgresql:// cycle benchmark against {multilock.backend.mask_url(url)}")
    print(f"{rounds} rounds x {per_round} cycles per variant, variants interleaved")
    try:
        report("sync", run_sync(url, rounds, per_round))
        report("async", asyncio.run(run_async(url, rounds, per_round)))
    except multilock.errors.BackendUnavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
