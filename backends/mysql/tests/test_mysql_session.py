"""One dedicated session per locker, tracked by key, shared safely by threads and tasks."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable

import pytest

import multilock
from multilock.testing import poll
from multilock_mysql import AsyncMySQLLocker, MySQLLocker, lock_key


def _names(count: int) -> list[str]:
    prefix = uuid.uuid4().hex
    return [f"session-{prefix}-{i}" for i in range(count)]


def test_hundred_leases_use_one_session(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, MySQLLocker)
        leases = [locker.try_acquire(name) for name in _names(60)]
        leases += locker.try_acquire_many(_names(40)).values()
        assert all(lease is not None for lease in leases)
        assert len(leases) == 100
        assert {holder(lock_key(lease.name)) for lease in leases if lease} == {locker.connection_id}
    assert {holder(lock_key(lease.name)) for lease in leases if lease} == {None}


def test_async_hundred_leases_use_one_session(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            assert isinstance(locker, AsyncMySQLLocker)
            leases = await asyncio.gather(*(locker.try_acquire(n) for n in _names(100)))
            assert all(lease is not None for lease in leases)
            assert {holder(lock_key(lease.name)) for lease in leases if lease} == {
                locker.connection_id
            }

    asyncio.run(main())


def test_held_key_is_not_reentered(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    (name,) = _names(1)
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, MySQLLocker)
        lease = locker.try_acquire(name)
        assert lease is not None
        assert locker.try_acquire(name) is None
        assert locker.try_acquire_many([name])[name] is None
        assert holder(lock_key(name)) == locker.connection_id
        assert lease.release() is True
        # Released exactly once and fully: the re-entrant count never went above one.
        assert holder(lock_key(name)) is None
        assert lease.release() is False
        again = locker.try_acquire(name)
        assert again is not None
        again.release()


def test_suspect_keys_are_released_before_the_next_statement(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    first, second, later = _names(3)
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, MySQLLocker)
        lease = locker.try_acquire(later)  # connect
        assert lease is not None
        # What an acquire whose answer was lost leaves: keys the server may have granted
        # to the session, with no lease. Planted here by locking them directly.
        keys = [lock_key(first), lock_key(second)]
        for key in keys:
            locker._cursor.execute(f"SELECT GET_LOCK('{key}', 0)")
        locker._suspects.update(keys)
        assert [holder(key) for key in keys] == [locker.connection_id] * 2
        lease.release()
        assert [holder(key) for key in keys] == [None, None]


@pytest.mark.parametrize("fencing", [False, True])
def test_batch_takes_each_granted_key_once(
    make_url: Callable[..., str], holder: Callable[[str], int | None], fencing: bool
) -> None:
    names = _names(30)
    elsewhere = names[::3]
    url = make_url(fencing=fencing)
    with multilock.connect(url) as locker, multilock.connect(url) as other:
        assert isinstance(locker, MySQLLocker)
        assert isinstance(other, MySQLLocker)
        assert all(other.try_acquire_many(elsewhere).values())
        got = locker.try_acquire_many(names)
        assert list(got) == names
        assert [name for name, lease in got.items() if lease is None] == elsewhere
        leases = [lease for lease in got.values() if lease is not None]
        assert len({lease.token for lease in leases}) == len(leases)
        tokens = [lease.fencing_token for lease in leases]
        if fencing:
            assert all(isinstance(token, int) for token in tokens)
            # One UPDATE handed them out: consecutive, in the order of the names.
            assert tokens == list(range(tokens[0], tokens[0] + len(tokens)))  # type: ignore[arg-type,operator]
        else:
            assert tokens == [None] * len(leases)
        assert locker.try_acquire_many(elsewhere) == dict.fromkeys(elsewhere)
        for lease in leases:
            assert holder(lock_key(lease.name)) == locker.connection_id
            assert lease.release() is True
            assert holder(lock_key(lease.name)) is None  # one release frees it: never taken twice
        for name in elsewhere:
            assert holder(lock_key(name)) == other.connection_id


def test_threads_share_one_locker_safely(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    names = _names(3)
    inside: Counter[str] = Counter()
    overlaps: list[str] = []
    guard = threading.Lock()
    errors: list[BaseException] = []

    with multilock.connect(make_url(health_interval="20ms")) as locker:

        def work() -> None:
            try:
                for i in range(150):
                    name = names[i % len(names)]
                    lease = locker.try_acquire(name)
                    if lease is None:
                        continue
                    with guard:
                        inside[name] += 1
                        if inside[name] > 1:
                            overlaps.append(name)
                    with guard:
                        inside[name] -= 1
                    assert lease.release() is True
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert overlaps == []
        assert all(holder(lock_key(name)) is None for name in names)


def test_tasks_share_one_locker_safely(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    names = _names(3)
    inside: Counter[str] = Counter()
    overlaps: list[str] = []

    async def main() -> None:
        async with multilock.connect_async(make_url(health_interval="20ms")) as locker:

            async def work() -> None:
                for i in range(100):
                    name = names[i % len(names)]
                    lease = await locker.try_acquire(name)
                    if lease is None:
                        continue
                    inside[name] += 1
                    if inside[name] > 1:
                        overlaps.append(name)
                    await asyncio.sleep(0)
                    inside[name] -= 1
                    assert await lease.release() is True

            await asyncio.gather(*(work() for _ in range(8)))

    asyncio.run(main())
    assert overlaps == []
    assert all(holder(lock_key(name)) is None for name in names)


def test_cancelled_async_acquires_leave_nothing_held(
    make_url: Callable[..., str], holder: Callable[[str], int | None]
) -> None:
    names = _names(40)

    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            await locker.try_acquire(f"connect-{names[0]}")
            for i, name in enumerate(names):
                task = asyncio.ensure_future(locker.try_acquire_many([name, name + "-b"]))
                await asyncio.sleep(i * 0.00005)  # lands before, during and after the answer
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    continue
                for lease in task.result().values():
                    assert lease is not None
                    await lease.release()

    asyncio.run(main())
    poll(
        "nothing held after cancelled acquires",
        lambda: all(
            holder(lock_key(n)) is None and holder(lock_key(n + "-b")) is None for n in names
        ),
        within=2,
    )
