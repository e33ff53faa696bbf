"""The async API's started path (``multilock_mysql/_started.py``): acquire and release
written at once on an idle session and answered from its protocol, with no task. Same
guarantees as the task path: the same errors, nothing left held, the same bounds on a
hung server, cancellation undone, and aiomysql's connection left usable."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pymysql
import pytest

import multilock
from multilock.backend import AsyncLeaseBase, Outcome
from multilock.errors import BackendUnavailable, MultilockError
from multilock.testing._servers.mysql import PrivateServer
from multilock_mysql import AsyncMySQLLocker, lock_key

from .conftest import query, with_options

SLACK = 1.0  # on top of a bound: a loaded two-core machine


def _name() -> str:
    return f"started-{uuid.uuid4().hex}"


def _locker(url: str) -> AsyncMySQLLocker:
    locker = multilock.connect_async(url)
    assert isinstance(locker, AsyncMySQLLocker)
    return locker


async def _connect(locker: AsyncMySQLLocker) -> None:
    """Connect (the task path does, on the first call)."""
    lease = await locker.try_acquire(_name())
    assert lease is not None
    assert await lease.release()


def _started(locker: AsyncMySQLLocker, name: str) -> Outcome[AsyncLeaseBase | None]:
    outcome = locker._start_try_acquire(name, 30.0)
    assert outcome is not None, "the started path was not taken"
    return outcome


def test_taken_on_an_idle_session_only_and_aiomysql_still_works(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    async def main() -> None:
        async with _locker(make_url()) as locker:
            assert locker._start_try_acquire(_name(), 30.0) is None  # the task path connects
            await _connect(locker)
            name = _name()
            first = _started(locker, name)
            assert locker._start_try_acquire(_name(), 30.0) is None  # a statement in flight
            lease = await first
            assert lease is not None
            assert holder(lock_key(name)) == locker.connection_id
            assert await _started(locker, name) is None  # held here: no second owner
            locker._suspects.add(lock_key(_name()))
            assert locker._start_try_acquire(_name(), 30.0) is None  # suspects to unlock first
            locker._suspects.clear()
            # aiomysql's own use of the connection goes on as before, either way round.
            await locker._cursor.execute("SELECT CONNECTION_ID()")
            assert await locker._cursor.fetchone() == (locker.connection_id,)
            await lease.extend()
            many = await locker.try_acquire_many([_name(), _name()])
            assert all(many.values())
            release = lease.release_started()
            assert release is not None
            assert await release is True
            assert holder(lock_key(name)) is None
            for other in many.values():
                assert other is not None
                assert await other.release()
            again = await _started(locker, name)
            assert again is not None
            assert await again.release()

    asyncio.run(main())


def test_many_names_in_one_started_statement(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    async def main() -> None:
        async with _locker(make_url()) as locker, _locker(make_url()) as other:
            await _connect(locker)
            mine = await locker.try_acquire(_name())
            theirs = await other.try_acquire(_name())
            assert mine is not None
            assert theirs is not None
            names = [mine.name, theirs.name, *(_name() for _ in range(300))]
            batch = locker._start_try_acquire_many(names, 30.0)
            assert batch is not None
            leases = await batch
            assert list(leases) == names
            assert leases[mine.name] is None  # held here: no second owner
            assert leases[theirs.name] is None  # held elsewhere
            got = [lease for lease in list(leases.values())[2:] if lease is not None]
            assert len(got) == 300
            assert len({lease.token for lease in got}) == 300
            assert all(holder(str(lease.key)) == locker.connection_id for lease in got[:3])
            await locker.release_many(got)
            assert all(holder(str(lease.key)) is None for lease in got[:3])
            only_mine = locker._start_try_acquire_many([mine.name], 30.0)
            assert only_mine is not None
            assert await only_mine == {mine.name: None}

    asyncio.run(main())


def test_fencing_takes_the_task_path(make_url: Callable[..., str]) -> None:
    async def main() -> None:
        async with _locker(make_url(fencing=True)) as locker:
            await _connect(locker)
            assert locker._start_try_acquire(_name(), 30.0) is None
            lease = await locker.try_acquire(_name())
            assert lease is not None
            assert lease.fencing_token is not None
            assert lease.release_started() is None  # released by the task path instead
            assert await lease.release()

    asyncio.run(main())


def test_an_error_from_the_server_is_the_task_paths_and_the_session_lives_on(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    # A statement the server refuses, sent by the started path with the locker's own
    # recovery: the error is raised as the task path raises it, the key asked for is
    # suspect (unlocked before the next statement), and the session goes on.
    name = _name()
    key = lock_key(name)

    async def main() -> None:
        async with _locker(make_url()) as locker:
            await _connect(locker)
            session = locker.connection_id
            protocol = locker._started_session()
            assert protocol is not None
            await locker._cursor.execute(f"SELECT GET_LOCK('{key}', 0)")  # what was granted

            def recover(error: BaseException) -> Coroutine[Any, Any, AsyncLeaseBase | None]:
                return locker._try_acquire(name, 30.0, error)

            call = locker._send(protocol, "SELECT no_such_function()", [key], _never, recover)
            assert call is not None
            with pytest.raises(MultilockError, match="try_acquire failed") as raised:
                await asyncio.wait_for(call, 10)
            assert not isinstance(raised.value, BackendUnavailable)
            assert key in locker._suspects
            assert not locker._mutex.locked()
            lease = await locker.try_acquire(_name())  # unlocks the suspect first
            assert lease is not None
            assert holder(key) is None
            assert not locker._suspects
            assert locker.connection_id == session  # the session lives on
            assert await lease.release()

    asyncio.run(main())


def _never(row: Any) -> Any:
    raise AssertionError(f"answered {row!r}")


def test_a_killed_session_is_dropped_and_the_acquire_asked_on_a_new_one(
    make_url: Callable[..., str], admin: pymysql.Connection[Any]
) -> None:
    async def main() -> None:
        async with _locker(make_url(health_interval="1h")) as locker:
            await _connect(locker)
            held = await locker.try_acquire(_name())
            assert held is not None
            old = locker.connection_id
            query(admin, f"KILL CONNECTION {old}")
            # No loop turn since: the session's protocol has not seen the end yet.
            lease = await _started(locker, _name())
            assert lease is not None
            assert locker.connection_id not in (None, old)
            assert held.lost.is_set()  # fired by the acquire that found the session dead
            assert await lease.release()

    asyncio.run(main())


def test_an_error_not_the_drivers_ends_the_session_and_the_acquire_is_asked_again(
    make_url: Callable[..., str],
    holder: Callable[[str], int | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What went out on the wire is unknown: the session is ended (its locks with it)
    # and a new one asked.
    name = _name()

    async def main() -> None:
        async with _locker(make_url(health_interval="1h")) as locker:
            await _connect(locker)
            old = locker.connection_id

            def broken(data: bytes) -> None:
                monkeypatch.undo()
                raise RuntimeError("injected")

            monkeypatch.setattr(locker._conn, "_write_bytes", broken)
            lease = await _started(locker, name)
            assert lease is not None
            assert locker.connection_id not in (None, old)
            assert holder(lock_key(name)) == locker.connection_id
            assert await lease.release()

    asyncio.run(main())


def test_cancelled_while_in_flight_leaves_nothing_held(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    name = _name()
    key = lock_key(name)

    async def main() -> None:
        async with _locker(make_url()) as locker:
            await _connect(locker)
            acquire = asyncio.create_task(locker.try_acquire(name))
            await asyncio.sleep(0)  # the task has written the statement; its answer is unread
            assert locker._mutex.locked()
            acquire.cancel()
            with pytest.raises(asyncio.CancelledError):
                await acquire
            assert holder(key) is None
            assert key not in locker._held

            lease = await locker.try_acquire(name)
            assert lease is not None
            release = asyncio.create_task(lease.release())
            await asyncio.sleep(0)
            assert locker._mutex.locked()
            release.cancel()
            with pytest.raises(asyncio.CancelledError):
                await release
            assert holder(key) is None
            assert key not in locker._held

    asyncio.run(main())


def test_a_frozen_server_fails_started_calls_within_their_timeout(
    private: PrivateServer,
) -> None:
    timeout = 0.5
    url = with_options(private.url, health_interval="1h", timeout=timeout, connect_timeout="1s")
    bound = timeout + SLACK

    async def main() -> None:
        async with _locker(url) as locker:
            await _connect(locker)
            held = await locker.try_acquire(_name())
            assert held is not None
            private.freeze()
            try:
                started = time.monotonic()
                with pytest.raises(BackendUnavailable, match="did not answer"):
                    await asyncio.wait_for(_started(locker, _name()), 10)
                assert time.monotonic() - started < bound
                assert held.lost.is_set()
            finally:
                private.thaw()

            await _connect(locker)  # a new session
            lease = await locker.try_acquire(_name())
            assert lease is not None
            private.freeze()
            try:
                started = time.monotonic()
                release = lease.release_started()
                assert release is not None
                assert await asyncio.wait_for(release, 10) is False  # lost with the session
                assert time.monotonic() - started < bound
                assert not lease.held
            finally:
                private.thaw()

    asyncio.run(main())
