"""An uncontended try_acquire + release cycle of ``nats://``, against raw nats-py and a peer.

    python benchmarks/nats_cycle.py           # the full run (a minute or two)
    python benchmarks/nats_cycle.py --quick   # a smoke run of a few seconds (CI)

Variants, each timed per cycle (acquire, then release) on its own connection:

* ``multilock``: ``lease = locker.try_acquire(name)`` then ``lease.release()`` (one
  publish expecting no message on the key, its revision the fencing token, renewal
  armed; then a purge up to that revision);
* ``raw``: the same two requests by hand with nats-py -- the floor for a safe lock in a
  KV bucket: create-if-absent, then delete-if-still-ours leaving no marker behind;
* ``flush``: one PING/PONG round trip, the floor of any request;
* peer: nats-py's own key-value API used as a lock, the recipe its documentation
  suggests (``kv.create(key)``, then ``kv.delete(key, last=revision)``; a create after a
  delete finds the delete marker and takes two more round trips).

nats-py is asyncio only. The sync table runs every nats-py variant the way a sync
application must: in an event loop of a thread of its own, one hand-over per request
(``run_coroutine_threadsafe``) -- as multilock's sync locker does. Rounds interleave
the variants call by call (ABBA), so that drift in the machine's load lands on all of
them alike. Reported: median and p99 per cycle, each median relative to raw, and
whether multilock meets its targets (sync at most 1.10x raw, async 1.30x; faster than
the peer). The server comes from ``MULTILOCK_NATS_URL`` (default: the local server);
the benchmark uses a bucket of its own, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import nats
import nats.aio.client
import nats.js
from _cycle import (
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
)

import multilock
from multilock.backend import LockURL

QUICK, FULL = (2, 40), (40, 40)  # (rounds, cycles per round): short rounds interleave better
NAME = f"multilock-benchmark-cycle-{uuid.uuid4().hex[:8]}"
FLOOR = "flush"
PEER = "nats-py KV create/delete"
T = TypeVar("T")


def _bucket_url(url: str) -> tuple[str, str, str]:
    """A URL of a bucket of the benchmark's own; its server and the bucket's name."""
    parsed = LockURL.parse(url)
    host, port = parsed.host or "127.0.0.1", parsed.port or 4222
    bucket = f"{parsed.path.strip('/') or 'multilock'}-bench-{uuid.uuid4().hex[:8]}"
    return f"nats://{host}:{port}/{bucket}?ttl=30s", f"nats://{host}:{port}", bucket


class Variants:
    """The raw pattern, the floor and the peer, on one nats-py connection."""

    def __init__(self, nc: nats.aio.client.Client, bucket: str) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=5)
        self.bucket = bucket
        self.subject = f"$KV.{bucket}.{NAME}-raw"
        self.kv: Any = None

    async def open(self) -> None:
        self.kv = await self.js.key_value(self.bucket)

    async def raw(self) -> None:
        token = uuid.uuid4().hex.encode()
        headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
        ack = await self.js.publish(self.subject, token, headers=headers)
        request = json.dumps({"filter": self.subject, "seq": ack.seq + 1}).encode()
        await self.nc.request(f"$JS.API.STREAM.PURGE.KV_{self.bucket}", request, timeout=5)

    async def floor(self) -> None:
        await self.nc.flush()

    async def peer(self) -> None:
        revision = await self.kv.create(NAME + "-kv", uuid.uuid4().hex.encode())
        await self.kv.delete(NAME + "-kv", last=revision)


class LoopThread:
    """An event loop in a thread: how a sync application uses nats-py."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(30)

    def cycle(self, *steps: Callable[[], Awaitable[Any]]) -> SyncCycle:
        """A sync cycle of ``steps``, one hand-over each."""

        def run() -> None:
            for step in steps:
                self.call(_awaited(step))

        return run

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _awaited(step: Callable[[], Awaitable[T]]) -> T:
    return await step()


async def _delete(server: str, bucket: str) -> None:
    nc = await nats.connect(server, allow_reconnect=False)
    try:
        await nc.jetstream(timeout=5).delete_key_value(bucket)
    finally:
        await nc.close()


def run_sync(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the sync variants; returns microseconds per cycle by variant."""
    bucket_url, server, bucket = _bucket_url(url)
    thread = LoopThread()
    try:
        with multilock.connect(bucket_url) as locker:
            probe = locker.try_acquire(NAME + "-probe")  # creates the bucket
            assert probe is not None
            probe.release()
            nc = thread.call(nats.connect(server, allow_reconnect=False))
            variants = Variants(nc, bucket)
            thread.call(variants.open())
            js, subject = variants.js, variants.subject
            purge = f"$JS.API.STREAM.PURGE.KV_{bucket}"

            def ours() -> None:
                lease = locker.try_acquire(NAME)
                assert lease is not None, "the benchmark lock is held elsewhere"
                lease.release()

            def raw() -> None:
                token = uuid.uuid4().hex.encode()
                headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
                ack = thread.call(js.publish(subject, token, headers=headers))
                request = json.dumps({"filter": subject, "seq": ack.seq + 1}).encode()
                thread.call(nc.request(purge, request, timeout=5))

            def peer() -> None:
                revision = thread.call(variants.kv.create(NAME + "-kv", uuid.uuid4().hex.encode()))
                thread.call(variants.kv.delete(NAME + "-kv", last=revision))

            table: dict[str, SyncCycle] = {
                OURS: ours,
                RAW: raw,
                FLOOR: thread.cycle(variants.floor),
                PEER: peer,
            }
            try:
                return interleave(table, rounds, per_round)
            finally:
                thread.call(nc.close())
    finally:
        thread.call(_delete(server, bucket))
        thread.stop()


async def run_async(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the async variants; returns microseconds per cycle by variant."""
    bucket_url, server, bucket = _bucket_url(url)
    try:
        async with multilock.connect_async(bucket_url) as locker:
            probe = await locker.try_acquire(NAME + "-probe")  # creates the bucket
            assert probe is not None
            await probe.release()
            nc = await nats.connect(server, allow_reconnect=False)
            variants = Variants(nc, bucket)
            await variants.open()

            async def ours() -> None:
                lease = await locker.try_acquire(NAME)
                assert lease is not None, "the benchmark lock is held elsewhere"
                await lease.release()

            table: dict[str, AsyncCycle] = {
                OURS: ours,
                RAW: variants.raw,
                FLOOR: variants.floor,
                PEER: variants.peer,
            }
            try:
                return await interleave_async(table, rounds, per_round)
            finally:
                await nc.close()
    finally:
        await _delete(server, bucket)


def run(url: str, rounds: int, per_round: int) -> list[Table]:
    """Time and report both APIs."""
    return [
        report("nats", "sync", run_sync(url, rounds, per_round), floor=FLOOR,
               target=TARGETS["sync"]),
        report("nats", "async", asyncio.run(run_async(url, rounds, per_round)), floor=FLOOR,
               target=TARGETS["async"]),
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(__doc__ or "", server_url("nats"), run, quick=QUICK, full=FULL))
