"""An uncontended try_acquire + release cycle of ``postgresql://``, against raw psycopg.

    python benchmarks/postgres_cycle.py           # the full run (about a minute)
    python benchmarks/postgres_cycle.py --quick   # a smoke run of a few seconds (CI)

Variants, sync and async, each timed per cycle on its own connection:

* ``multilock``: ``lease = locker.try_acquire(name)`` then ``lease.release()``;
* ``raw``: the seed's pattern on one psycopg connection, ``SELECT
  pg_try_advisory_lock(k)`` then ``SELECT pg_advisory_unlock(k)``;
* ``select1``: one ``SELECT 1`` round trip, the floor of any query;
* peer: tooz's PostgreSQL driver (sync only; it runs on psycopg2), left out when
  not installed (``pip install 'multilock-postgres[bench]'``).

Rounds interleave the variants call by call (ABBA), so that drift in the machine's
load lands on all of them alike. Reported: median and p99 per cycle, and the
ratios multilock/raw (targets: sync at most 1.10, async 1.30; ahead of tooz). The server comes
from ``MULTILOCK_POSTGRES_URL`` (default: the local test database).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import psycopg
from _cycle import (
    TARGETS,
    SyncCycle,
    Table,
    interleave,
    interleave_async,
    main,
    report,
    server_url,
    tooz_cycle,
)

import multilock
from multilock import advisory_key
from multilock.backend import LockURL
from multilock_postgres._config import parse_settings

QUICK, FULL = (5, 100), (40, 500)  # (rounds, cycles per round)
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

        variants: dict[str, SyncCycle] = {"multilock": ours, "raw": raw, "select1": select1}
        opened: list[Any] = []
        try:
            tooz = tooz_cycle(_tooz_url(url), NAME + "-tooz", opened)
            if tooz is not None:
                variants["tooz"] = tooz
            return interleave(variants, rounds, per_round)
        finally:
            for coordinator in opened:
                coordinator.stop()


def _tooz_url(url: str) -> str:
    # tooz's driver takes a libpq URL, without multilock's own query options.
    return url.split("?", 1)[0]


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


def run(url: str, rounds: int, per_round: int) -> list[Table]:
    """Time and report both APIs."""
    return [
        report("postgresql", "sync", run_sync(url, rounds, per_round), floor="select1",
               target=TARGETS["sync"]),
        report("postgresql", "async", asyncio.run(run_async(url, rounds, per_round)),
               floor="select1", target=TARGETS["async"]),
    ]  # fmt: skip


if __name__ == "__main__":
    url = server_url("postgresql")
    sys.exit(main(__doc__ or "", url, run, quick=QUICK, full=FULL))
