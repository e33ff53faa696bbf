"""Many due jobs at one tick: ``try_acquire_many`` of N names against N raw calls in a row.

    python benchmarks/many_locks.py           # N = 1 to 10,000 (a few minutes)
    python benchmarks/many_locks.py --quick   # N = 1, 10, 100, a few seconds (CI)
    python benchmarks/many_locks.py --delay 0 # loopback only, no delaying proxy
    python benchmarks/many_locks.py --sizes 1000,10000

On PostgreSQL the raw pattern is N ``SELECT pg_try_advisory_lock(k)`` on one
psycopg connection; on Redis, N ``SET key token NX PX ttl`` on one redis-py
client (up to 1,000 names); and the raw pattern in one batch, the floor of the
client library itself: the keys as one ``bigint[]`` through ``unnest`` to
``pg_try_advisory_lock``, or a redis-py pipeline of ``SET NX PX``. Only the
acquisition is timed (releases are not). Each size is measured a few times, the
variants alternating, and the median kept; the figures are also given in
round-trip times (``SELECT 1``, ``PING``), the target being 1,000 and 10,000
locks in under 10, and multilock's client CPU per name is reported, and the
server's own part of the raw batch (its execution, as the server measures it).

The names are the same N in every repetition, released in between, and both
sides have seen them before the timing starts: a scheduler's due jobs recur
tick after tick, so the locker has their advisory keys cached, and the raw side
is given its keys (``advisory_key(name)``, the Redis key) computed in advance
too. The first sight of a name costs more -- hashing it, a few microseconds on
PostgreSQL -- and is shown apart as "fresh": N names never seen before, each
repetition.

On loopback a round trip costs tens of microseconds, less than the client's own
work on a large batch. So everything is measured a second time through a local
proxy that delays each way by ``--delay`` milliseconds (benchmarks/_delay_proxy.py;
default 0.25, a LAN), where the round trips are what counts: one for
``try_acquire_many``, N for the raw pattern. The round-trip time given there is
measured through the proxy too.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis
from _cycle import server_url
from _delay_proxy import delayed
from postgres_cycle import _raw_connect_args
from redis_cycle import TTL_MS, _client_url

import multilock
from multilock import advisory_key
from multilock.abc import SupportsReleaseMany

TARGET_RTTS = 10.0
SIZES = (1, 10, 100, 1000, 10_000)
IN_A_ROW_MAX = 1000
"""The largest N for which the raw pattern one call at a time is measured: through
the proxy, 10,000 calls in a row take seconds a repetition and tell nothing new."""
QUICK_SIZES = (1, 10, 100)
DELAY_MS = 0.25
_DEFAULT_PORTS = {"postgresql": 5432, "redis": 6379}


@dataclass(frozen=True)
class Row:
    """One size on one backend: median milliseconds (names seen before, and fresh
    names for multilock; raw one call at a time, ``nan`` past :data:`IN_A_ROW_MAX`,
    and raw in one batch), the round-trip time, and multilock's client CPU per name."""

    backend: str
    n: int
    ours_ms: float
    raw_ms: float
    rtt_ms: float
    fresh_ms: float
    cpu_us_per_name: float
    batch_ms: float
    server_ms: float
    """The server's own work in the raw batch: the statement's execution on
    PostgreSQL, the time Redis spent executing its ``SET`` commands (``INFO
    commandstats``: reading and writing the protocol not counted), a floor no client
    can go under."""

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

    def keys(self, names: list[str]) -> list[Any]:
        """What :meth:`acquire` takes for ``names``, computed ahead of the timing:
        advisory keys, or Redis keys."""
        if self.pg is not None:
            return [advisory_key(name) for name in names]
        return [f"raw:{name}" for name in names]

    def acquire(self, keys: list[Any]) -> None:
        """One ``pg_try_advisory_lock`` or ``SET NX PX`` per key, in a row."""
        if self.pg is not None:
            for key in keys:
                self.pg.execute("SELECT pg_try_advisory_lock(%s)", (key,))
        else:
            assert self.redis is not None
            for key in keys:
                self.redis.set(key, self.token, nx=True, px=TTL_MS)

    def acquire_batch(self, keys: list[Any]) -> float:
        """All ``keys`` in one round trip, as a user would write it: the keys as one
        ``bigint[]`` through ``unnest`` to ``pg_try_advisory_lock``, or a pipeline of
        ``SET NX PX`` (the floor the client library itself sets). Returns the server's
        own milliseconds of it: the statement's, from its start to its result
        (``clock_timestamp()`` after the aggregate), or Redis's time in ``SET``."""
        if self.pg is not None:
            row = self.pg.execute(
                "SELECT array_agg(k),"
                " extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000"
                " FROM unnest(%s::bigint[]) AS k WHERE pg_try_advisory_lock(k)",
                (keys,),
            ).fetchone()
            assert row is not None
            return float(row[1])
        assert self.redis is not None
        before = self._set_usec()
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, self.token, nx=True, px=TTL_MS)
        pipe.execute()
        return (self._set_usec() - before) / 1000

    def _set_usec(self) -> int:
        """Microseconds Redis has spent in ``SET`` since its statistics were reset."""
        assert self.redis is not None
        stats: dict[str, Any] = self.redis.info("commandstats")
        return int(stats.get("cmdstat_set", {}).get("usec", 0))

    def undo(self, keys: list[Any]) -> None:
        """Free what :meth:`acquire` took (not timed)."""
        if self.pg is not None:
            self.pg.execute("SELECT pg_advisory_unlock_all()")
        else:
            assert self.redis is not None
            self.redis.delete(*keys)

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


