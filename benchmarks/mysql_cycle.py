"""An uncontended try_acquire + release cycle of ``mysql://``, against raw PyMySQL/aiomysql.

    python benchmarks/mysql_cycle.py           # the full run (about a minute)
    python benchmarks/mysql_cycle.py --quick   # a smoke run of a few seconds (CI)

Variants, sync and async, each timed per cycle on its own connection:

* ``multilock``: ``lease = locker.try_acquire(name)`` then ``lease.release()``;
* ``raw``: the pattern by hand on one connection, ``SELECT GET_LOCK(%s, 0)`` then
  ``SELECT RELEASE_LOCK(%s)`` (PyMySQL for sync, aiomysql for async: the drivers
  multilock uses);
* ``select1``: one ``SELECT 1`` round trip, the floor of any query;
* peers (sync only): tooz's MySQL driver and PyMySQLLock, left out when not installed
  (``pip install 'multilock-mysql[bench]'``). Both open a connection per acquisition.

Rounds interleave the variants call by call (ABBA), so that drift in the machine's
load lands on all of them alike. Reported: median and p99 per cycle, and the ratios
multilock/raw (targets: sync at most 1.10, async 1.30; ahead of every peer). The server
comes from ``MULTILOCK_MYSQL_URL`` (default: the local test database).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from _cycle import (
    TARGETS,
    SyncCycle,
    Table,
    interleave,
    interleave_async,
    main,
    optional,
    report,
    server_url,
    tooz_cycle,
)

import multilock
from multilock.backend import LockURL
from multilock_mysql._config import parse_settings
from multilock_mysql._runtime import async_connect, connect

QUICK, FULL = (5, 100), (40, 500)  # (rounds, cycles per round)
NAME = "multilock-benchmark-cycle"


def _settings(url: str) -> Any:
    return parse_settings(LockURL.parse(url))


def _pymysqllock_cycle(url: str, name: str) -> SyncCycle | None:
    """A cycle of PyMySQLLock (``None`` without it): a connection per acquisition."""
    module = optional("PyMySQLLock")
    if module is None:
        return None
    settings = _settings(url)
    locker = module.Locker(
        host=settings.host,
        port=settings.port,
        user=settings.user,
        password=settings.password or "",
        db=settings.database,
    )

    def cycle() -> None:
        lock = locker.lock(name)
        assert lock.acquire(timeout=0), "the PyMySQLLock benchmark lock is held elsewhere"
        lock.release()

    return cycle


def run_sync(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the sync variants; returns microseconds per cycle by variant."""
    conn = connect(_settings(url))
    cursor = conn.cursor()
    with multilock.connect(url) as locker:

        def ours() -> None:
            lease = locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            lease.release()

        def raw() -> None:
            cursor.execute("SELECT GET_LOCK(%s, 0)", (NAME,))
            cursor.fetchone()
            cursor.execute("SELECT RELEASE_LOCK(%s)", (NAME,))
            cursor.fetchone()

        def select1() -> None:
            cursor.execute("SELECT 1")
            cursor.fetchone()

        variants: dict[str, SyncCycle] = {"multilock": ours, "raw": raw, "select1": select1}
        opened: list[Any] = []
        try:
            tooz = tooz_cycle(url.split("?", 1)[0], NAME + "-tooz", opened)
            if tooz is not None:
                variants["tooz"] = tooz
            pymysqllock = _pymysqllock_cycle(url, NAME + "-pymysqllock")
            if pymysqllock is not None:
                variants["pymysqllock"] = pymysqllock
            return interleave(variants, rounds, per_round)
        finally:
            for coordinator in opened:
                coordinator.stop()
            conn.close()


async def run_async(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the async variants; returns microseconds per cycle by variant."""
    locker = multilock.connect_async(url)
    conn = await async_connect(_settings(url))
    cursor = await conn.cursor()
    try:

        async def ours() -> None:
            lease = await locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            await lease.release()

        async def raw() -> None:
            await cursor.execute("SELECT GET_LOCK(%s, 0)", (NAME,))
            await cursor.fetchone()
            await cursor.execute("SELECT RELEASE_LOCK(%s)", (NAME,))
            await cursor.fetchone()

        async def select1() -> None:
            await cursor.execute("SELECT 1")
            await cursor.fetchone()

        variants = {"multilock": ours, "raw": raw, "select1": select1}
        return await interleave_async(variants, rounds, per_round)
    finally:
        conn.close()
        await locker.aclose()


def run(url: str, rounds: int, per_round: int) -> list[Table]:
    """Time and report both APIs."""
    return [
        report("mysql", "sync", run_sync(url, rounds, per_round), floor="select1",
               target=TARGETS["sync"]),
        report("mysql", "async", asyncio.run(run_async(url, rounds, per_round)),
               floor="select1", target=TARGETS["async"]),
    ]  # fmt: skip


if __name__ == "__main__":
    url = server_url("mysql")
    sys.exit(main(__doc__ or "", url, run, quick=QUICK, full=FULL))
