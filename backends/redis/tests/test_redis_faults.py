"""Faults on a private redis-server: down, frozen, restarted, connections killed.

Nothing here touches the shared server: each test gets its own ``redis-server``
on a free port (the ``throwaway_redis`` fixture), which it may stop, freeze or
restart, and kills afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import redis

import multilock
from multilock.errors import BackendUnavailable
from multilock.testing import apoll, poll
from multilock.testing._servers import checks
from multilock.testing._servers.redis import RedisServer
from multilock_redis import AsyncRedisLocker, RedisLease, RedisLocker, lock_key
from multilock_redis._async import _lua as async_lua
from multilock_redis._common import CHUNK
from multilock_redis._sync import _lua as sync_lua

pytestmark = pytest.mark.faults

TTL = 0.6
TIMEOUT = 0.5  # socket timeouts of the lockers under test: "never a hang" means this
PROMPT = TIMEOUT + 1.0  # what a failing call may take, with room for a loaded machine


def _url(server: Any, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"socket_timeout": TIMEOUT, **options}.items())
    return f"{server.url}?{query}"


def _held(lease: object) -> RedisLease:
    assert isinstance(lease, RedisLease), f"expected a lease, got {lease!r}"
    return lease


def _raises_promptly(call: Any) -> BackendUnavailable:
    return checks.raises_promptly(call, PROMPT)


def _recovers(locker: Any, name: str, timeout: float = 5.0) -> RedisLease:
    """Poll until ``locker`` can take ``name`` again; fail after ``timeout``."""
    return _held(poll("the locker recovering", lambda: locker.try_acquire(name), timeout, 0.05))


def test_server_down_raises_then_the_locker_recovers(throwaway_redis: Any) -> None:
    with multilock.connect(_url(throwaway_redis)) as locker:
        _held(locker.try_acquire("before")).release()
        throwaway_redis.stop()
        error = _raises_promptly(lambda: locker.try_acquire("while-down"))
        assert "while acquiring" in str(error)
        throwaway_redis.start()
        _recovers(locker, "after").release()


def test_server_down_raises_then_recovers_async(throwaway_redis: Any) -> None:
    async def main() -> None:
        async with multilock.connect_async(_url(throwaway_redis)) as locker:
            lease = await locker.try_acquire("before")
            assert lease is not None
            await lease.release()
            throwaway_redis.stop()
            start = time.monotonic()
            with pytest.raises(BackendUnavailable):
                await locker.try_acquire("while-down")
            assert time.monotonic() - start < PROMPT
            throwaway_redis.start()
            lease = await apoll(
                "the async locker recovering", lambda: locker.try_acquire("after"), 5, 0.05
            )
            await lease.release()

    asyncio.run(main())


def test_frozen_server_raises_instead_of_hanging(throwaway_redis: Any) -> None:
    with multilock.connect(_url(throwaway_redis)) as locker:
        _held(locker.try_acquire("warm-up")).release()
        throwaway_redis.freeze()
        try:
            _raises_promptly(lambda: locker.try_acquire("frozen"))
        finally:
            throwaway_redis.thaw()
        _recovers(locker, "thawed").release()


def test_frozen_server_raises_instead_of_hanging_async(throwaway_redis: Any) -> None:
    # The async link bounds each call itself (connect, handshake, send, reply):
    # both a connection in use and a first connection must give up in time.
    async def main() -> None:
        async with multilock.connect_async(_url(throwaway_redis)) as locker:
            lease = await locker.try_acquire("warm-up")
            assert lease is not None
            throwaway_redis.freeze()
            try:
                async with multilock.connect_async(_url(throwaway_redis)) as fresh:
                    for user in (locker, fresh):
                        start = time.monotonic()
                        with pytest.raises(BackendUnavailable, match="within"):
                            await user.try_acquire("frozen")
                        assert time.monotonic() - start < PROMPT
                    start = time.monotonic()
                    with pytest.raises(BackendUnavailable):
                        await lease.release()
                    assert time.monotonic() - start < PROMPT
            finally:
                throwaway_redis.thaw()
            thawed = await apoll(
                "the async locker recovering", lambda: locker.try_acquire("thawed"), 5, 0.05
            )
            assert await thawed.release()

    asyncio.run(main())


def test_lease_is_lost_by_its_expiry_when_redis_cannot_confirm_it(throwaway_redis: Any) -> None:
    with multilock.connect(_url(throwaway_redis, ttl=TTL)) as locker:
        start = time.monotonic()
        lease = _held(locker.try_acquire("unconfirmed"))
        throwaway_redis.freeze()  # renewals now time out: the lease cannot be confirmed
        try:
            assert lease.lost.wait(TTL * 3)
            lost_after = time.monotonic() - start
        finally:
            throwaway_redis.thaw()
        # Reported by its expiry, not later (the margin is the scheduler's, not ours).
        assert lost_after <= TTL + 0.25, f"lost fired {lost_after:.2f}s after a {TTL}s lease"
        assert "before its expiry" in (lease.lost.reason or "")
        # Never raises. It may free the key: a renewal sent before the freeze and run
        # on the thaw can have extended it -- lost means "not confirmed", not "gone".
        assert lease.release() in (True, False)
        with multilock.connect(throwaway_redis.url) as other:
            _recovers(other, "unconfirmed").release()


def test_releasing_a_lost_lease_while_redis_is_down_does_not_raise(
    throwaway_redis: Any,
) -> None:
    with multilock.connect(_url(throwaway_redis, ttl=TTL)) as locker:
        lease = _held(locker.try_acquire("down"))
        throwaway_redis.stop()
        assert lease.lost.wait(TTL * 3)
        assert lease.release() is False
        with pytest.raises(BackendUnavailable):
            locker.try_acquire("down")  # acquiring, unlike releasing a lost lease, reports it
        throwaway_redis.start()


def test_close_with_redis_down_warns_and_does_not_raise(
    throwaway_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    locker = multilock.connect(_url(throwaway_redis))
    lease = _held(locker.try_acquire("left-behind"))
    throwaway_redis.stop()
    locker.close()
    assert not lease.held
    assert any("stay until their ttl runs out" in r.getMessage() for r in caplog.records)


def test_restart_loses_the_leases_and_the_locker_recovers(throwaway_redis: Any) -> None:
    with multilock.connect(_url(throwaway_redis, ttl=TTL)) as locker:
        lease = _held(locker.try_acquire("restarted"))
        throwaway_redis.stop()
        throwaway_redis.start()  # no persistence: the key is gone with the old process
        assert lease.lost.wait(TTL * 3)
        fresh = _recovers(locker, "restarted")
        assert fresh.fencing_token == 1  # the counter went too: see docs on persistence
        fresh.release()


def test_client_kill_never_hangs_or_returns_none(throwaway_redis: Any) -> None:
    admin = throwaway_redis.admin()
    with multilock.connect(_url(throwaway_redis, ttl=TTL)) as locker:
        held = _held(locker.try_acquire("held"))
        for round_ in range(3):
            admin.client_kill_filter(_type="normal", skipme=True)
            try:
                lease = locker.try_acquire(f"after-kill-{round_}")
            except BackendUnavailable:
                lease = locker.try_acquire(f"after-kill-{round_}")  # the next call reconnects
            _held(lease).release()
        # Renewals ran through the kills on their own connection: one made since.
        assert held.expires_at is not None
        before = held.expires_at
        poll("a renewal after the kills", lambda: held.expires_at > before, TTL * 3)  # type: ignore[operator]
        assert held.held
        assert admin.get(held.key) == held.token.encode()
        assert held.release()
    admin.close()


def test_a_connection_closed_while_idle_is_replaced_without_an_error(
    throwaway_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_lua, "IDLE", 0.0)  # every call comes after an idle spell
    admin = throwaway_redis.admin()
    with multilock.connect(_url(throwaway_redis)) as locker:
        assert isinstance(locker, RedisLocker)
        _held(locker.try_acquire("before")).release()
        for round_ in range(3):
            # The server closes the socket before it answers the kill, and loopback
            # delivers that end before the answer: the locker's socket has it now.
            admin.client_kill_filter(_type="normal", skipme=True)
            _held(locker.try_acquire(f"after-kill-{round_}")).release()
    admin.close()


def test_a_connection_closed_while_idle_is_replaced_without_an_error_async(
    throwaway_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(async_lua, "IDLE", 0.0)

    async def main() -> None:
        admin = throwaway_redis.admin()
        async with multilock.connect_async(_url(throwaway_redis)) as locker:
            assert isinstance(locker, AsyncRedisLocker)
            assert isinstance(locker._link, async_lua.AsyncLink)
            socket = locker._link._socket
            warm_up = await locker.try_acquire("before")
            assert warm_up is not None
            assert await warm_up.release()
            for round_ in range(3):
                admin.client_kill_filter(_type="normal", skipme=True)
                # An idle loop would have read the end long ago; this one was blocked.
                await apoll("the end of the stream", lambda: _ended(socket), within=PROMPT)
                lease = await locker.try_acquire(f"after-kill-{round_}")
                assert lease is not None
                assert await lease.release()
        admin.close()

    asyncio.run(main())


async def _ended(socket: Any) -> bool:
    """Whether the socket has the end of the stream: readable, or redis-py's
    ``can_read()`` raising on it, which it does once it has seen the end (whether the
    probe looks before or after is a matter of timing; seen on CI)."""
    try:
        readable: bool = await socket.readable()
    except redis.ConnectionError:
        return True
    return readable


def test_noscript_after_script_flush_is_handled(throwaway_redis: Any) -> None:
    with multilock.connect(throwaway_redis.url) as locker:
        _held(locker.try_acquire("warm-up")).release()  # the scripts are cached now
        admin = throwaway_redis.admin()
        admin.script_flush()
        admin.close()
        lease = _held(locker.try_acquire("after-flush"))
        assert lease.release()


def test_noscript_in_a_pipelined_batch_is_handled(throwaway_redis: Any) -> None:
    names = [f"many-{i}" for i in range(2 * CHUNK + 1)]
    with multilock.connect(throwaway_redis.url) as locker:
        first = locker.try_acquire_many(names)  # the scripts are cached now
        assert all(lease is not None and lease.release() for lease in first.values())
        admin = throwaway_redis.admin()
        admin.script_flush()
        admin.close()
        leases = locker.try_acquire_many(names)
        assert list(leases) == names
        assert [_held(lease).fencing_token for lease in leases.values()] == [2] * len(names)


def test_wrong_password_is_unavailable_and_never_shown(
    secured_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = f"redis://:not-{secured_redis.password}@127.0.0.1:{secured_redis.port}/0"
    with multilock.connect(wrong) as locker:
        error = _raises_promptly(lambda: locker.try_acquire("x"))
        assert "not-" not in str(error)
        assert "not-" not in repr(locker)
    right = f"redis://:{secured_redis.password}@127.0.0.1:{secured_redis.port}/0?ttl={TTL}"
    with multilock.connect(right) as locker:
        lease = _held(locker.try_acquire("x"))
        assert secured_redis.password not in repr(locker)
        assert secured_redis.password not in repr(lease)
        secured_redis.freeze()  # renewal fails and logs: the log must not show it either
        try:
            assert lease.lost.wait(TTL * 3)
        finally:
            secured_redis.thaw()
        assert secured_redis.password not in (lease.lost.reason or "")
    assert caplog.records, "expected the renewal failure to be logged"
    assert all(secured_redis.password not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("scheme", ["unix", "redis+unix"])
def test_unix_socket(throwaway_redis: Any, scheme: str) -> None:
    with multilock.connect(f"{scheme}://{throwaway_redis.socket_path}?db=1") as locker:
        lease = _held(locker.try_acquire("over-a-socket"))
        assert locker.try_acquire("over-a-socket") is None
        admin = redis.Redis(unix_socket_path=str(throwaway_redis.socket_path), db=1)
        assert admin.get(lease.key) == lease.token.encode()
        admin.close()
        assert lease.release()


@pytest.mark.parametrize("many", [False, True], ids=["release", "release-many"])
def test_a_release_redis_did_not_hear_is_made_once_it_is_back(tmp_path: Path, many: bool) -> None:
    # A release that cannot reach Redis raises, and is tried again in the background:
    # the name is free as soon as Redis is back (with the lock still in its data),
    # not only when the key's ttl runs out. A scheduler's hold releases failing in a
    # failover would otherwise block their jobs for the lease's ttl.
    server = RedisServer(tmp_path, args=("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    try:
        url = _url(server, ttl="30s")
        with multilock.connect(url) as holder, multilock.connect(url) as other:
            assert isinstance(holder, RedisLocker)
            lease = _held(holder.try_acquire("kept"))
            server.stop()
            logged = "".join(path.read_text() for path in tmp_path.rglob("*.aof"))
            assert lease.key in logged  # the lock comes back with the server's data
            if many:
                with pytest.raises(BackendUnavailable):
                    holder.release_many([lease])  # the scheduler's release of many
            else:
                _raises_promptly(lease.release)
            server.start()
            taken = poll("another locker takes the name", lambda: other.try_acquire("kept"), 5.0)
            assert taken.fencing_token == 2
            taken.release()
    finally:
        server.remove()


def test_wait_replicas_without_a_replica_refuses_every_grant(throwaway_redis: Any) -> None:
    url = f"{throwaway_redis.url}?wait_replicas=1&wait_timeout=100ms"
    with multilock.connect(url) as locker:
        with pytest.raises(BackendUnavailable, match=r"only 0 of the 1 replica\(s\)"):
            locker.try_acquire("lonely")
        with throwaway_redis.admin() as admin:
            assert not admin.exists(lock_key("lonely"))  # undone
