"""An uncontended try_acquire + release cycle of ``etcd://``, against the raw pattern and peers.

    python benchmarks/etcd_cycle.py           # the full run (a minute or two)
    python benchmarks/etcd_cycle.py --quick   # a smoke run of a few seconds (CI)

Variants, each timed per cycle (acquire, then release) on its own connection:

* ``multilock``: ``lease = locker.try_acquire(name)`` then ``lease.release()`` (one
  transaction on the locker's etcd lease, kept alive by its thread; the create revision
  as fencing token; a compare-and-delete);
* ``raw``: the same two transactions by hand on one kept-alive HTTP/1.1 connection to
  etcd's JSON gateway (sync: the standard library's ``http.client``; async: h11 over
  asyncio's streams), on one etcd lease granted once -- the floor for a safe lock:
  create-if-absent on a lease, then delete-if-still-ours;
* ``range``: one serializable range read, the floor of any request;
* peers: python-etcd3's ``Lock`` (gRPC; a lease granted per acquire, then a
  transaction, then a compare-and-delete; its generated protobuf code runs on the
  pure-Python protobuf runtime, which it needs with protobuf 4 and later) and tooz's
  ``etcd3+http`` driver (etcd3gw: the JSON gateway over requests). Both are sync only:
  the async table runs them in a worker thread, as an asyncio application would, next
  to the raw pattern run the same way. Peers that are not installed are left out
  (``pip install 'multilock-etcd[bench]'``).

Rounds interleave the variants call by call (ABBA), so that drift in the machine's
load lands on all of them alike. Reported: median and p99 per cycle, each median
relative to raw, and whether multilock meets its targets (sync at most 1.10x raw,
async 1.30x; faster than every peer). The server comes from ``MULTILOCK_ETCD_URL``
(default: the local test server).
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import socket
import sys
import uuid
from typing import Any

# python-etcd3's generated code predates protobuf 4: it imports only on the pure-Python
# runtime. Set before anything imports protobuf (multilock-etcd does not use it).
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import h11
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
    optional,
    report,
    server_url,
    tooz_cycle,
)

import multilock
from multilock.backend import LockURL
from multilock_etcd._config import EtcdConfig

QUICK, FULL = (2, 40), (40, 40)  # (rounds, cycles per round): short rounds interleave better
NAME = f"multilock-benchmark-cycle-{uuid.uuid4().hex[:8]}"
TTL = 30
# The raw pattern's one etcd lease is never kept alive: granted for longer than a run
# takes on a slow machine (a full run can pass 30 s), so its puts do not fail midway.
RAW_TTL = 3600
FLOOR = "range"
STDLIB = "http.client"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class RawPattern:
    """The raw lock by hand: one lease, then create-if-absent and delete-if-ours."""

    def __init__(self, key: str) -> None:
        self.key = _b64(key)

    def grant(self) -> bytes:
        return json.dumps({"TTL": str(RAW_TTL)}).encode()

    def acquire(self, lease: str) -> bytes:
        token = _b64(uuid.uuid4().hex)
        txn = {
            "compare": [{"key": self.key, "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": self.key, "value": token, "lease": lease}}],
        }
        return json.dumps(txn).encode()

    def release(self, revision: str) -> bytes:
        txn = {
            "compare": [{"key": self.key, "target": "CREATE", "create_revision": revision}],
            "success": [{"request_delete_range": {"key": self.key}}],
        }
        return json.dumps(txn).encode()

    def floor(self) -> bytes:
        return json.dumps({"key": self.key, "serializable": True}).encode()


def _request(connection: h11.Connection, host: str, path: str, body: bytes) -> bytes:
    headers = [("Host", host), ("Content-Length", str(len(body)))]
    data = connection.send(h11.Request(method="POST", target=path, headers=headers)) or b""
    data += connection.send(h11.Data(data=body)) or b""
    return data + (connection.send(h11.EndOfMessage()) or b"")


def _answered(connection: h11.Connection, chunks: list[bytes]) -> dict[str, Any] | None:
    """Feed h11's events into ``chunks``; the answer once complete, ``None`` for more data."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            return None
        if isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            connection.start_next_cycle()
            answer: dict[str, Any] = json.loads(b"".join(chunks))
            return answer


class SyncHTTP:
    """One kept-alive HTTP/1.1 connection by hand: h11 over a socket."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host = f"{host}:{port}"
        self.h11 = h11.Connection(h11.CLIENT)

    def post(self, path: str, body: bytes) -> dict[str, Any]:
        self.sock.sendall(_request(self.h11, self.host, path, body))
        chunks: list[bytes] = []
        while (answer := _answered(self.h11, chunks)) is None:
            self.h11.receive_data(self.sock.recv(65536))
        return answer


class AsyncHTTP:
    """One kept-alive HTTP/1.1 connection by hand: h11 over asyncio's streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host
        self.h11 = h11.Connection(h11.CLIENT)

    async def post(self, path: str, body: bytes) -> dict[str, Any]:
        self.writer.write(_request(self.h11, self.host, path, body))
        chunks: list[bytes] = []
        while (answer := _answered(self.h11, chunks)) is None:
            self.h11.receive_data(await self.reader.read(65536))
        return answer


