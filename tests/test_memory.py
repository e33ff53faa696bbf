"""memory://: in-process locks, namespaces, revoke."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

import multilock
from multilock import Capability
from multilock._locks.memory import MemoryLocker
from multilock.errors import InvalidOption


def _namespace() -> str:
    return f"memory://test-{uuid.uuid4().hex}"


def connect(url: str) -> MemoryLocker:
    locker = multilock.connect(url)
    assert isinstance(locker, MemoryLocker)
    return locker


def test_lockers_of_one_namespace_exclude_each_other() -> None:
    url = _namespace()
    with connect(url) as one, connect(url) as two:
        lease = one.try_acquire("job")
        assert lease is not None
        assert two.try_acquire("job") is None
        assert one.try_acquire("job") is None
        lease.release()
        assert two.try_acquire("job") is not None


def test_namespaces_are_isolated() -> None:
    with connect(_namespace()) as one, connect(_namespace()) as two:
        assert one.try_acquire("job") is not None
        assert two.try_acquire("job") is not None


def test_namespace_includes_the_path() -> None:
    base = _namespace()
    with connect(f"{base}/a") as one, connect(f"{base}/b") as two, connect(f"{base}/a") as three:
        assert one.try_acquire("job") is not None
        assert two.try_acquire("job") is not None
        assert three.try_acquire("job") is None


def test_revoke_fires_lost_and_frees_the_name() -> None:
    url = _namespace()
    with connect(url) as holder, connect(url) as admin:
        lease = holder.try_acquire("job")
        assert lease is not None
        reasons: list[str] = []
        lease.lost.add_callback(reasons.append)
        assert admin.revoke("job", "operator said so") is True
        assert reasons == ["operator said so"]
        assert not lease.held
        assert admin.revoke("job") is False  # nobody holds it now
        successor = admin.try_acquire("job")
        assert successor is not None
        # The stale holder's release is a compare-and-delete: the successor keeps it.
        assert lease.release() is False
        assert holder.try_acquire("job") is None
        assert successor.held


def test_revoke_wakes_an_async_waiter() -> None:
    url = _namespace()

    async def scenario() -> str:
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire("job")
            assert lease is not None
            threading.Timer(0.01, connect(url).revoke, args=("job", "gone")).start()
            return await asyncio.wait_for(lease.lost, timeout=10)

    assert asyncio.run(scenario()) == "gone"


def test_fencing_tokens_increase_per_name() -> None:
    with connect(_namespace()) as locker:
        seen = []
        for _ in range(3):
            lease = locker.try_acquire("job")
            assert lease is not None
            seen.append(lease.fencing_token)
            lease.release()
        other = locker.try_acquire("other")
        assert other is not None
    assert seen == [1, 2, 3]
    assert other.fencing_token == 1


def test_close_releases_only_this_lockers_leases() -> None:
    url = _namespace()
    with connect(url) as keeper:
        kept = keeper.try_acquire("kept")
        assert kept is not None
        closing = connect(url)
        assert closing.try_acquire("dropped") is not None
        closing.close()
        assert [info.name for info in keeper.locks()] == ["kept"]
        assert kept.held


def test_locks_lists_holders() -> None:
    with connect(_namespace()) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        [info] = locker.locks()
        assert (info.name, info.key, info.holder) == ("job", "job", lease.token)


def test_exclusion_across_threads() -> None:
    url = _namespace()
    winners: list[int] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        with connect(url) as locker:
            barrier.wait(10)
            if locker.try_acquire("job") is not None:
                winners.append(i)
            barrier.wait(10)  # hold until every thread has tried

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(winners) == 1


def test_capabilities_and_options() -> None:
    with connect(f"{_namespace()}?ttl=5s") as locker:
        assert Capability.LOST_SIGNAL in locker.capabilities
        assert Capability.CROSS_PROCESS not in locker.capabilities
        assert locker.default_ttl == 5.0
    with pytest.raises(InvalidOption, match="unknown option 'prefix'"):
        multilock.connect("memory://x?prefix=a")
