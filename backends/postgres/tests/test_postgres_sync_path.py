"""The sync API's hot path (``SyncStartedLocker`` in ``multilock_postgres/_started.py``):
acquire and release run on psycopg's libpq connection, their rows read by hand. Same
guarantees as psycopg's path: the same errors, nothing left held, the same bound on a
hung server, statements prepared again when the session lost them, and psycopg's
connection left usable (an error from the server: ``test_postgres_timeouts.py``, whose
sync calls on a connected session take this path). And the sync mutex, handed over in
turn, which that bound needs."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import multilock
from multilock import advisory_key
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable
from multilock.testing import TcpProxy, poll
from multilock_postgres import PostgresLocker
from multilock_postgres._runtime import Mutex

SLACK = 1.0  # on top of a bound: a loaded two-core machine


def _name() -> str:
    return f"sync-path-{uuid.uuid4().hex}"


def _locker(url: str) -> PostgresLocker:
    locker = multilock.connect(url)
    assert isinstance(locker, PostgresLocker)
    return locker


def _warm(locker: PostgresLocker) -> None:
    """Connect, and prepare the hot path's statements."""
    lease = locker.try_acquire(_name())
    assert lease is not None
    assert lease.release()


def test_taken_on_an_idle_session_and_psycopg_still_works(
    make_url: Callable[..., str],
    holders: Callable[[int], list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    executed: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(cursor: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if cursor.connection is locker._conn:
            executed.append(str(query))
        return execute(cursor, query, *args, **kwargs)

    name, names = _name(), [_name() for _ in range(3)]
    with _locker(make_url(fencing=True)) as locker:
        _warm(locker)
        monkeypatch.setattr(psycopg.Cursor, "execute", counting)
        lease = locker.try_acquire(name)
        assert lease is not None
        assert lease.fencing_token is not None
        assert holders(advisory_key(name)) == [locker.session_pid]
        assert locker.try_acquire(name) is None  # held here: answered without the server
        many = locker.try_acquire_many(names)
        assert all(held is not None for held in many.values())
        assert lease.release() is True
        locker.release_many([held for held in many.values() if held is not None])
        assert executed == [], "psycopg ran a hot statement"
        assert holders(advisory_key(name)) == []
        # psycopg finds the session as it left it: idle, and answering.
        assert locker._conn is not None
        assert locker._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert locker._conn.execute("SELECT 1").fetchone() == (1,)
        assert locker.try_acquire(name) is not None


def test_statements_the_session_lost_are_prepared_again(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    name = _name()
    with _locker(make_url()) as locker:
        _warm(locker)
        assert locker._conn is not None
        locker._conn.execute("DEALLOCATE ALL")  # as a pool's DISCARD ALL would
        lease = locker.try_acquire(name)
        assert lease is not None
        assert holders(advisory_key(name)) == [locker.session_pid]
        locker._conn.execute("DEALLOCATE ALL")
        assert lease.release() is True
        assert holders(advisory_key(name)) == []


def test_statements_left_on_the_session_by_another_client_do_not_collide(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    # A pool in session mode that resets nothing hands over a server session with the
    # statements of the client before: the next one prepares its own beside them.
    name = _name()
    with _locker(make_url()) as locker:
        _warm(locker)
        locker._sync_session = None  # as a new client on the same server session
        lease = locker.try_acquire(name)
        assert lease is not None
        assert holders(advisory_key(name)) == [locker.session_pid]
        assert lease.release() is True


def test_a_terminated_session_is_dropped_and_the_acquire_asked_on_a_new_one(
    make_url: Callable[..., str], admin: psycopg.Connection[Any]
) -> None:
    with _locker(make_url(health_interval="1h")) as locker:
        _warm(locker)
        held = locker.try_acquire(_name())
        assert held is not None
        old = locker.session_pid
        row = admin.execute("SELECT pg_terminate_backend(%s, 5000)", (old,)).fetchone()
        assert row == (True,)
        lease = locker.try_acquire(_name())
        assert lease is not None
        assert locker.session_pid not in (None, old)
        assert held.lost.is_set()  # fired by the acquire that found the session dead
        assert lease.release() is True


def test_a_hung_server_fails_calls_within_the_health_bound(
    frozen_proxy: TcpProxy, postgres_url: str
) -> None:
    url = LockURL.parse(postgres_url)
    through = (
        f"postgresql://{url.username or 'postgres'}@127.0.0.1:{frozen_proxy.port}{url.path}"
        "?health_interval=0.5&health_timeout=1"
    )
    bound = 0.5 + 1 + SLACK  # health_interval + health_timeout
    with _locker(through) as locker:
        _warm(locker)
        held = locker.try_acquire(_name())
        assert held is not None
        frozen_proxy.freeze()
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="did not answer"):
            locker.try_acquire(_name())
        assert time.monotonic() - started < bound
        assert held.lost.is_set()
        frozen_proxy.freeze(False)
        lease = locker.try_acquire(_name())  # on a new session
        assert lease is not None
        frozen_proxy.freeze()
        started = time.monotonic()
        assert lease.release() is False  # lost with its session
        assert time.monotonic() - started < bound


def test_the_sync_mutex_is_handed_over_in_turn() -> None:
    # The health check waits for the mutex while a call hangs: once the cut call lets
    # go, the check must get it, not the caller coming straight back.
    mutex = Mutex()
    order: list[str] = []
    mutex.acquire()

    def waiter() -> None:
        with mutex:
            order.append("waiter")

    thread = threading.Thread(target=waiter)
    thread.start()
    poll("the waiter queued", lambda: mutex._waiters, 10.0)
    mutex.release()
    with mutex:
        order.append("the holder, back at once")
    thread.join(10)
    assert order == ["waiter", "the holder, back at once"]
    assert not mutex.locked()


def test_a_sync_waiter_interrupted_leaves_the_mutex_usable() -> None:
    mutex = Mutex()
    mutex.acquire()

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            mutex.acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not mutex._waiters
    mutex.release()
    assert not mutex.locked()
    with mutex:
        assert mutex.locked()