def _sync_peers(config: EtcdConfig, opened: list[Any]) -> dict[str, SyncCycle]:
    peers: dict[str, SyncCycle] = {}
    host, port = config.endpoints[0]
    etcd3 = optional("etcd3")
    if etcd3 is not None:
        client = etcd3.client(host=host, port=int(port))
        opened.append(client)
        lock = client.lock(NAME + "-etcd3", ttl=TTL)

        def python_etcd3() -> None:
            assert lock.acquire(timeout=0), "the python-etcd3 benchmark lock is held elsewhere"
            lock.release()

        peers["python-etcd3 Lock"] = python_etcd3
    if optional("etcd3gw") is not None:
        tooz = tooz_cycle(f"etcd3+http://{host}:{port}", NAME + "-tooz", opened)
        if tooz is not None:
            peers["tooz etcd3gw"] = tooz
    return peers


def run_sync(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the sync variants; returns microseconds per cycle by variant."""
    config = EtcdConfig.from_url(LockURL.parse(url))
    raw = RawPattern(config.prefix.decode() + NAME + "-raw")
    stdlib = RawPattern(config.prefix.decode() + NAME + "-stdlib")
    connection = SyncHTTP(*config.endpoints[0])
    post = connection.post
    plain = http.client.HTTPConnection(*config.endpoints[0])

    def plain_post(path: str, body: bytes) -> dict[str, Any]:
        plain.request("POST", path, body=body)
        answer: dict[str, Any] = json.loads(plain.getresponse().read())
        return answer

    lease = post("/v3/lease/grant", raw.grant())["ID"]
    with multilock.connect(url) as locker:

        def ours() -> None:
            held = locker.try_acquire(NAME)
            assert held is not None, "the benchmark lock is held elsewhere"
            held.release()

        def raw_cycle() -> None:
            answer = post("/v3/kv/txn", raw.acquire(lease))
            assert answer.get("succeeded"), "the raw benchmark lock is held elsewhere"
            post("/v3/kv/txn", raw.release(answer["header"]["revision"]))

        def stdlib_cycle() -> None:
            answer = plain_post("/v3/kv/txn", stdlib.acquire(lease))
            assert answer.get("succeeded"), "the http.client benchmark lock is held elsewhere"
            plain_post("/v3/kv/txn", stdlib.release(answer["header"]["revision"]))

        def floor() -> None:
            post("/v3/kv/range", raw.floor())

        opened: list[Any] = []
        try:
            variants: dict[str, SyncCycle] = {
                OURS: ours,
                RAW: raw_cycle,
                STDLIB: stdlib_cycle,
                FLOOR: floor,
                **_sync_peers(config, opened),
            }
            return interleave(variants, rounds, per_round)
        finally:
            for peer in opened:
                getattr(peer, "stop", getattr(peer, "close", lambda: None))()
            post("/v3/lease/revoke", json.dumps({"ID": lease}).encode())
            connection.sock.close()
            plain.close()


async def run_async(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Time the async variants; returns microseconds per cycle by variant."""
    config = EtcdConfig.from_url(LockURL.parse(url))
    raw = RawPattern(config.prefix.decode() + NAME + "-araw")
    host, port = config.endpoints[0]
    connection = AsyncHTTP(*await asyncio.open_connection(host, port), f"{host}:{port}")
    post = connection.post

    lease = (await post("/v3/lease/grant", raw.grant()))["ID"]
    opened: list[Any] = []
    try:
        async with multilock.connect_async(url) as locker:

            async def ours() -> None:
                held = await locker.try_acquire(NAME + "-async")
                assert held is not None, "the benchmark lock is held elsewhere"
                await held.release()

            async def raw_cycle() -> None:
                answer = await post("/v3/kv/txn", raw.acquire(lease))
                assert answer.get("succeeded"), "the raw benchmark lock is held elsewhere"
                await post("/v3/kv/txn", raw.release(answer["header"]["revision"]))

            async def floor() -> None:
                await post("/v3/kv/range", raw.floor())

            variants: dict[str, AsyncCycle] = {OURS: ours, RAW: raw_cycle, FLOOR: floor}
            for peer, cycle in _sync_peers(config, opened).items():

                async def in_thread(cycle: SyncCycle = cycle) -> None:
                    await asyncio.to_thread(cycle)

                variants[peer] = in_thread
            return await interleave_async(variants, rounds, per_round)
    finally:
        for peer in opened:
            getattr(peer, "stop", getattr(peer, "close", lambda: None))()
        await post("/v3/lease/revoke", json.dumps({"ID": lease}).encode())
        connection.writer.close()


def run(url: str, rounds: int, per_round: int) -> list[Table]:
    """Time and report both APIs."""
    return [
        report("etcd", "sync", run_sync(url, rounds, per_round), floor=FLOOR,
               target=TARGETS["sync"], not_peers=(STDLIB,)),
        report("etcd", "async", asyncio.run(run_async(url, rounds, per_round)), floor=FLOOR,
               target=TARGETS["async"]),
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(__doc__ or "", server_url("etcd"), run, quick=QUICK, full=FULL))
