"""The waiting acquire on PostgreSQL is woken by the release, whoever held the key: a
waiter's session queued for the key in shared mode, granted when the holder lets go.

Each check makes the kit's backoff so long (the first wait 10-20 s) that a waiter that
only polled would time out: being granted within :data:`WOKEN_WITHIN` of the release
proves the wake-up. And a wait that ends (granted, timed out, cancelled) leaves no
session, no queued request and no lock behind.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
import pytest

import multilock
import multilock._locks.base as kit
from multilock import advisory_key
from multilock.errors import LockTimeout
from multilock.testing import apoll, poll
from multilock.testing._waits import observe_waits

SLOW_POLL = 20.0
"""The kit's first wait between two tries during these tests."""
WOKEN_WITHIN = 1.0
"""Seconds from a release to the waiter's grant."""


@pytest.fixture(autouse=True)
def slow_poll(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """A waiter that is not woken sleeps 10 s or more between two tries; the names
    whose waiters have been refused and wait (see ``observe_waits``)."""
    monkeypatch.setattr(kit, "FIRST_WAIT", SLOW_POLL)
    return observe_waits(monkeypatch)


def _name() -> str:
    return f"wait-{uuid.uuid4().hex}"


def _queued(admin: psycopg.Connection[Any], key: int) -> int:
    """Requests for advisory ``key`` waiting in the server's lock queue."""
    row = admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
        " AND NOT granted AND ((classid::bigint << 32) | objid::bigint) = %s",
        (key,),  # the shift wraps into the sign bit, as the key's own
    ).fetchone()
    assert row is not None
    return int(row[0])


async def _among(names: set[str], name: str) -> bool:
    return name in names


def _acquire_into(leases: list[Any], locker: Any, name: str) -> None:
    leases.append(locker.acquire(name, timeout=5))


def _granted_after(
    waiting: Callable[[], bool], release: Callable[[], object], acquire: Callable[[], object]
) -> float:
    """Seconds from ``release()`` to the return of ``acquire()`` (run in a thread, in its
    first wait once ``waiting()``); fails if the waiter times out instead."""
    got: list[float] = []
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            acquire()
            got.append(time.monotonic())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    poll("the waiter refused and in its first (slow) wait", waiting, 10)
    assert not got, "the waiter was granted a held name"
    assert not failed, failed
    released = time.monotonic()
    release()
    thread.join(15)
    assert not failed, f"the waiter was not woken by the release: {failed[0]!r}"
    took = got[0] - released
    assert took <= WOKEN_WITHIN, f"granted {took:.2f} s after the release"
    return took


@pytest.mark.parametrize("fencing", [False, True])
def test_sync_waiter_is_woken_by_a_release(
    make_url: Callable[..., str], fencing: bool, slow_poll: set[str]
) -> None:
    url = make_url(fencing=fencing)
    with multilock.connect(url) as holder, multilock.connect(url) as waiter:
        for _ in range(3):
            name = _name()
            held = holder.try_acquire(name)
            assert held is not None
            leases: list[Any] = []
            _granted_after(
                partial(set.__contains__, slow_poll, name),
                held.release,
                partial(_acquire_into, leases, waiter, name),
            )
            if fencing:
                assert leases[0].fencing_token > held.fencing_token
            assert holder.try_acquire(name) is None, "the waiter's grant is not exclusive"
            leases[0].release()


@pytest.mark.parametrize("fencing", [False, True])
def test_async_waiter_is_woken_by_a_release(
    make_url: Callable[..., str], fencing: bool, slow_poll: set[str]
) -> None:
    async def scenario() -> None:
        url = make_url(fencing=fencing)
        async with multilock.connect_async(url) as holder, multilock.connect_async(url) as waiter:
            for _ in range(3):
                name = _name()
                held = await holder.try_acquire(name)
                assert held is not None
                waiting = asyncio.ensure_future(waiter.acquire(name, timeout=5))
                await apoll("the waiter refused and waiting", partial(_among, slow_poll, name), 10)
                assert not waiting.done()
                released = time.monotonic()
                await held.release()
                lease = await waiting
                took = time.monotonic() - released
                assert took <= WOKEN_WITHIN, f"granted {took:.2f} s after the release"
                if fencing:
                    assert lease.fencing_token > held.fencing_token  # type: ignore[operator]
                await lease.release()

    asyncio.run(scenario())


