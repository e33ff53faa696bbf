"""Connections: PostgreSQL server connections of one replica while 100 jobs run at once.

    python benchmarks/connections.py           # 100 jobs of 2 s
    python benchmarks/connections.py --quick   # 20 jobs of 0.5 s (CI)

* ``multilock``: one ``Scheduler`` on ``postgresql://`` with N distributed
  async jobs, each firing on the same tick and sleeping while it holds its lock;
* ``seed pattern``: one pooled connection per running job -- a psycopg_pool of
  size N, N threads each taking a connection for ``pg_try_advisory_lock``,
  sleeping, then ``pg_advisory_unlock``.

A sampler counts the rows of ``pg_stat_activity`` carrying each variant's
``application_name`` every 20 ms; reported: the peak, and how many jobs ran
at once. multilock always runs all N jobs: it needs one connection. The seed
pattern needs N, and a default server (``max_connections`` 100, a few in use)
has no room for 100 more: its N is lowered to the room left (and said so), which
is part of the finding.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from _cycle import server_url
from postgres_cycle import _raw_connect_args
from psycopg_pool import ConnectionPool

import multilock
from multilock import advisory_key

HEADROOM = 10  # connections left to the other users of a shared server
INTERVAL = 3  # seconds between ticks: the jobs wait at most this for their first one


@dataclass(frozen=True)
class Row:
    """One variant's peak connection count with ``jobs`` jobs running."""

    variant: str
    jobs: int
    concurrent: int
    connections: int


class _Concurrency:
    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.now = self.peak = self.done = 0

    def enter(self) -> None:
        with self.mutex:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.mutex:
            self.now -= 1
            self.done += 1


def _sampled(url: str, app: str, work: Callable[[], None]) -> int:
    """Run ``work`` while counting ``app``'s server connections; the peak count."""
    conninfo, kwargs = _raw_connect_args(url)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        with psycopg.Connection.connect(conninfo, **kwargs) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
                ).fetchone()
                peak = max(peak, row[0] if row else 0)
                stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        stop.set()
        sampler.join(timeout=10)
    return peak


def _with_app(url: str, app: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={app}"


def _multilock(url: str, jobs: int, hold: float) -> Row:
    app = f"bench-ml-{uuid.uuid4().hex[:6]}"
    running = _Concurrency()
    finished = asyncio.Event()

    async def job() -> None:
        running.enter()
        await asyncio.sleep(hold)
        running.leave()
        if running.done == jobs:
            finished.set()

    async def main() -> None:
        nonlocal finished
        finished = asyncio.Event()
        scheduler = multilock.Scheduler(_with_app(url, app), metrics=False)
        for index in range(jobs):
            scheduler.add_job(job, multilock.every(seconds=INTERVAL), name=f"{app}-{index}")
        async with scheduler:
            # The first tick comes within INTERVAL; past the deadline, the check below fails.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), INTERVAL + hold + 10)

    connections = _sampled(url, app, lambda: asyncio.run(main()))
    if running.done < jobs:
        raise RuntimeError(f"multilock: only {running.done} of {jobs} jobs ran")
    return Row("multilock", jobs, running.peak, connections)


def _seed(url: str, jobs: int, hold: float) -> Row:
    app = f"bench-seed-{uuid.uuid4().hex[:6]}"
    conninfo, kwargs = _raw_connect_args(url)
    running = _Concurrency()

    def work() -> None:
        pool = ConnectionPool(
            f"{conninfo} application_name={app}",
            kwargs=kwargs,
            min_size=1,
            max_size=jobs,
            open=True,
        )
        with pool:

            def job(index: int) -> None:
                key = advisory_key(f"{app}-{index}")
                with pool.connection() as conn:
                    conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                    running.enter()
                    time.sleep(hold)
                    running.leave()
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

            threads = [threading.Thread(target=job, args=(i,)) for i in range(jobs)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    connections = _sampled(url, app, work)
    return Row("seed pattern", jobs, running.peak, connections)


def _room(url: str) -> int:
    conninfo, kwargs = _raw_connect_args(url)
    with psycopg.Connection.connect(conninfo, **kwargs) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int - count(*) FROM pg_stat_activity"
        ).fetchone()
    return int(row[0]) if row else 0


def measure(url: str, jobs: int, hold: float) -> list[Row]:
    """multilock with ``jobs`` jobs; the seed pattern with as many of them as the
    server has connections left for."""
    room = _room(url) - HEADROOM
    seed_jobs = min(jobs, room)
    if seed_jobs < jobs:
        print(
            f"  the server has room for {room} more connections: the seed pattern's"
            f" {jobs} jobs lowered to {seed_jobs}"
        )
    rows = [_multilock(url, jobs, hold), _seed(url, seed_jobs, hold)]
    for row in rows:
        print(
            f"  {row.variant:<13} {row.jobs} jobs, {row.concurrent} at once:"
            f" {row.connections} server connections",
            flush=True,
        )
    return rows


def main() -> int:
    """Parse ``--quick``, measure, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 jobs of 0.5 s")
    args = parser.parse_args()
    measure(server_url("postgresql"), 20 if args.quick else 100, 0.5 if args.quick else 2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
