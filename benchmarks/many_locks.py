"""Many due jobs at one tick: ``try_acquire_many`` of N names against N raw calls in a row.

    python benchmarks/many_locks.py           # N = 1, 10, 100, 1000 (about half a minute)
    python benchmarks/many_locks.py --quick   # N = 1, 10, 100, a few seconds (CI)

On PostgreSQL the raw pattern is N ``SELECT pg_try_advisory_lock(k)`` on one
psycopg connection; on Redis, N ``SET key token NX PX ttl`` on one redis-py
client. Only the acquisition is timed (releases are not). Each size is measured
a few times, multilock and raw alternating, and the median kept; the figures
are also given in round-trip times (``SELECT 1``, ``PING``), the target being
1000 locks in under 10.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import redis
from _cycle import server_url
from postgres_cycle import _raw_connect_args
from redis_cycle import TTL_MS, _client_url

import multilock
from multilock import advisory_key

TARGET_RTTS = 10.0
SIZES = (1, 10, 100, 1000)
QUICK_SIZES = (1, 10, 100)


@dataclass(frozen=True)
class Row:
    """One size on one backend: median milliseconds, and the round-trip time."""

    backend: str
    n: int
    ours_ms: float
    raw_ms: float
    rtt_ms: float

    @property
    def ours_rtts(self) -> float:
        """multilock's time in round trips."""
        return self.ours_ms / self.rtt_ms


def _ms(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def _rtt_ms(round_trip: Callable[[], object]) -> float:
    for _ in range(20):
        round_trip()
    return statistics.median(_ms(round_trip) for _ in range(200))


class _Raw:
    """The raw pattern on one backend: N acquisitions in a row, their undoing, a round trip."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.token = uuid.uuid4().hex
        self.pg: psycopg.Connection[tuple[Any, ...]] | None = None
        self.redis: redis.Redis | None = None
        if backend == "postgresql":
            conninfo, kwargs = _raw_connect_args(url)
            self.pg = psycopg.Connection.connect(conninfo, **kwargs)
        else:
            self.redis = redis.Redis.from_url(_client_url(url))

    def acquire(self, names: list[str]) -> None:
        """One ``pg_try_advisory_lock`` or ``SET NX PX`` per name, in a row."""
        if self.pg is not None:
            for name in names:
                self.pg.execute("SELECT pg_try_advisory_lock(%s)", (advisory_key(name),))
        else:
            assert self.redis is not None
            for name in names:
                self.redis.set(f"raw:{name}", self.token, nx=True, px=TTL_MS)

    def undo(self, names: list[str]) -> None:
        """Free what :meth:`acquire` took (not timed)."""
        if self.pg is not None:
            self.pg.execute("SELECT pg_advisory_unlock_all()")
        else:
            assert self.redis is not None
            self.redis.delete(*[f"raw:{name}" for name in names])

    def round_trip(self) -> None:
        """``SELECT 1`` or ``PING``."""
        if self.pg is not None:
            self.pg.execute("SELECT 1").fetchone()
        else:
            assert self.redis is not None
            self.redis.ping()

    def close(self) -> None:
        """Close the raw connection."""
        if self.pg is not None:
            self.pg.close()
        if self.redis is not None:
            self.redis.close()


def _size(
    locker: multilock.DistributedLock, raw: _Raw, n: int, repeats: int
) -> tuple[float, float]:
    """Median milliseconds to take ``n`` fresh names: multilock's, raw's."""
    names = [f"bench-many-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
    ours: list[float] = []
    raws: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        leases = locker.try_acquire_many(names)
        ours.append((time.perf_counter() - start) * 1000)
        taken = [lease for lease in leases.values() if lease is not None]
        assert len(taken) == n, "some benchmark locks were held elsewhere"
        for lease in taken:
            lease.release()
        raws.append(_ms(lambda: raw.acquire(names)))
        raw.undo(names)
    return statistics.median(ours), statistics.median(raws)


def measure(urls: dict[str, str], sizes: tuple[int, ...], repeats: int) -> list[Row]:
    """Median acquisition times per backend (``postgresql``, ``redis``) and size."""
    rows: list[Row] = []
    for backend, url in urls.items():
        raw = _Raw(backend, url)
        try:
            rtt = _rtt_ms(raw.round_trip)
            with multilock.connect(url) as locker:
                _size(locker, raw, 1, 3)  # warm-up: first queries, prepared statements
                for n in sizes:
                    row = Row(backend, n, *_size(locker, raw, n, repeats), rtt_ms=rtt)
                    rows.append(row)
                    print(
                        f"  {backend:<10} N={n:<5} multilock {row.ours_ms:8.2f} ms"
                        f" ({row.ours_rtts:6.1f} RTT)   raw {row.raw_ms:8.2f} ms"
                        f"   raw/multilock {row.raw_ms / row.ours_ms:6.1f}x",
                        flush=True,
                    )
        finally:
            raw.close()
    return rows


def main() -> int:
    """Parse ``--quick``, measure, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args()
    urls = {backend: server_url(backend) for backend in ("postgresql", "redis")}
    measure(urls, QUICK_SIZES if args.quick else SIZES, 2 if args.quick else 5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
