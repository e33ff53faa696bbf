"""A lost lease is noticed as soon as the client can know it, on the sync and async API.

The server ends the holder's session (a second client attaches to it and closes it
at once, as the session's expiry would) and closes the holder's connection. With
``suspended=lost`` (the default) the dropped connection fires ``lost`` by itself;
with ``suspended=keep`` the holder learns that the session is gone on reconnecting,
which it does at once. A server that crashes resets its connections: ``lost`` fires
(``suspended=lost``) without waiting for any timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import multilock
from multilock.backend import LockURL
from multilock.testing._servers.zookeeper import PrivateZooKeeper
from multilock_zookeeper._config import Config
from multilock_zookeeper._expire import end_session as _end_session

AT_ONCE = 0.1
"""Seconds from the server ending the session to ``lost``: the bound of issue 16."""
BOUND = 10.0


def end_session(url: str, locker: Any) -> float:
    """End the locker's session from outside; when the server was asked (monotonic)."""
    client_id = locker._session.client.client_id
    sent = time.monotonic()
    _end_session(Config.from_url(LockURL.parse(url)), client_id)
    return sent


@pytest.mark.parametrize("policy", ["lost", "keep"])
def test_a_session_ended_by_the_server_fires_lost_at_once(
    make_url: Callable[..., str], policy: str
) -> None:
    url = make_url(suspended=policy)
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        fired: list[float] = []
        lease.lost.add_callback(lambda _: fired.append(time.monotonic()))
        sent = end_session(url, locker)
        assert lease.lost.wait(BOUND), "lost never fired"
        took = fired[0] - sent
        assert took < AT_ONCE, f"lost fired {took:.3f} s after the session was closed"


@pytest.mark.parametrize("policy", ["lost", "keep"])
def test_async_a_session_ended_by_the_server_fires_lost_at_once(
    make_url: Callable[..., str], policy: str
) -> None:
    url = make_url(suspended=policy)

    async def main() -> float:
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire("job")
            assert lease is not None

            async def woken() -> float:
                await lease.lost
                return time.monotonic()

            waiter = asyncio.ensure_future(woken())
            sent = await asyncio.to_thread(end_session, url, locker)
            return await asyncio.wait_for(waiter, BOUND) - sent

    took = asyncio.run(main())
    assert took < AT_ONCE, f"await lease.lost returned {took:.3f} s after the session was closed"


@pytest.mark.faults
def test_a_server_crash_fires_lost_at_once_sync_and_async(
    private_zookeeper: Callable[..., PrivateZooKeeper],
) -> None:
    server = private_zookeeper()
    url = f"{server.url}?session_timeout=20s"
    with multilock.connect(url) as locker:

        async def main() -> float:
            async with multilock.connect_async(url) as async_locker:
                lease = locker.try_acquire("sync")
                async_lease = await async_locker.try_acquire("async")
                assert lease is not None
                assert async_lease is not None
                fired: list[float] = []
                lease.lost.add_callback(lambda _: fired.append(time.monotonic()))

                async def woken() -> float:
                    await async_lease.lost
                    return time.monotonic()

                waiter = asyncio.ensure_future(woken())
                await asyncio.sleep(0)  # the waiter waits
                killed = time.monotonic()
                server.kill()
                async_took = await asyncio.wait_for(waiter, BOUND) - killed
                assert await asyncio.to_thread(lease.lost.wait, BOUND)
                sync_took = fired[0] - killed
                return max(sync_took, async_took)

        took = asyncio.run(main())
    assert took < AT_ONCE, f"lost fired {took:.3f} s after the server was killed"
