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
  pottery's ``Redlock`` (one master), tooz's Redis driver; async: redis-py's asyncio ``Lock`` and
  pottery's ``AIORedlock``. Peers that are not installed are left out
  (``pip install 'multilock-redis[bench]'``).

Rounds interleave the variants call by call (ABBA), so that drift in the
machine's load lands on all of them alike. Reported: median and p99 per cycle,
each variant's median relative to raw, and whether multilock meets its targets
(sync at most 1.10x raw, async 1.30x; faster than every peer). The server comes
from ``MULTILOCK_REDIS_URL`` (default: the local test db 15).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import redis
import redis.asyncio
from _cycle import (
    BOTH_APIS_ASYNC,
    OURS,
    RAW,
    TARGETS,
    AsyncCycle,
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
from multilock_redis._config import parse_config

# (rounds, cycles per round): short rounds, many of them, so that load drift on a
# shared machine lands on every variant alike.
QUICK, FULL = (5, 40), (200, 25)
NAME = f"multilock-benchmark-cycle-{uuid.uuid4().hex[:8]}"
TTL_MS = 30_000
RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
FLOOR = "ping"


def _client_url(url: str) -> str:
    return parse_config(LockURL.parse(url)).client_url


def _tooz_url(client: redis.Redis) -> str:
    # tooz's driver names the database in the query, not the path.
    kwargs = client.connection_pool.connection_kwargs
    host, port = kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}?db={kwargs.get('db', 0)}"


def _sync_peers(client: redis.Redis, opened: list[Any]) -> dict[str, SyncCycle]:
    peers: dict[str, SyncCycle] = {}

    def redis_py_lock() -> None:
        lock = client.lock(NAME + "-redis-py", timeout=TTL_MS / 1000)
        assert lock.acquire(blocking=False)
        lock.release()

    peers["redis-py Lock"] = redis_py_lock
    redis_lock = optional("redis_lock")
    if redis_lock is not None:

        def python_redis_lock() -> None:
            lock = redis_lock.Lock(client, NAME + "-prl", expire=TTL_MS // 1000)
            assert lock.acquire(blocking=False)
            lock.release()

        peers["python-redis-lock"] = python_redis_lock
    pottery = optional("pottery")
    if pottery is not None:

        def pottery_redlock() -> None:
            lock = pottery.Redlock(
                key=NAME + "-pottery", masters={client}, auto_release_time=TTL_MS / 1000
            )
            assert lock.acquire(blocking=False)
            lock.release()

        peers["pottery Redlock"] = pottery_redlock
    tooz = tooz_cycle(_tooz_url(client), NAME + "-tooz", opened)
    if tooz is not None:
        peers["tooz"] = tooz
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

        opened: list[Any] = []
        try:
            variants: dict[str, SyncCycle] = {
                OURS: ours,
                RAW: raw,
                FLOOR: raw_client.ping,
                **_sync_peers(peer_client, opened),
            }
            return interleave(variants, rounds, per_round)
        finally:
            for coordinator in opened:
                coordinator.stop()
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
        pottery = optional("pottery")
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


def run(url: str, rounds: int, per_round: int) -> list[Table]:
    """Time and report both APIs."""
    return [
        report("redis", "sync", run_sync(url, rounds, per_round), floor=FLOOR,
               target=TARGETS["sync"]),
        report("redis", "async", asyncio.run(run_async(url, rounds, per_round)), floor=FLOOR,
               target=BOTH_APIS_ASYNC),
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(
        main(
            __doc__ or "",
            server_url("redis"),
            run,
            quick=QUICK,
            full=FULL,
        )
    )
