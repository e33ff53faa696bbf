"""The async API's started path (``multilock_redis/_started.py``): an acquire or a
release written on the link's connection at once, its answer read off the transport.

Each test warms the locker first (its connection opens on the task path) and then
forbids the task path where it must not be taken, so that a test passing on the task
path alone fails.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis

import multilock
from multilock.backend import Outcome
from multilock.errors import BackendUnavailable, MultilockError
from multilock.testing import TcpProxy, apoll
from multilock_redis import AsyncRedisLease, AsyncRedisLocker, fence_key, lock_key
from multilock_redis._async._lua import AsyncLink
from multilock_redis._common import CHUNK

TIMEOUT = 0.5  # the lockers' socket timeout here
PROMPT = TIMEOUT + 1.0


@pytest.fixture
def admin(redis_url: str) -> Any:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


async def _until(what: str, check: Callable[[], bool], within: float) -> None:
    """Poll ``check`` (a quick look at the server) without blocking the loop for long."""

    async def probe() -> bool:
        return check()

    await apoll(what, probe, within)


def _timeout(url: str, seconds: float) -> str:
    return f"{url}{'&' if '?' in url else '?'}socket_timeout={seconds}"


def _lease(lease: object) -> AsyncRedisLease:
    assert isinstance(lease, AsyncRedisLease), f"expected a lease, got {lease!r}"
    return lease


async def _warm(url: str, name: str) -> AsyncRedisLocker:
    """A locker whose connection is open (its first call took the task path)."""
    locker = multilock.connect_async(url)
    assert isinstance(locker, AsyncRedisLocker)
    assert isinstance(locker._link, AsyncLink)
    assert await _lease(await locker.try_acquire(f"{name}-warm-up")).release()
    return locker


async def _granted_in_flight(
    locker: AsyncRedisLocker, name: str, proxy: TcpProxy, admin: Any
) -> asyncio.Future[Any]:
    """An acquire of ``name`` the server has granted, its answer still on its way."""
    proxy.delay(0.3, "answers")
    call = asyncio.ensure_future(locker.try_acquire(name))
    key = lock_key(name, locker.prefix)
    await _until("the server granting the lock", lambda: admin.exists(key) == 1, 2)
    return call


def _no_task_path(locker: AsyncRedisLocker, monkeypatch: pytest.MonkeyPatch) -> None:
    async def refused(*_: object) -> Any:
        raise AssertionError("the task path was taken")

    monkeypatch.setattr(locker, "_try_acquire", refused)
    monkeypatch.setattr(locker, "_try_acquire_many", refused)
    monkeypatch.setattr(locker, "_release_lease", refused)


def test_a_warm_cycle_is_started_without_a_task(
    redis_url: str, admin: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        locker = await _warm(redis_url, name)
        try:
            _no_task_path(locker, monkeypatch)
            started = locker._start_try_acquire(name, 30.0)
            assert isinstance(started, Outcome)
            assert started.task is None
            lease = _lease(await started)
            assert admin.get(lock_key(name, locker.prefix)) == lease.token.encode()
            assert lease.fencing_token == int(admin.get(fence_key(name, locker.prefix)))
            assert await locker.try_acquire(name) is None  # held: the server says no
            released = lease.release_started()
            assert isinstance(released, Outcome)
            assert released.task is None
            assert await released is True
            assert admin.exists(lock_key(name, locker.prefix)) == 0
            again = _lease(await locker.try_acquire(name))
            assert again.fencing_token == lease.fencing_token + 1
            assert await again.release()
            assert not locker._held
        finally:
            await locker.aclose()

    _run(main)


def test_a_warm_batch_is_started_without_a_task(
    redis_url: str, admin: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        locker = await _warm(redis_url, name)
        names = [f"{name}-{i}" for i in range(3)]
        try:
            async with multilock.connect_async(redis_url) as other:
                elsewhere = _lease(await other.try_acquire(names[1]))
                _no_task_path(locker, monkeypatch)
                started = locker._start_try_acquire_many(names, 30.0)
                assert isinstance(started, Outcome)
                assert started.task is None
                leases = await started
                assert list(leases) == names
                assert leases[names[1]] is None
                for held in (names[0], names[2]):
                    lease = _lease(leases[held])
                    assert admin.get(lock_key(held, locker.prefix)) == lease.token.encode()
                    assert await lease.release()
                assert await elsewhere.release()
            more = [f"{name}-more-{i}" for i in range(CHUNK + 1)]
            assert locker._start_try_acquire_many(more, 30.0) is None  # pipelined instead
            assert not locker._held
        finally:
            await locker.aclose()

    _run(main)


def test_a_grant_that_cannot_be_held_is_given_back(
    redis_url: str, admin: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: object) -> None:
        raise RuntimeError("can't start new thread")

    async def main() -> None:
        locker = await _warm(redis_url, name)
        names = [f"{name}-{i}" for i in range(3)]
        try:
            monkeypatch.setattr(locker._renewer, "add", refuse)
            for start in (
                lambda: locker._start_try_acquire(name, 30.0),
                lambda: locker._start_try_acquire_many(names, 30.0),
            ):
                started = start()
                assert started is not None
                with pytest.raises(RuntimeError, match="new thread"):
                    await started
            assert admin.exists(*[lock_key(n, locker.prefix) for n in [name, *names]]) == 0
            assert not locker._held
        finally:
            await locker.aclose()

    _run(main)


def test_an_answer_arriving_in_pieces(
    redis_url: str, name: str, tcp_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy: TcpProxy = tcp_proxy(redis_url)

    async def main() -> None:
        locker = await _warm(proxy.url(redis_url), name)
        try:
            _no_task_path(locker, monkeypatch)
            proxy.trickle(0.005)  # ":<fence>\r\n", "$<size>\r\n<fences>\r\n" a byte at a time
            lease = _lease(await locker.try_acquire(name))
            assert await lease.release()
            leases = await locker.try_acquire_many([f"{name}-{i}" for i in range(3)])
            for granted in leases.values():
                assert await _lease(granted).release()
        finally:
            proxy.trickle(None)
            await locker.aclose()

    _run(main)


def test_a_cancelled_acquire_in_flight_leaves_nothing_held(
    redis_url: str, admin: Any, name: str, tcp_proxy: Any
) -> None:
    proxy: TcpProxy = tcp_proxy(redis_url)

    async def main() -> None:
        locker = await _warm(_timeout(proxy.url(redis_url), 5), name)
        key = lock_key(name, locker.prefix)
        try:
            call = await _granted_in_flight(locker, name, proxy, admin)
            call.cancel()  # the answer is still on its way
            with pytest.raises(asyncio.CancelledError):
                await call
            assert admin.exists(key) == 0  # released before the cancellation was raised
            assert not locker._held
        finally:
            proxy.delay(0.0)
            await locker.aclose()

    _run(main)


def test_the_server_lacking_the_script_loads_it(throwaway_redis: Any, name: str) -> None:
    # A server of its own: SCRIPT FLUSH would cost other tests a round trip.
    async def main() -> None:
        admin = throwaway_redis.admin()
        locker = await _warm(throwaway_redis.url, name)
        try:
            for names in ([name], [f"{name}-{i}" for i in range(3)]):
                admin.script_flush()
                started = locker._start_try_acquire_many(names, 30.0)
                assert started is not None  # sent at once, answered NOSCRIPT
                leases = [_lease(lease) for lease in (await started).values()]
                admin.script_flush()
                for lease in leases:
                    assert await lease.release()
                assert admin.exists(*[lock_key(n, locker.prefix) for n in names]) == 0
            started_again = locker._start_try_acquire(name, 30.0)
            assert started_again is not None  # the link is free
            assert await _lease(await started_again).release()
        finally:
            admin.close()
            await locker.aclose()

    _run(main)


def test_an_error_answer_is_the_task_paths_error_and_keeps_the_connection(
    redis_url: str, admin: Any, name: str
) -> None:
    async def main() -> None:
        locker = await _warm(redis_url, name)
        link = locker._link
        assert isinstance(link, AsyncLink)
        connection = link._socket.connection
        try:
            admin.rpush(fence_key(name, locker.prefix), "x")
            with pytest.raises(MultilockError, match="WRONGTYPE"):
                await locker.try_acquire(name, ttl=60)
            with pytest.raises(MultilockError, match="WRONGTYPE"):
                await locker.try_acquire_many([f"{name}-before", name], ttl=60)
            keys = [lock_key(n, locker.prefix) for n in (f"{name}-before", name)]
            assert admin.exists(*keys) == 0
            assert not locker._held
            admin.delete(fence_key(name, locker.prefix))
            # Nothing broke: the same connection answers the next call, started.
            writer = connection._writer
            assert writer is not None
            lease = _lease(await locker.try_acquire(name))
            assert connection._writer is writer
            assert await lease.release()
        finally:
            await locker.aclose()

    _run(main)


def test_a_connection_reset_in_flight_fails_promptly_and_frees_the_lock_later(
    redis_url: str, admin: Any, name: str, tcp_proxy: Any
) -> None:
    proxy: TcpProxy = tcp_proxy(redis_url)

    async def main() -> None:
        locker = await _warm(_timeout(proxy.url(redis_url), TIMEOUT), name)
        key = lock_key(name, locker.prefix)
        try:
            call = await _granted_in_flight(locker, name, proxy, admin)
            proxy.drop_connections()
            with pytest.raises(BackendUnavailable, match="while acquiring"):
                await call
            proxy.delay(0.0)
            # Granted but never answered: released in the background once Redis answers.
            await _until("the lock freed", lambda: admin.exists(key) == 0, 5)
            lease = _lease(await locker.try_acquire(name))  # a new connection
            assert await lease.release()
        finally:
            await locker.aclose()

    _run(main)


def test_a_frozen_server_times_a_started_call_out_and_drops_its_connection(
    redis_url: str, admin: Any, name: str, tcp_proxy: Any
) -> None:
    proxy: TcpProxy = tcp_proxy(redis_url)

    async def main() -> None:
        locker = await _warm(_timeout(proxy.url(redis_url), TIMEOUT), name)
        link = locker._link
        assert isinstance(link, AsyncLink)
        try:
            lease = _lease(await locker.try_acquire(f"{name}-held"))
            proxy.freeze()
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(BackendUnavailable, match=f"no answer within {TIMEOUT}s"):
                await locker.try_acquire(name)
            assert loop.time() - start < PROMPT
            assert link._socket.closed()  # what the late answer would say is nobody's
            proxy.freeze(False)  # the held request reaches the server: granted to nobody
            assert await lease.release()  # on a new connection
            key = lock_key(name, locker.prefix)
            await _until("the timed-out grant released", lambda: admin.exists(key) == 0, 5)
            assert await _lease(await locker.try_acquire(name)).release()
        finally:
            proxy.freeze(False)
            await locker.aclose()

    _run(main)


def test_a_replica_refusing_drops_the_connection(throwaway_redis: Any, name: str) -> None:
    # As redis-py's Sentinel connection does on READONLY: the next connect finds the
    # new primary (here: the same server, a primary again).
    async def main() -> None:
        admin = throwaway_redis.admin()
        locker = await _warm(_timeout(throwaway_redis.url, TIMEOUT), name)
        link = locker._link
        assert isinstance(link, AsyncLink)
        with socket.socket() as probe:  # a primary nobody serves: the server stays a replica
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            admin.replicaof("127.0.0.1", port)
            with pytest.raises(BackendUnavailable, match="read only replica"):
                await locker.try_acquire(name)
            assert link._socket.closed()
            admin.replicaof("no", "one")
            assert await _lease(await locker.try_acquire(name)).release()
        finally:
            admin.replicaof("no", "one")
            admin.close()
            await locker.aclose()

    _run(main)
