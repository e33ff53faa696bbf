"""A restart of the server: leases fire ``lost``, calls fail promptly while it is
down, and the locker reconnects by itself once it is back. Runs on a private
throwaway server, so that the shared one is never restarted."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

import multilock
from multilock.errors import BackendUnavailable
from multilock.testing._servers.postgres import PrivateServer

pytestmark = pytest.mark.faults

INTERVAL = 0.5


def _name() -> str:
    return f"restart-{uuid.uuid4().hex}"


def test_restart_fires_lost_and_the_locker_reconnects(private_server: PrivateServer) -> None:
    with multilock.connect(f"{private_server.url}?health_interval={INTERVAL}") as locker:
        lease = locker.try_acquire(_name())
        assert lease is not None
        try:
            private_server.stop()
            stopped = time.monotonic()
            assert lease.lost.wait(INTERVAL + 1.0)
            assert time.monotonic() - stopped <= INTERVAL + 1.0
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                locker.try_acquire(_name())  # down: an error, never None
            assert time.monotonic() - started < 3.0
        finally:
            private_server.start()
        again = locker.try_acquire(lease.name)  # back: a new session, transparently
        assert again is not None
        again.release()


def test_async_restart_fires_lost_and_the_locker_reconnects(
    private_server: PrivateServer,
) -> None:
    async def main() -> None:
        url = f"{private_server.url}?health_interval={INTERVAL}"
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire(_name())
            assert lease is not None
            try:
                private_server.stop()

                async def lost() -> str:
                    return await lease.lost

                await asyncio.wait_for(lost(), INTERVAL + 1.0)
                with pytest.raises(BackendUnavailable):
                    await locker.try_acquire(_name())
            finally:
                private_server.start()
            again = await locker.try_acquire(lease.name)
            assert again is not None
            await again.release()

    asyncio.run(main())


def test_a_shutdown_fires_lost_within_100_ms(private_server: PrivateServer) -> None:
    # Issue 16: the server ending every session is seen on each idle session's socket at
    # once (health_interval is an hour: the check cannot be what noticed).
    with (
        multilock.connect(f"{private_server.url}?health_interval=1h") as locker,
        multilock.connect(f"{private_server.url}?health_interval=1h") as other,
    ):
        leases = [locker.try_acquire(_name()), other.try_acquire(_name())]
        fired: list[float] = []
        for lease in leases:
            assert lease is not None
            lease.lost.add_callback(lambda _reason: fired.append(time.monotonic()))
        try:
            stopping = time.monotonic()
            private_server.stop()  # SIGINT, then waits for the server to exit
            for lease in leases:
                assert lease is not None
                assert lease.lost.wait(5.0)
            assert max(fired) - stopping <= 0.1, max(fired) - stopping
        finally:
            private_server.start()
