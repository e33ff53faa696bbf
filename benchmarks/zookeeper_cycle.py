"""An uncontended try_acquire + release cycle of ``zookeeper://``, against raw kazoo and peers.

    python benchmarks/zookeeper_cycle.py           # the full run (a minute or two)
    python benchmarks/zookeeper_cycle.py --quick   # a smoke run of a few seconds (CI)

Variants, each timed per cycle (acquire, then release) on its own client:

* ``multilock``: ``lease = locker.try_acquire(name)`` then ``lease.release()``
  (an ephemeral create carrying the holder record, fenced by its czxid, then a
  version-checked delete);
* ``raw``: kazoo by hand, ``create(path, ephemeral=True)`` then ``delete(path)``
  -- the floor for a lock in ZooKeeper; async: the same two requests with their
  results bridged into asyncio by ``rawlink`` + ``call_soon_threadsafe``;
* ``exists``: one ``exists`` round trip, the floor of any request;
* peers: kazoo's ``Lock`` recipe (sequential node, children listing) and tooz's
  ZooKeeper driver (``kazoo://``; ``pip install 'multilock-zookeeper[bench]'``),
  which is left out when not installed. Neither has an asyncio API: the async
  table runs them in a worker thread (``asyncio.to_thread``), as an asyncio
  application would, next to raw kazoo run the same way.

Rounds interleave the variants call by call (ABBA), so that drift in the
machine's load lands on all of them alike. Reported: median and p99 per cycle,
each median relative to raw, and whether multilock meets its targets (sync at
most 1.10x raw, async 1.30x; faster than kazoo's Lock and tooz). The server comes from
``MULTILOCK_ZOOKEEPER_URL`` (default: the local test server).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

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
    report,
    server_url,
    tooz_cycle,
)
from kazoo.client import KazooClient

import multilock
from multilock.backend import LockURL
from multilock_zookeeper._config import Config

QUICK, FULL = (2, 50), (40, 50)  # (rounds, cycles per round): short rounds interleave better
FLOOR = "exists"
PEERS = ("kazoo Lock", "tooz")


def _kazoo(config: Config) -> KazooClient:
    client = KazooClient(hosts=config.hosts, timeout=config.session_timeout)
    client.start(timeout=config.connect_timeout)
    return client


def _sync_variants(config: Config, root: str, clients: list[Any]) -> dict[str, SyncCycle]:
    raw_client = _kazoo(config)
    peer_client = _kazoo(config)
    clients += [raw_client, peer_client]
    raw_client.ensure_path(root)
    raw_path = f"{root}/raw"

    def raw() -> None:
        raw_client.create(raw_path, ephemeral=True)
        raw_client.delete(raw_path)

    kazoo_lock = peer_client.Lock(f"{root}/kazoo-lock")

    def kazoo_recipe() -> None:
        assert kazoo_lock.acquire(blocking=False)
        kazoo_lock.release()

    variants: dict[str, SyncCycle] = {
        RAW: raw,
        FLOOR: lambda: raw_client.exists(raw_path),
        "kazoo Lock": kazoo_recipe,
    }
    tooz = tooz_cycle(
        f"kazoo://{config.hosts.split(',')[0]}", f"bench-{uuid.uuid4().hex[:8]}", clients
    )
    if tooz is not None:
        variants["tooz"] = tooz
    return variants


def _close(clients: list[Any]) -> None:
    for client in clients:
        client.stop()
        if isinstance(client, KazooClient):
            client.close()


def run_sync(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the sync variants; returns microseconds per cycle by variant."""
    config = Config.from_url(LockURL.parse(url))
    clients: list[Any] = []
    with multilock.connect(url) as locker:
        name = f"bench-{uuid.uuid4().hex[:8]}"

        def ours() -> None:
            lease = locker.try_acquire(name)
            assert lease is not None, "the benchmark lock is held elsewhere"
            lease.release()

        try:
            variants = {OURS: ours, **_sync_variants(config, config.root, clients)}
            return interleave(variants, rounds, per_round)
        finally:
            _close(clients)


def _bridged(result: Any) -> asyncio.Future[Any]:
    """A kazoo result as an asyncio future: the minimal bridge any asyncio user would write."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(done: Any) -> None:
        if not future.done():
            try:
                future.set_result(done.get_nowait())
            except Exception as exc:
                future.set_exception(exc)

    result.rawlink(lambda done: loop.call_soon_threadsafe(settle, done))
    return future


async def run_async(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the async variants; returns microseconds per cycle by variant."""
    config = Config.from_url(LockURL.parse(url))
    clients: list[Any] = []
    async with multilock.connect_async(url) as locker:
        name = f"bench-{uuid.uuid4().hex[:8]}"

        async def ours() -> None:
            lease = await locker.try_acquire(name)
            assert lease is not None, "the benchmark lock is held elsewhere"
            await lease.release()

        try:
            threaded = _sync_variants(config, config.root, clients)
            raw_client = clients[0]
            raw_path = f"{config.root}/raw-async"

            async def raw() -> None:
                await _bridged(raw_client.create_async(raw_path, ephemeral=True))
                await _bridged(raw_client.delete_async(raw_path))

            async def exists() -> None:
                await _bridged(raw_client.exists_async(raw_path))

            variants: dict[str, AsyncCycle] = {OURS: ours, RAW: raw, FLOOR: exists}
            for variant in ("raw", *PEERS):
                if variant in threaded:
                    label = "raw in thread" if variant == RAW else variant
                    variants[label] = _in_thread(threaded[variant])
            return await interleave_async(variants, rounds, per_round)
        finally:
            _close(clients)


def _in_thread(cycle: SyncCycle) -> AsyncCycle:
    async def run() -> object:
        return await asyncio.to_thread(cycle)

    return run


def run(url: str, rounds: int, per_round: int) -> list[Table]:
    """Time and report both APIs."""
    # In the async table, raw run in a worker thread is a reference, not a peer.
    return [
        report("zookeeper", "sync", run_sync(url, rounds, per_round), floor=FLOOR,
               target=TARGETS["sync"]),
        report("zookeeper", "async", asyncio.run(run_async(url, rounds, per_round)),
               floor=FLOOR, target=BOTH_APIS_ASYNC, not_peers={"raw in thread"}),
    ]  # fmt: skip


if __name__ == "__main__":
    url = server_url("zookeeper")
    sys.exit(main(__doc__ or "", url, run, quick=QUICK, full=FULL))