def test_woken_by_a_raw_sql_holder_and_by_a_session_that_ends(
    make_url: Callable[..., str], admin: psycopg.Connection[Any], slow_poll: set[str]
) -> None:
    """The server queues the waiter whoever holds the key: a release by plain SQL (the
    Go seed's, say) wakes it, and so does the end of the holder's session."""
    name = _name()
    key = advisory_key(name)
    with multilock.connect(make_url()) as waiter:
        assert admin.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
        leases: list[Any] = []
        _granted_after(
            lambda: name in slow_poll,
            lambda: admin.execute("SELECT pg_advisory_unlock(%s)", (key,)),
            lambda: leases.append(waiter.acquire(name, timeout=5)),
        )
        leases.pop().release()
        other = psycopg.Connection.connect(admin.info.dsn, autocommit=True)
        assert other.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
        slow_poll.clear()
        _granted_after(
            lambda: name in slow_poll,
            other.close,
            lambda: leases.append(waiter.acquire(name, timeout=5)),
        )
        leases.pop().release()


def test_timed_out_and_cancelled_waits_leave_nothing(
    make_url: Callable[..., str],
    app_name: str,
    admin: psycopg.Connection[Any],
    sessions: Callable[[str], int],
) -> None:
    """A wait that times out or is cancelled leaves no request queued and no session of
    its own, and the name is free the moment its holder releases it."""
    name = _name()
    key = advisory_key(name)
    with multilock.connect(make_url()) as holder, multilock.connect(make_url()) as waiter:
        held = holder.try_acquire(name)
        assert held is not None
        start = time.monotonic()
        with pytest.raises(LockTimeout):
            waiter.acquire(name, timeout=0.5)
        assert time.monotonic() - start < 0.5 + WOKEN_WITHIN
        assert _queued(admin, key) == 0, "the timed-out wait is still queued"

        async def queued_once() -> bool:
            return _queued(admin, key) == 1

        async def cancelled() -> None:
            async with multilock.connect_async(make_url()) as other:
                for delay in (0.05, 0.0):
                    task = asyncio.ensure_future(other.acquire(name, timeout=30))
                    if delay:
                        await asyncio.sleep(delay)  # cancelled wherever it has got to
                    else:
                        await apoll("the wait queued in the server", queued_once, 10)
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    assert task.cancelled()
                    assert _queued(admin, key) == 0, "the cancelled wait is still queued"

        asyncio.run(cancelled())
        # The holder's and the waiter's sessions are left; every watch's has ended.
        poll("only the two lockers' sessions left", lambda: sessions(app_name) == 2 or None, 10)
        held.release()
        again = waiter.try_acquire(name)
        assert again is not None, "the name is not free after its holder released it"
        again.release()


def test_waiters_on_the_holders_own_locker(
    make_url: Callable[..., str], slow_poll: set[str]
) -> None:
    """A second acquire on the holder's own locker waits for that locker's own release
    (its watch queues behind the locker's session) and is woken by it."""
    with multilock.connect(make_url()) as locker:
        name = _name()
        held = locker.try_acquire(name)
        assert held is not None
        leases: list[Any] = []
        _granted_after(
            lambda: name in slow_poll,
            held.release,
            lambda: leases.append(locker.acquire(name, timeout=5)),
        )
        leases.pop().release()


def test_a_long_wait_is_one_queued_statement(
    make_url: Callable[..., str], admin: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kit's own backoff (many short waits), the waiter stays queued in one
    statement: not one per wait, each ending in a lock timeout logged as an error."""
    monkeypatch.setattr(kit, "FIRST_WAIT", 0.005)
    name = _name()
    key = advisory_key(name)

    def queued() -> tuple[Any, ...] | None:
        return admin.execute(
            "SELECT pid, query_start FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND query LIKE %s",
            (f"%pg_advisory_xact_lock_shared({key})%",),
        ).fetchone()

    with multilock.connect(make_url()) as holder, multilock.connect(make_url()) as waiter:
        held = holder.try_acquire(name)
        assert held is not None
        leases: list[Any] = []
        thread = threading.Thread(target=_acquire_into, args=(leases, waiter, name))
        thread.start()
        try:
            first = poll("the waiter queued", queued, 10)
            time.sleep(2.5)  # some ten waits of the kit, the last ones 1-2 s
            assert queued() == first, "the wait statement was sent again"
        finally:
            held.release()
            thread.join(10)
        assert leases, "the waiter was not granted the name"
        leases[0].release()
