"""Bounded input: a lock name longer than the documented maximum (64 KiB of UTF-8) is
refused with InvalidLockName by every backend, sync and async, before any server is
asked; the PostgreSQL name cache is bounded by bytes, not only by entries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import multilock
from multilock import Scheduler, every
from multilock.backend import MAX_NAME_BYTES
from multilock.errors import InvalidLockName

BACKENDS = ["memory_url", "file_url", "postgres_url", "redis_url", "zookeeper_url"]
TOO_LONG = "é" * (MAX_NAME_BYTES // 2) + "x"  # 64 KiB + 1 byte, in 32 Ki + 1 characters


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest) -> str:
    """The URL of each backend."""
    return str(request.getfixturevalue(request.param))


def _refused(call: Callable[[], object]) -> str:
    started = time.perf_counter()
    with pytest.raises(InvalidLockName) as info:
        call()
    assert time.perf_counter() - started < 0.05  # refused before any hashing or round trip
    return str(info.value)


def test_a_name_over_the_maximum_is_refused_sync(url: str) -> None:
    with multilock.connect(url) as locker:
        message = _refused(lambda: locker.try_acquire(TOO_LONG))
        _refused(lambda: locker.try_acquire_many(["a", TOO_LONG]))
        assert locker.try_acquire_many(["a"])["a"] is not None  # nothing left held by them
    assert f"lock name of {MAX_NAME_BYTES + 1} bytes is too long" in message
    assert len(message) < 200


def test_a_name_over_the_maximum_is_refused_async(url: str) -> None:
    async def scenario() -> None:
        async with multilock.connect_async(url) as locker:
            with pytest.raises(InvalidLockName):
                await locker.try_acquire(TOO_LONG)
            with pytest.raises(InvalidLockName):
                await locker.try_acquire_many(["b", TOO_LONG])
            assert (await locker.try_acquire_many(["b"]))["b"] is not None

    asyncio.run(scenario())


def test_a_name_at_the_maximum_is_taken(memory_url: str, file_url: str, postgres_url: str) -> None:
    longest = "é" * (MAX_NAME_BYTES // 2)  # exactly 64 KiB
    for url in (memory_url, file_url, postgres_url):
        with multilock.connect(url) as locker:
            lease = locker.try_acquire(longest)
            assert lease is not None, url
            lease.release()


def test_an_ascii_name_counts_one_byte_a_character() -> None:
    # ASCII names take a path of their own (no encoding): the bound is the same.
    with multilock.connect("memory://names-ascii") as locker:
        lease = locker.try_acquire("a" * MAX_NAME_BYTES)
        assert lease is not None
        lease.release()
        message = _refused(lambda: locker.try_acquire_many(["b", "a" * (MAX_NAME_BYTES + 1)]))
        assert locker.try_acquire_many(["b"])["b"] is not None  # nothing left held
    assert f"lock name of {MAX_NAME_BYTES + 1} bytes is too long" in message


def test_a_huge_name_is_refused_at_once_and_its_error_stays_one_short_line() -> None:
    huge = "n" * (1 << 20) + "\ud800"  # 1 MiB, and not valid Unicode either
    with multilock.connect("memory://names") as locker:
        message = _refused(lambda: locker.try_acquire(huge))
    assert "\n" not in message
    assert len(message) < 200


def test_the_scheduler_refuses_a_job_name_over_the_maximum() -> None:
    sched = Scheduler("memory://names-sched", metrics=False)
    with pytest.raises(InvalidLockName, match="too long"):
        sched.add_job(lambda: None, every(seconds=10), name=TOO_LONG)
    assert sched.jobs == []


def test_the_postgres_name_cache_is_bounded_by_bytes(postgres_url: str) -> None:
    runtime = pytest.importorskip("multilock_postgres._runtime")
    cache = runtime.KeyCache(size=4096, size_bytes=1 << 20)
    names = [f"{i:04d}" + "n" * 60_000 for i in range(60)]  # 60 names of ~60 KB
    keys = [cache.key(name) for name in names]
    assert keys == [multilock.advisory_key(name) for name in names]
    assert cache.size_bytes <= 1 << 20
    assert cache.name(keys[-1]) == names[-1]  # the newest are kept
    assert cache.name(keys[0]) is None  # the oldest made room
    # Through a locker with the default bound (4 MiB): 60 long names keep at most that.
    with multilock.connect(postgres_url) as locker:
        for name in names * 2:
            lease = locker.try_acquire(name + "x" * 5_000)
            assert lease is not None
            lease.release()
        assert locker._keys.size_bytes <= 4 << 20  # type: ignore[attr-defined]
