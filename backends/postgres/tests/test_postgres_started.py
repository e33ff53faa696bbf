"""The async API's started path (``multilock_postgres/_started.py``): acquire and release
sent at once on an idle session and answered from its socket, with no task. Same
guarantees as the task path: the same errors, nothing left held, the same bounds on a
hung server, cancellation undone, and psycopg's connection left usable."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import multilock
from multilock import advisory_key
from multilock.backend import AsyncLeaseBase, LockURL, Outcome
from multilock.errors import BackendUnavailable
from multilock.testing import TcpProxy
from multilock_postgres import AsyncPostgresLocker
from multilock_postgres._runtime import AsyncMutex

SLACK = 1.0  # on top of a bound: a loaded two-core machine


def _name() -> str:
    return f"started-{uuid.uuid4().hex}"


def _locker(url: str) -> AsyncPostgresLocker:
    locker = multilock.connect_async(url)
    assert isinstance(locker, AsyncPostgresLocker)
    return locker


async def _warm(locker: AsyncPostgresLocker) -> None:
    """Connect (the task path does) and prepare the started path's statements."""
    for _ in range(2):
        lease = await locker.try_acquire(_name())
        assert lease is not None
        assert await lease.release()


def _started(locker: AsyncPostgresLocker, name: str) -> Outcome[AsyncLeaseBase | None]:
    outcome = locker._start_try_acquire(name, 30.0)
    assert outcome is not None, "the started path was not taken"
    return outcome


def _terminate(admin: psycopg.Connection[Any], pid: int | None) -> None:
    assert pid is not None
    row = admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    assert row == (True,)


def test_taken_on_an_idle_session_only_and_psycopg_still_works(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    async def main() -> None:
        async with _locker(make_url()) as locker:
            assert locker._start_try_acquire(_name(), 30.0) is None  # the task path connects
            await _warm(locker)
            name = _name()
            first = _started(locker, name)
            assert locker._start_try_acquire(_name(), 30.0) is None  # a statement in flight
            lease = await first
            assert lease is not None
            assert holders(advisory_key(name)) == [locker.session_pid]
            assert await _started(locker, name) is None  # held here: no second owner
            locker._suspects.add(advisory_key(_name()))
            assert locker._start_try_acquire(_name(), 30.0) is None  # suspects to unlock first
            locker._suspects.clear()
            # psycopg's own use of the connection goes on as before, either way round.
            await lease.extend()
            many = await locker.try_acquire_many([_name(), _name()])
            assert all(many.values())
            assert len(await locker.locks()) >= 3
            release = lease.release_started()
            assert release is not None
            assert await release is True
            assert holders(advisory_key(name)) == []
            for other in many.values():
                assert other is not None
                assert await other.release()
            again = await _started(locker, name)
            assert again is not None
            assert await again.release()

    asyncio.run(main())


@pytest.mark.parametrize("fencing", [False, True])
def test_many_names_in_one_started_statement(
    make_url: Callable[..., str], holders: Callable[[int], list[int]], fencing: bool
) -> None:
    async def main() -> None:
        async with _locker(make_url(fencing=fencing)) as locker:
            await _warm(locker)
            mine = await locker.try_acquire(_name())
            assert mine is not None
            names = [mine.name, *(_name() for _ in range(300))]
            for _ in range(2):  # the first prepares the statement
                batch = locker._start_try_acquire_many(names, 30.0)
                assert batch is not None
                leases = await batch
                assert list(leases) == names
                assert leases[mine.name] is None  # held here: no second owner
                got = [lease for lease in list(leases.values())[1:] if lease is not None]
                assert len(got) == 300
                assert all(holders(int(lease.key)) == [locker.session_pid] for lease in got[:3])
                fences = [lease.fencing_token for lease in got]
                if fencing:
                    assert all(fence is not None for fence in fences)
                    assert len(set(fences)) == len(fences)
                else:
                    assert fences == [None] * len(fences)
                await locker.release_many(got)
                assert all(holders(int(lease.key)) == [] for lease in got[:3])
            only_mine = locker._start_try_acquire_many([mine.name, names[1]], 30.0)
            assert only_mine is not None
            again = await only_mine
            assert again[mine.name] is None
            assert again[names[1]] is not None

    asyncio.run(main())


def test_an_error_from_the_server_is_the_task_paths_and_leaves_nothing_held(
    make_url: Callable[..., str],
    sequence: str,
    peer_locks: Callable[[str], None],
    holders: Callable[[int], list[int]],
) -> None:
    # nextval waits for the peer's lock on the sequence after pg_try_advisory_lock has
    # granted the key: the key is suspect, and unlocked before the error is raised.
    name, other = _name(), _name()
    url = make_url(fencing=True, fencing_sequence=sequence, lock_timeout="300ms")

    async def main() -> float:
        async with _locker(url) as locker:
            await _warm(locker)
            pid = locker.session_pid
            peer_locks(sequence)
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="lock timeout"):
                await asyncio.wait_for(_started(locker, name), 10)
            batch = locker._start_try_acquire_many([name, other], 30.0)
            assert batch is not None
            with pytest.raises(BackendUnavailable, match="lock timeout"):
                await asyncio.wait_for(batch, 10)
            elapsed = time.monotonic() - started
            assert holders(advisory_key(name)) == []
            assert holders(advisory_key(other)) == []
            assert not locker._suspects
            assert locker.session_pid == pid  # the session lives on
            return elapsed

    assert asyncio.run(main()) < 2 * 0.3 + SLACK


