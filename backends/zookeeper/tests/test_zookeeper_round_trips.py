"""Round trips, counted through a proxy that delays every answer of the real server.

With each answer ``DELAY`` late, a request that needs one round trip takes
about ``DELAY``, two take ``2 * DELAY``: acquire and release must take one, and
``try_acquire_many`` of many names one as well (its creates are all in flight
together).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import multilock
from multilock.backend import LockURL
from multilock.testing import TcpProxy

DELAY = 0.4
ONE_TRIP = 1.7 * DELAY  # a second round trip would need 2 * DELAY (0.28 s spare for a busy host)


@pytest.fixture
def slow_url(make_url: Callable[..., str], tcp_proxy: Callable[[tuple[str, int]], TcpProxy]) -> str:
    """The test's URL, through a proxy that makes every round trip ``DELAY`` long."""
    url = LockURL.parse(make_url())
    proxy = tcp_proxy((url.host or "127.0.0.1", url.port or 2181))
    proxy.delay(DELAY, "answers")
    return f"zookeeper://127.0.0.1:{proxy.port}{url.path}"


def timed(call: Callable[[], object]) -> tuple[object, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


def test_acquire_and_release_are_one_round_trip_each(slow_url: str) -> None:
    with multilock.connect(slow_url) as locker:
        warm = locker.try_acquire("warm-up")  # connects, and creates the chroot
        assert warm is not None
        lease, took = timed(lambda: locker.try_acquire("job"))
        assert lease is not None
        assert DELAY <= took < ONE_TRIP, f"acquire took {took:.3f} s"
        refused, took = timed(lambda: locker.try_acquire("job"))
        assert refused is None
        assert took < ONE_TRIP, f"a refused acquire took {took:.3f} s"
        released, took = timed(lambda: lease.release())  # type: ignore[attr-defined]
        assert released is True
        assert took < ONE_TRIP, f"release took {took:.3f} s"


def test_try_acquire_many_is_one_round_trip(slow_url: str) -> None:
    names = [f"job-{i}" for i in range(20)]
    with multilock.connect(slow_url) as locker:
        assert locker.try_acquire("job-3") is not None  # one of them is held already
        leases, took = timed(lambda: locker.try_acquire_many(names))
        assert took < ONE_TRIP, f"20 acquires took {took:.3f} s"
        assert [name for name, lease in leases.items() if lease is None] == ["job-3"]  # type: ignore[attr-defined]


def test_async_try_acquire_many_is_one_round_trip(slow_url: str) -> None:
    names = [f"job-{i}" for i in range(20)]

    async def main() -> None:
        async with multilock.connect_async(slow_url) as locker:
            assert await locker.try_acquire("warm-up") is not None
            start = time.monotonic()
            leases = await locker.try_acquire_many(names)
            took = time.monotonic() - start
            assert took < ONE_TRIP, f"20 acquires took {took:.3f} s"
            assert all(lease is not None for lease in leases.values())

    asyncio.run(main())
