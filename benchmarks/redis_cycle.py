"""An uncontended try_acquire + release cycle of ``redis://``, against raw redis-py and peers.

    python benchmarks/redis_cycle.py           # the full run (about a minute)
    python benchmarks/redis_cycle.py --quick   # a smoke run of a few seconds (CI)

Variants, each timed per cycle (acquire, then release) on its own client:

* ``multilock``: ``lease = locker.try_acquire(name)`` then ``lease.release()``
  (with its fencing counter bumped in the acquire, and renewal armed);
* ``raw``: redis-py by hand, ``SET key token NX PX ttl`` then a Lua
  compare-and-delete by a bare ``evalsha()`` (not redis-py's ``Script`` object,
  whose call costs about ten microseconds more) -- the floor for a safe lock;
* ``ping``: one ``PING`` round trip, the floor of any command;
* peers: redis-py's own ``Lock``, python-redis-lock (``redis_lock.Lock``) and
  pottery's ``Redlock`` (one master); async: redis-py's asyncio ``Lock`` and
  pottery's ``AIORedlock``. Peers that are not installed are left out
  (``pip install 'multilock-redis[bench]'``).

Rounds interleave the variants in a shuffled order, so that drift in the
machine's load lands on all of them alike. Reported: median and p99 per cycle,
each variant's median relative to raw, and whether multilock meets its targets
(sync at most 1.10x raw, async 1.30x; faster than every peer). The server comes
from ``MULTILOCK_REDIS_URL`` (default: the local test db 15).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import statistics
import sys
import uuid
from typing import Any

import redis
import redis.asyncio
from _cycle import AsyncCycle, SyncCycle, interleave, interleave_async, main, p99

import multilock
from multilock.backend import LockURL
from multilock_redis._config import parse_config

DEFAULT_URL = "redis://127.0.0.1:6379/15"
TARGETS = {"sync": 1.10, "async": 1.30}
NAME = f"multilock-benchmark-cycle-{uuid.uuid4().hex[:8]}"
TTL_MS = 30_000
RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
OURS, RAW, FLOOR = "multilock", "raw", "ping"


def _client_url(url: str) -> str:
    return parse_config(LockURL.parse(url)).client_url


def _optional(module: str) -> Any:
    """An installed peer library, or ``None`` (peers are the ``bench`` extra, not required)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _sync_peers(client: redis.Redis) -> dict[str, SyncCycle]:
    peers: dict[str, SyncCycle] = {}

    def redis_py_lock() -> None:
        lock = client.lock(NAME + "-redis-py", timeout=TTL_MS / 1000)
        assert lock.acquire(blocking=False)
        lock.release()

    peers["redis-py Lock"] = redis_py_lock
    redis_lock = _optional("redis_lock")
    if redis_lock is not None:

        def python_redis_lock() -> None:
            lock = redis_lock.Lock(client, NAME + "-prl", expire=TTL_MS // 1000)
            assert lock.acquire(blocking=False)
            lock.release()

        peers["python-redis-lock"] = python_redis_lock
    pottery = _optional("pottery")
    if pottery is not None:

        def pottery_redlock() -> None:
            lock = pottery.Redlock(
                key=NAME + "-pottery", masters={client}, auto_release_time=TTL_MS / 1000
            )
            assert lock.acquire(blocking=False)
            lock.release()

        peers["pottery Redlock"] = pottery_redlock
    return peers


def run_sync(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the sync variants; returns microseconds per cycle by variant."""
    client_url = _client_url(url)
    with multilock.connect(url) as locker:
        raw_client = redis.Redis.from_url(client_url)
        peer_client = redis.Redis.from_url(client_url)
        release = raw_client.script_load(RELEASE)
        key = NAME + "-raw"

        def ours() -> None:
            lease = locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            lease.release()

        def raw() -> None:
            token = uuid.uuid4().hex
            assert raw_client.set(key, token, nx=True, px=TTL_MS)
            raw_client.evalsha(release, 1, key, token)

        variants: dict[str, SyncCycle] = {
            OURS: ours,
            RAW: raw,
            FLOOR: raw_client.ping,
            **_sync_peers(peer_client),
        }
        try:
            return interleave(variants, rounds, per_round)
        finally:
            raw_client.close()
            peer_client.close()


async def run_async(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the async variants; returns microseconds per cycle by variant."""
    client_url = _client_url(url)
    async with multilock.connect_async(url) as locker:
        raw_client = redis.asyncio.Redis.from_url(client_url)
        release = await raw_client.script_load(RELEASE)
        key = NAME + "-raw"

        async def ours() -> None:
            lease = await locker.try_acquire(NAME)
            assert lease is not None, "the benchmark lock is held elsewhere"
            await lease.release()

        async def raw() -> None:
            token = uuid.uuid4().hex
            assert await raw_client.set(key, token, nx=True, px=TTL_MS)
            await raw_client.evalsha(release, 1, key, token)

        async def ping() -> None:
            await raw_client.ping()

        async def redis_py_lock() -> None:
            lock = raw_client.lock(NAME + "-redis-py", timeout=TTL_MS / 1000)
            assert await lock.acquire(blocking=False)
            await lock.release()

        variants: dict[str, AsyncCycle] = {
            OURS: ours,
            RAW: raw,
            FLOOR: ping,
            "redis-py Lock": redis_py_lock,
        }
        pottery = _optional("pottery")
        if pottery is not None:

            async def pottery_redlock() -> None:
                lock = pottery.AIORedlock(
                    key=NAME + "-pottery", masters={raw_client}, auto_release_time=TTL_MS / 1000
                )
                assert await lock.acquire(blocking=False)
                await lock.release()

            variants["pottery AIORedlock"] = pottery_redlock
        try:
            return await interleave_async(variants, rounds, per_round)
        finally:
            await raw_client.aclose()


def report(api: str, samples: dict[str, list[float]]) -> bool:
    """Print one API's table; return whether multilock met its targets."""
    medians = {variant: statistics.median(values) for variant, values in samples.items()}
    print(f"\n{api} API ({len(samples[RAW])} cycles per variant)")
    print(f"  {'variant':<20} {'median µs':>10} {'p99 µs':>10} {'vs raw':>8}")
    for variant in sorted(samples, key=medians.__getitem__):
        values = samples[variant]
        ratio = medians[variant] / medians[RAW]
        print(f"  {variant:<20} {medians[variant]:>10.1f} {p99(values):>10.1f} {ratio:>7.2f}x")
    ratio = medians[OURS] / medians[RAW]
    p99_ratio = p99(samples[OURS]) / p99(samples[RAW])
    peers = [v for v in samples if v not in (OURS, RAW, FLOOR)]
    slower_than = [peer for peer in peers if medians[peer] <= medians[OURS]]
    met = ratio <= TARGETS[api] and not slower_than
    print(
        f"  multilock/raw: median {ratio:.3f}x, p99 {p99_ratio:.3f}x (target {TARGETS[api]:.2f}x);"
        f" raw cycle = {medians[RAW] / medians[FLOOR]:.2f} PINGs;"
        + (f" slower than {', '.join(slower_than)}" if slower_than else " faster than every peer")
        + (" -- meets the targets" if met else " -- MISSES a target")
    )
    return met


def run(url: str, rounds: int, per_round: int) -> None:
    """Time and report both APIs."""
    report("sync", run_sync(url, rounds, per_round))
    report("async", asyncio.run(run_async(url, rounds, per_round)))


if __name__ == "__main__":
    sys.exit(
        main(
            __doc__ or "",
            os.environ.get("MULTILOCK_REDIS_URL", DEFAULT_URL),
            run,
            # Short rounds, many of them: load drift on a shared machine then
            # lands on every variant alike.
            quick=(5, 40),
            full=(200, 25),
        )
    )