def test_a_terminated_session_is_dropped_and_the_acquire_asked_on_a_new_one(
    make_url: Callable[..., str], admin: psycopg.Connection[Any]
) -> None:
    async def main() -> None:
        async with _locker(make_url(health_interval="1h")) as locker:
            await _warm(locker)
            held = await locker.try_acquire(_name())
            assert held is not None
            old = locker.session_pid
            _terminate(admin, old)
            # No loop turn since: the socket watch has not seen the end yet.
            lease = await _started(locker, _name())
            assert lease is not None
            assert locker.session_pid not in (None, old)
            assert held.lost.is_set()  # fired by the acquire that found the session dead
            assert await lease.release()

    asyncio.run(main())


def test_an_error_not_the_drivers_ends_the_session_and_the_acquire_is_asked_again(
    make_url: Callable[..., str],
    holders: Callable[[int], list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The statement is on the wire when the reader cannot be added: what the session
    # will answer is unknown, so it is ended (its lock with it) and a new one asked.
    name = _name()

    async def main() -> None:
        async with _locker(make_url(health_interval="1h")) as locker:
            await _warm(locker)
            old = locker.session_pid
            loop = asyncio.get_running_loop()

            def broken(*args: Any) -> None:
                monkeypatch.undo()
                raise OSError("injected")

            monkeypatch.setattr(loop, "add_reader", broken)
            lease = await _started(locker, name)
            assert lease is not None
            assert locker.session_pid not in (None, old)
            assert holders(advisory_key(name)) == [locker.session_pid]
            assert await lease.release()

    asyncio.run(main())


def _through(proxy: TcpProxy, postgres_url: str) -> str:
    url = LockURL.parse(postgres_url)
    return (
        f"postgresql://{url.username or 'postgres'}@127.0.0.1:{proxy.port}{url.path}"
        "?health_interval=0.5&health_timeout=1"
    )


def test_a_hung_server_fails_started_calls_within_the_health_bound(
    frozen_proxy: TcpProxy, postgres_url: str
) -> None:
    bound = 0.5 + 1 + SLACK  # health_interval + health_timeout

    async def main() -> None:
        async with _locker(_through(frozen_proxy, postgres_url)) as locker:
            await _warm(locker)
            held = await locker.try_acquire(_name())
            assert held is not None
            frozen_proxy.freeze()
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="did not answer"):
                await asyncio.wait_for(_started(locker, _name()), 10)
            assert time.monotonic() - started < bound
            assert held.lost.is_set()

            frozen_proxy.freeze(False)
            await _warm(locker)  # a new session
            lease = await locker.try_acquire(_name())
            assert lease is not None
            frozen_proxy.freeze()
            started = time.monotonic()
            release = lease.release_started()
            assert release is not None
            assert await asyncio.wait_for(release, 10) is False  # lost with the session
            assert time.monotonic() - started < bound
            assert not lease.held

    asyncio.run(main())


def test_cancelled_while_in_flight_leaves_nothing_held(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    name = _name()
    key = advisory_key(name)

    async def main() -> None:
        async with _locker(make_url()) as locker:
            await _warm(locker)
            acquire = asyncio.create_task(locker.try_acquire(name))
            await asyncio.sleep(0)  # the task has sent the statement; its answer is unread
            assert locker._mutex.locked()
            acquire.cancel()
            with pytest.raises(asyncio.CancelledError):
                await acquire
            assert holders(key) == []
            assert key not in locker._held

            lease = await locker.try_acquire(name)
            assert lease is not None
            release = asyncio.create_task(lease.release())
            await asyncio.sleep(0)
            assert locker._mutex.locked()
            release.cancel()
            with pytest.raises(asyncio.CancelledError):
                await release
            assert holders(key) == []
            assert key not in locker._held

    asyncio.run(main())


def test_the_mutex_is_handed_over_in_turn_and_never_taken_past_a_waiter() -> None:
    async def main() -> None:
        mutex = AsyncMutex()
        assert mutex.take()
        order: list[str] = []

        async def waiter(label: str) -> None:
            await mutex.acquire()
            order.append(label)
            mutex.release()

        first = asyncio.create_task(waiter("first"))
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0)
        mutex.release()  # handed to "first": still held, so take() cannot jump the queue
        assert mutex.locked()
        assert not mutex.take()
        first.cancel()  # handed over as it is cancelled: it passes the mutex on
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        assert order == ["second"]
        assert not mutex.locked()
        assert mutex.take()

    asyncio.run(main())
