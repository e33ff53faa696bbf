"""One dedicated session per locker, tracked by key, shared safely by threads and tasks."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable

import pytest

import multilock
from multilock import advisory_key
from multilock.testing import poll
from multilock_postgres import AsyncPostgresLocker, PostgresLocker


def _names(count: int) -> list[str]:
    prefix = uuid.uuid4().hex
    return [f"session-{prefix}-{i}" for i in range(count)]


def _gone(sessions: Callable[[str], int], app_name: str) -> None:
    # The server ends a closed session's backend a moment after the client hangs up,
    # and pg_stat_activity lists it until then.
    poll(f"no session of {app_name} left", lambda: sessions(app_name) == 0, within=5)


def test_hundred_leases_use_one_session(
    make_url: Callable[..., str], app_name: str, sessions: Callable[[str], int]
) -> None:
    with multilock.connect(make_url()) as locker:
        leases = [locker.try_acquire(name) for name in _names(60)]
        leases += locker.try_acquire_many(_names(40)).values()
        assert all(lease is not None for lease in leases)
        assert len(leases) == 100
        assert 1 <= sessions(app_name) <= 2
        for lease in leases:
            assert lease is not None
            lease.release()
    _gone(sessions, app_name)


def test_async_hundred_leases_use_one_session(
    make_url: Callable[..., str], app_name: str, sessions: Callable[[str], int]
) -> None:
    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            leases = await asyncio.gather(*(locker.try_acquire(n) for n in _names(100)))
            assert all(lease is not None for lease in leases)
            assert 1 <= sessions(app_name) <= 2

    asyncio.run(main())
    _gone(sessions, app_name)


def test_held_key_is_not_reentered(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    (name,) = _names(1)
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, PostgresLocker)
        lease = locker.try_acquire(name)
        assert lease is not None
        assert locker.try_acquire(name) is None
        assert locker.try_acquire_many([name])[name] is None
        assert holders(advisory_key(name)) == [locker.session_pid]
        assert lease.release() is True
        # Unlocked exactly once and fully: the re-entrant count never went above one.
        assert holders(advisory_key(name)) == []
        assert lease.release() is False
        again = locker.try_acquire(name)
        assert again is not None
        again.release()


def test_names_sharing_a_key_exclude_each_other(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    first, other = _names(2)
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, PostgresLocker)
        # A real FNV-1a 64 collision is impractical to find: plant one in the key cache.
        locker._keys._keys[other] = advisory_key(first)
        lease = locker.try_acquire(first)
        assert lease is not None
        assert locker.try_acquire(other) is None
        assert locker.try_acquire_many([other])[other] is None
        lease.release()
        assert holders(advisory_key(first)) == []
        # In one batch, the first name of a key gets the lease and the key is asked once.
        got = locker.try_acquire_many([first, other])
        assert list(got) == [first, other]
        assert got[other] is None
        batch_lease = got[first]
        assert batch_lease is not None
        batch_lease.release()
        assert holders(advisory_key(first)) == []


def test_suspect_keys_are_unlocked_before_the_next_query(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    first, second, later = _names(3)
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, PostgresLocker)
        lease = locker.try_acquire(later)  # connect
        assert lease is not None
        # What an acquire interrupted in flight leaves: keys the server may have
        # granted to the session, with no lease. Planted here by locking them directly,
        # holding the session as the locker's own round trips do.
        keys = [advisory_key(first), advisory_key(second)]
        with locker._holding:
            assert locker._cursor is not None
            locker._cursor.execute(
                "SELECT pg_advisory_lock(k) FROM unnest(%s::bigint[]) AS k", [keys]
            )
            locker._suspects.update(keys)
        assert [holders(key) for key in keys] == [[locker.session_pid]] * 2
        lease.release()
        assert [holders(key) for key in keys] == [[], []]


def test_a_release_the_server_did_not_hold_is_logged_with_its_key(
    make_url: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    name, other = _names(2)
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, PostgresLocker)
        lease = locker.try_acquire(name)
        assert lease is not None
        # Unlocked behind the locker's back, holding the session as its round trips do.
        with locker._holding:
            assert locker._cursor is not None
            locker._cursor.execute("SELECT pg_advisory_unlock(%s)", [advisory_key(name)])
        with caplog.at_level("ERROR", logger="multilock.postgres"):
            assert lease.release() is False
        line = f"advisory key {advisory_key(name)} of {name!r}: 1 not held by the session"
        assert [record.getMessage() for record in caplog.records] == [line]
        caplog.clear()
        leases = locker.try_acquire_many([name, other])
        with locker._holding:
            assert locker._cursor is not None
            locker._cursor.execute("SELECT pg_advisory_unlock_all()")
        with caplog.at_level("ERROR", logger="multilock.postgres"):
            locker.release_many([lease for lease in leases.values() if lease is not None])
        assert [record.getMessage() for record in caplog.records] == [
            "advisory 2 keys: 2 not held by the session"
        ]


@pytest.mark.parametrize("fencing", [False, True])
def test_batch_takes_each_granted_key_once(
    make_url: Callable[..., str], holders: Callable[[int], list[int]], fencing: bool
) -> None:
    names = _names(30)
    elsewhere = names[::3]
    url = make_url(fencing=fencing)
    with multilock.connect(url) as locker, multilock.connect(url) as other:
        assert isinstance(locker, PostgresLocker)
        assert isinstance(other, PostgresLocker)
        assert all(other.try_acquire_many(elsewhere).values())
        got = locker.try_acquire_many(names)
        assert list(got) == names
        assert [name for name, lease in got.items() if lease is None] == elsewhere
        leases = [lease for lease in got.values() if lease is not None]
        assert len({lease.token for lease in leases}) == len(leases)
        tokens = [lease.fencing_token for lease in leases]
        if fencing:
            assert all(token is not None and token > 0 for token in tokens)
            assert len(set(tokens)) == len(tokens)
        else:
            assert tokens == [None] * len(leases)
        # Nothing granted at all: the answer has no keys, not a row per key.
        assert locker.try_acquire_many(elsewhere) == dict.fromkeys(elsewhere)
        for lease in leases:
            assert holders(advisory_key(lease.name)) == [locker.session_pid]
            assert lease.release() is True
            # One unlock frees it: the batch locked each key once, not re-entrantly.
            assert holders(advisory_key(lease.name)) == []
        for name in elsewhere:
            assert holders(advisory_key(name)) == [other.session_pid]


def test_threads_share_one_locker_safely(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
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
        assert all(holders(advisory_key(name)) == [] for name in names)


def test_tasks_share_one_locker_safely(
    make_url: Callable[..., str], holders: Callable[[int], list[int]]
) -> None:
    names = _names(3)
    inside: Counter[str] = Counter()
    overlaps: list[str] = []

    async def main() -> None:
        async with multilock.connect_async(make_url(health_interval="20ms")) as locker:
            assert isinstance(locker, AsyncPostgresLocker)

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
    assert all(holders(advisory_key(name)) == [] for name in names)


def test_an_error_after_the_grant_leaves_no_lock_orphaned(
    make_url: Callable[..., str],
    holders: Callable[[int], list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The server granted the locks, then the locker failed before handing out leases:
    # each granted key is either tracked (close() frees it) or unlocked at once.
    probe, one, *many = _names(5)
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, PostgresLocker)
        assert locker.try_acquire_many([probe])[probe] is not None  # connected, checked

        def no_thread() -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(locker, "_ensure_ticker", no_thread)
        with pytest.raises(RuntimeError):
            locker.try_acquire(one)
        pid = locker.session_pid
        assert holders(advisory_key(one)) == [pid]  # tracked...
        assert [lease.name for lease in locker._held.values()] == [probe, one]
        monkeypatch.undo()
        grant = locker._grant
        granted: list[str] = []

        def grant_once(name: str, *args: object) -> object:
            if granted:
                raise MemoryError
            granted.append(name)
            return grant(name, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(locker, "_grant", grant_once)
        with pytest.raises(MemoryError):
            locker.try_acquire_many(many)
        assert holders(advisory_key(many[0])) == [pid]  # tracked
        assert [holders(advisory_key(name)) for name in many[1:]] == [[], []]  # unlocked
    assert [holders(advisory_key(name)) for name in [one, *many]] == [[]] * 4  # ...freed
