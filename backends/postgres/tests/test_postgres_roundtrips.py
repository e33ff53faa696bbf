"""try_acquire, release, try_acquire_many and the scheduler's release of many are one
round trip each, on the wire."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from psycopg import pq

import multilock
from multilock_postgres import AsyncPostgresLocker, PostgresLocker


@contextmanager
def _round_trips(locker: PostgresLocker | AsyncPostgresLocker) -> Iterator[list[int]]:
    """Count the requests the client sends (one Sync or simple Query ends each) via
    libpq's protocol trace of the locker's session."""
    conn = locker._conn
    assert conn is not None
    counted: list[int] = []
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield counted
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode(errors="replace").splitlines()
    sent = [line.split("\t") for line in lines if line.startswith("F\t")]
    counted.append(sum(1 for fields in sent if fields[2].split(" ")[0] in ("Sync", "Query")))


@pytest.mark.parametrize("fencing", [False, True])
def test_one_round_trip_each(
    make_url: Callable[..., str], holders: Callable[[int], list[int]], fencing: bool
) -> None:
    prefix = uuid.uuid4().hex
    with multilock.connect(make_url(fencing=fencing)) as locker:
        assert isinstance(locker, PostgresLocker)
        locker.try_acquire(f"{prefix}-warm-up")  # connect (and create the sequence) first
        with _round_trips(locker) as acquire:
            lease = locker.try_acquire(f"{prefix}-one")
        with _round_trips(locker) as release:
            assert lease is not None
            assert lease.release() is True
        names = [f"{prefix}-{i}" for i in range(200)]
        with _round_trips(locker) as batch:
            leases = locker.try_acquire_many(names)
        assert all(lease is not None for lease in leases.values())
        with _round_trips(locker) as refused:
            again = locker.try_acquire(names[0])  # held here: answered without the server
        assert again is None
        held = [lease for lease in leases.values() if lease is not None]
        with _round_trips(locker) as release_all:
            locker.release_many(held)  # the scheduler's, when lease holds end together
        assert not any(lease.held for lease in held)
        assert all(holders(int(lease.key)) == [] for lease in held)
        assert (acquire, release, batch, refused, release_all) == ([1], [1], [1], [0], [1])


def test_async_release_many_frees_every_lease_in_one_statement(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    async def main() -> None:
        prefix = uuid.uuid4().hex
        async with multilock.connect_async(make_url()) as locker:
            assert isinstance(locker, AsyncPostgresLocker)
            names = [f"{prefix}-{i}" for i in range(50)]
            leases = [lease for lease in (await locker.try_acquire_many(names)).values() if lease]
            assert len(leases) == 50
            await leases[0].release()  # released already: skipped by the batch
            await locker.release_many(leases)
            assert not any(lease.held for lease in leases)
            assert all(holders(int(lease.key)) == [] for lease in leases)

    asyncio.run(main())


@pytest.mark.parametrize("fencing", [False, True])
def test_async_started_acquire_and_release_are_one_round_trip_each(
    make_url: Callable[..., str], holders: Callable[[int], list[int]], fencing: bool
) -> None:
    # The started path (multilock_postgres/_started.py) prepares its statement on the
    # session's first use: one more round trip, once.
    async def main() -> None:
        prefix = uuid.uuid4().hex
        async with multilock.connect_async(make_url(fencing=fencing)) as locker:
            assert isinstance(locker, AsyncPostgresLocker)
            warm = await locker.try_acquire(f"{prefix}-warm-up")  # the task path connects
            assert warm is not None
            with _round_trips(locker) as first:
                lease = await locker.try_acquire(f"{prefix}-one")
            with _round_trips(locker) as acquire:
                other = await locker.try_acquire(f"{prefix}-two")
            assert lease is not None
            assert other is not None
            with _round_trips(locker) as release:
                assert await lease.release() is True
            assert locker._started is not None  # the started path answered them
            assert holders(int(lease.key)) == []
            await other.release()
            await warm.release()
            assert (first, acquire, release) == ([2], [1], [2])
            with _round_trips(locker) as release:
                again = await locker.try_acquire(f"{prefix}-one")
                assert again is not None
                assert await again.release() is True
            assert release == [2]
            batches = []
            for run in range(2):
                names = [f"{prefix}-{run}-{i}" for i in range(100)]
                with _round_trips(locker) as batch:
                    leases = await locker.try_acquire_many(names)
                assert all(leases.values())
                batches.append(batch)
            assert batches == [[2], [1]]  # the first prepares the batch statement

    asyncio.run(main())
