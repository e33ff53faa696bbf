"""try_acquire, release and try_acquire_many are one round trip each, on the wire."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from psycopg import pq

import multilock
from multilock_postgres import PostgresLocker


@contextmanager
def _round_trips(locker: PostgresLocker) -> Iterator[list[int]]:
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
def test_one_round_trip_each(make_url: Callable[..., str], fencing: bool) -> None:
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
        assert (acquire, release, batch, refused) == ([1], [1], [1], [0])