def _take(
    locker: multilock.DistributedLock, names: list[str], cpu: list[float] | None = None
) -> float:
    """Milliseconds for multilock to take ``names``, all of them, then released (not
    timed); the thread's CPU seconds of the taking appended to ``cpu``."""
    start, started_cpu = time.perf_counter(), time.thread_time()
    leases = locker.try_acquire_many(names)
    elapsed = (time.perf_counter() - start) * 1000
    if cpu is not None:
        cpu.append(time.thread_time() - started_cpu)
    taken = [lease for lease in leases.values() if lease is not None]
    assert len(taken) == len(names), "some benchmark locks were held elsewhere"
    if isinstance(locker, SupportsReleaseMany):
        locker.release_many(taken)  # one round trip, not N
    else:
        for lease in taken:
            lease.release()
    return elapsed


def _size(
    locker: multilock.DistributedLock, raw: _Raw, n: int, repeats: int
) -> tuple[float, float, float, float, float, float]:
    """Median milliseconds to take ``n`` names: multilock's, raw's one at a time and
    raw's in one batch, on the same names each repetition, seen before; multilock's on
    fresh names; multilock's median client CPU per seen name in microseconds; the
    server's own milliseconds of the raw batch."""
    names = [f"bench-many-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
    keys = raw.keys(names)
    _take(locker, names)  # the locker sees the names (and caches their keys)
    ours: list[float] = []
    raws: list[float] = []
    batches: list[float] = []
    server: list[float] = []
    cpu: list[float] = []
    for _ in range(repeats):
        ours.append(_take(locker, names, cpu))
        if n <= IN_A_ROW_MAX:
            raws.append(_ms(lambda: raw.acquire(keys)))
            raw.undo(keys)
        started = time.perf_counter()
        server.append(raw.acquire_batch(keys))
        batches.append((time.perf_counter() - started) * 1000)
        raw.undo(keys)
    # After the seen names, not between: fresh names would push them out of the
    # locker's bounded key cache.
    fresh = [
        _take(locker, [f"bench-fresh-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)])
        for _ in range(repeats)
    ]
    per_name = statistics.median(cpu) / n * 1e6
    in_a_row = statistics.median(raws) if raws else math.nan
    return (
        statistics.median(ours),
        in_a_row,
        statistics.median(fresh),
        per_name,
        statistics.median(batches),
        statistics.median(server),
    )


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
                    ours, raw_ms, fresh, per_name, batch, server = _size(locker, raw, n, repeats)
                    row = Row(backend, n, ours, raw_ms, rtt, fresh, per_name, batch, server)
                    rows.append(row)
                    print(
                        f"  {backend:<10} N={n:<5} multilock {row.ours_ms:8.2f} ms"
                        f" ({row.ours_rtts:6.1f} RTT, fresh {row.fresh_ms:8.2f})"
                        f"   raw {row.raw_ms:8.2f} ms ({row.raw_ms / rtt:7.1f} RTT)"
                        f"   raw/multilock {row.raw_ms / row.ours_ms:6.1f}x"
                        f"   raw batch {row.batch_ms:8.2f} ms"
                        f" (server {row.server_ms:6.2f} ms, {row.server_ms / rtt:5.1f} RTT)"
                        f"   CPU {row.cpu_us_per_name:5.1f} µs/name",
                        flush=True,
                    )
            print(f"  {backend:<10} round trip {rtt * 1000:.0f} µs", flush=True)
        finally:
            raw.close()
    return rows


@contextmanager
def through_proxies(urls: dict[str, str], delay_ms: float) -> Iterator[dict[str, str]]:
    """``urls`` rewritten to go through a proxy each that delays ``delay_ms`` each way."""
    with ExitStack() as stack:
        proxied = {}
        for backend, url in urls.items():
            parts = urlsplit(url)
            host = parts.hostname or "127.0.0.1"
            port = stack.enter_context(
                delayed(host, parts.port or _DEFAULT_PORTS[backend], delay_ms)
            )
            user = parts.netloc.rpartition("@")[0]
            netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
            proxied[backend] = urlunsplit(parts._replace(netloc=netloc))
        yield proxied


def main() -> int:
    """Parse the options, measure on loopback and through the delaying proxy, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument(
        "--delay",
        type=float,
        default=DELAY_MS,
        help=f"one-way delay (ms) of the second run, through a proxy; 0: none ({DELAY_MS})",
    )
    parser.add_argument(
        "--sizes", help="comma-separated numbers of names (default: 1,10,100,1000,10000)"
    )
    args = parser.parse_args()
    urls = {backend: server_url(backend) for backend in ("postgresql", "redis")}
    sizes: tuple[int, ...] = QUICK_SIZES if args.quick else SIZES
    repeats = 2 if args.quick else 5
    if args.sizes:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    print("loopback:", flush=True)
    measure(urls, sizes, repeats)
    if args.delay > 0:
        print(f"through a proxy delaying {args.delay:g} ms each way:", flush=True)
        with through_proxies(urls, args.delay) as proxied:
            measure(proxied, sizes, repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
