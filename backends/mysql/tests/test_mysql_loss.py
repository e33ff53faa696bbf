"""A session the server ends fires ``lost`` at once (its socket is watched); a server
that stops answering fires it within ``health_interval`` + ``health_timeout``; no call
waits without a bound; the next call reconnects."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

import multilock
from multilock import LostSignal
from multilock.errors import BackendUnavailable, LockLost
from multilock.testing import TcpProxy, poll
from multilock.testing._servers.mysql import PrivateServer
from multilock_mysql import AsyncMySQLLocker, MySQLLocker

from .conftest import query, with_options

SOON = 0.5  # seconds: a hang-up is seen in milliseconds; this is slack for a loaded machine
INTERVAL, TIMEOUT = 0.5, 0.5


def _name() -> str:
    return f"loss-{uuid.uuid4().hex}"


def _kill(admin: pymysql.Connection[Any], connection: int | None) -> None:
    assert connection is not None
    query(admin, f"KILL CONNECTION {connection}")


async def _wait(signal: LostSignal) -> str:
    return await signal


def test_killed_session_fires_lost_at_once_off_the_callers_thread(
    make_url: Callable[..., str], admin: pymysql.Connection[Any]
) -> None:
    # An hour between health checks: only the socket watch can notice in time.
    with multilock.connect(make_url(health_interval="1h")) as locker:
        assert isinstance(locker, MySQLLocker)
        leases = [locker.try_acquire(_name()) for _ in range(3)]
        fired_on: list[threading.Thread] = []
        for lease in leases:
            assert lease is not None
            lease.lost.add_callback(lambda _reason: fired_on.append(threading.current_thread()))
        old = locker.connection_id
        killed = time.monotonic()
        _kill(admin, old)
        for lease in leases:
            assert lease is not None
            assert lease.lost.wait(SOON), "a killed session went unnoticed"
            assert not lease.held
        assert time.monotonic() - killed <= SOON
        assert len(fired_on) == 3
        assert threading.main_thread() not in fired_on
        first = leases[0]
        assert first is not None
        assert "session ended" in (first.lost.reason or "")
        with pytest.raises(LockLost):
            first.extend()
        # The next acquire reconnects transparently; a lost lease releases as a no-op.
        again = locker.try_acquire(first.name)
        assert again is not None
        assert locker.connection_id not in (None, old)
        assert first.release() is False
        assert again.held
        again.release()


def test_async_killed_session_fires_lost_at_once(
    make_url: Callable[..., str], admin: pymysql.Connection[Any]
) -> None:
    async def main() -> None:
        async with multilock.connect_async(make_url(health_interval="1h")) as locker:
            assert isinstance(locker, AsyncMySQLLocker)
            lease = await locker.try_acquire(_name())
            assert lease is not None
            old = locker.connection_id
            killed = time.monotonic()
            await asyncio.to_thread(_kill, admin, old)
            reason = await asyncio.wait_for(_wait(lease.lost), SOON)
            assert time.monotonic() - killed <= SOON
            assert "session ended" in reason
            again = await locker.try_acquire(lease.name)
            assert again is not None
            assert locker.connection_id not in (None, old)
            await again.release()

    asyncio.run(main())


def test_a_lost_callback_may_call_back_into_the_locker(
    make_url: Callable[..., str], admin: pymysql.Connection[Any]
) -> None:
    with multilock.connect(make_url(health_interval="1h")) as locker:
        assert isinstance(locker, MySQLLocker)
        lease = locker.try_acquire(_name())
        assert lease is not None
        taken: list[object] = []
        lease.lost.add_callback(lambda _reason: taken.append(locker.try_acquire(lease.name)))
        _kill(admin, locker.connection_id)
        poll("the callback's acquire", lambda: bool(taken), within=SOON + 2.0)
        assert taken[0] is not None  # a new session: the old one took the lock with it


def test_idle_dead_session_reconnects_on_next_acquire(
    make_url: Callable[..., str], admin: pymysql.Connection[Any]
) -> None:
    with multilock.connect(make_url(health_interval="1h")) as locker:
        assert isinstance(locker, MySQLLocker)
        first = locker.try_acquire(_name())
        assert first is not None
        first.release()
        old = locker.connection_id
        _kill(admin, old)
        lease = locker.try_acquire(_name())
        assert lease is not None
        assert locker.connection_id not in (None, old)
        lease.release()


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_frozen_server_loses_the_leases_and_bounds_every_call(
    private: PrivateServer, api: str
) -> None:
    """SIGSTOP: the kernel takes the bytes, nothing answers -- what TCP never reports."""
    # The default timeout (5 s) bounds the calls; the health check has its own, shorter.
    url = with_options(
        private.url, health_interval=INTERVAL, health_timeout=TIMEOUT, connect_timeout="1s"
    )
    bound = INTERVAL + TIMEOUT + 1.0

    def sync() -> None:
        with multilock.connect(url) as locker:
            lease = locker.try_acquire(_name())
            assert lease is not None
            private.freeze()
            try:
                frozen = time.monotonic()
                assert lease.lost.wait(bound), "a hung server went unnoticed"
                assert time.monotonic() - frozen <= bound
                assert "did not answer" in (lease.lost.reason or "")
                start = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    locker.try_acquire(_name())
                assert time.monotonic() - start <= 1.0 + 5.0 + 1.0  # connect_timeout + timeout
            finally:
                private.thaw()
            again = locker.try_acquire(lease.name)
            assert again is not None
            again.release()

    async def asynchronous() -> None:
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire(_name())
            assert lease is not None
            private.freeze()
            try:
                frozen = time.monotonic()
                reason = await asyncio.wait_for(_wait(lease.lost), bound)
                assert time.monotonic() - frozen <= bound
                assert "did not answer" in reason
                start = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    await locker.try_acquire(_name())
                assert time.monotonic() - start <= 1.0 + 5.0 + 1.0
            finally:
                private.thaw()
            again = await locker.try_acquire(lease.name)
            assert again is not None
            await again.release()

    if api == "sync":
        sync()
    else:
        asyncio.run(asynchronous())


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_call_on_a_frozen_server_fails_within_its_timeout(
    private: PrivateServer, api: str
) -> None:
    url = with_options(private.url, health_interval="1h", timeout=TIMEOUT)

    async def attempt(locker: Any) -> None:
        result = locker.try_acquire(_name())
        if asyncio.iscoroutine(result):
            await result

    async def main() -> None:
        locker: Any = (multilock.connect if api == "sync" else multilock.connect_async)(url)
        try:
            await attempt(locker)  # connected
            private.freeze()
            try:
                start = time.monotonic()
                with pytest.raises(BackendUnavailable, match="did not answer"):
                    await attempt(locker)
                assert time.monotonic() - start <= TIMEOUT + 1.0
            finally:
                private.thaw()
        finally:
            closing = locker.close() if api == "sync" else locker.aclose()
            if asyncio.iscoroutine(closing):
                await closing

    asyncio.run(main())


def test_a_restarted_server_fires_lost_at_once_and_the_locker_comes_back(
    private: PrivateServer,
) -> None:
    url = with_options(private.url, health_interval="1h", connect_timeout="1s")
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(_name())
        assert lease is not None
        stopped = time.monotonic()
        private.stop()
        try:
            assert lease.lost.wait(SOON + 1.0), "a server shutdown went unnoticed"
            assert time.monotonic() - stopped <= 30  # the stop itself waits for the server
            start = time.monotonic()
            with pytest.raises(BackendUnavailable):
                locker.try_acquire(_name())
            assert time.monotonic() - start <= 3.0
        finally:
            private.start()
        again = locker.try_acquire(lease.name)
        assert again is not None
        again.release()


async def _call(result: Any) -> Any:
    """The value of a sync call, or of an async one awaited."""
    return await result if asyncio.iscoroutine(result) else result


# The documented bound of each call (docs/backends/mysql.md, "Deadlines"), with
# connect_timeout = timeout = TIMEOUT.
_BOUNDS = {"connect": 2 * TIMEOUT, "release": TIMEOUT, "extend": TIMEOUT, "locks": 3 * TIMEOUT}


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("operation", sorted(_BOUNDS))
def test_no_call_outlives_its_bound_on_a_frozen_server(
    private: PrivateServer, api: str, operation: str
) -> None:
    """SIGSTOP: the kernel still completes TCP handshakes and takes bytes; nothing answers.
    A new session, ``locks()`` and an extend fail with ``BackendUnavailable`` (an extend
    cuts the session, so its lease is lost: ``LockLost``); a release reports the lock
    gone with the session (``False``). Each within its bound."""
    url = with_options(private.url, timeout=TIMEOUT, connect_timeout=TIMEOUT, health_interval="1h")

    async def attempt(locker: Any, lease: Any) -> object:
        try:
            if operation == "connect":
                return await _call(locker.try_acquire(_name()))
            if operation == "locks":
                return await _call(locker.locks())
            return await _call(getattr(lease, operation)())
        except (BackendUnavailable, LockLost) as exc:
            return type(exc)

    async def main() -> object:
        locker: Any = (multilock.connect if api == "sync" else multilock.connect_async)(url)
        try:
            lease = None if operation == "connect" else await _call(locker.try_acquire(_name()))
            private.freeze()
            try:
                start = time.monotonic()
                outcome = await attempt(locker, lease)
                elapsed = time.monotonic() - start
                assert elapsed <= _BOUNDS[operation] + 1.0, f"{operation} took {elapsed:.2f}s"
            finally:
                private.thaw()
        finally:
            await _call(locker.close() if api == "sync" else locker.aclose())
        return outcome

    expected = {"release": False, "extend": LockLost}.get(operation, BackendUnavailable)
    assert asyncio.run(main()) == expected


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("operation", sorted(_BOUNDS))
def test_no_call_outlives_its_bound_on_a_trickling_server(
    mysql_url: str, api: str, operation: str
) -> None:
    """An answer trickling in a byte every 0.2 s keeps each read short (the driver's
    read timeout never fires) and would keep a call alive for ever: each call is cut
    at its bound as on a frozen server, sync and async."""
    with TcpProxy.before(mysql_url) as proxy:
        url = with_options(
            proxy.url(mysql_url), timeout=TIMEOUT, connect_timeout=TIMEOUT, health_interval="1h"
        )

        async def main() -> object:
            locker: Any = (multilock.connect if api == "sync" else multilock.connect_async)(url)
            try:
                lease = None
                if operation != "connect":
                    lease = await _call(locker.try_acquire(_name()))
                proxy.trickle(0.2)
                start = time.monotonic()
                try:
                    if operation == "connect":
                        outcome = await _call(locker.try_acquire(_name()))
                    elif operation == "locks":
                        outcome = await _call(locker.locks())
                    else:
                        outcome = await _call(getattr(lease, operation)())
                except (BackendUnavailable, LockLost) as exc:
                    outcome = type(exc)
                elapsed = time.monotonic() - start
                assert elapsed <= _BOUNDS[operation] + 1.0, f"{operation} took {elapsed:.2f}s"
                proxy.trickle(None)
            finally:
                await _call(locker.close() if api == "sync" else locker.aclose())
            return outcome

        expected = {"release": False, "extend": LockLost}.get(operation, BackendUnavailable)
        assert asyncio.run(main()) == expected
