"""The session drives ``lost``: expiry always, a dropped connection by policy; then reconnect.

A real server throughout. Expiry is the real thing (a second client attaches to
the holder's session and closes it, kazoo's own test pattern); a dropped
connection is the holder's own TCP socket shut down under kazoo's feet.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

import multilock
from multilock.backend import LockURL
from multilock.errors import InvalidLockName, LockLost, NotOwner
from multilock.testing import poll as _poll
from multilock.testing._servers.process import free_port
from multilock_zookeeper import backend

BOUND = 10.0  # seconds any of these transitions may take before the test fails


def poll(what: str, probe: Callable[[], Any], within: float = BOUND) -> Any:
    """Poll ``probe`` with this module's bound (see multilock.testing.poll)."""
    return _poll(what, probe, within, not_yet=())


def drop_connection(locker: Any) -> None:
    """Cut the locker's TCP connection (the session lives on at the server) and wait
    until kazoo has noticed and reconnected."""
    client = locker._session.client
    states: list[str] = []
    client.add_listener(states.append)
    client._connection._socket.shutdown(socket.SHUT_RDWR)
    poll("suspended, then reconnected", lambda: states[-2:] == ["SUSPENDED", "CONNECTED"])
    client.remove_listener(states.append)


def test_expired_session_fires_lost_frees_the_node_and_reconnects(
    make_url: Callable[..., str], admin: KazooClient
) -> None:
    url = make_url(session_timeout="2s", suspended="keep")
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        reasons: list[str] = []
        lease.lost.add_callback(reasons.append)
        old_session = locker.session_id  # type: ignore[attr-defined]
        backend.conformance.break_lease(LockURL.parse(url), locker, lease)
        assert lease.lost.wait(BOUND), "lost did not fire after the session expired"
        assert "expired" in reasons[0]
        assert admin.exists(str(lease.key)) is None
        # Transparent reconnect: a new session, and the lock can be taken again.
        again = poll("re-acquiring after expiry", lambda: locker.try_acquire("job"))
        assert locker.session_id != old_session  # type: ignore[attr-defined]
        assert again.fencing_token > lease.fencing_token
        assert lease.release() is False  # the stale lease never frees the new holder
        assert admin.exists(str(again.key)) is not None


def test_async_expired_session_fires_lost(make_url: Callable[..., str], admin: KazooClient) -> None:
    url = make_url(session_timeout="2s", suspended="keep")

    async def main() -> None:
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire("job")
            assert lease is not None
            await asyncio.to_thread(
                backend.conformance.break_lease, LockURL.parse(url), locker, lease
            )
            reason = await asyncio.wait_for(lease.lost, BOUND)
            assert "expired" in reason
            assert admin.exists(str(lease.key)) is None
            again = await asyncio.wait_for(locker.try_acquire("job"), BOUND)
            assert again is not None

    asyncio.run(main())


def test_suspended_connection_fires_lost_and_the_node_is_cleaned_up(
    make_url: Callable[..., str], admin: KazooClient
) -> None:
    with multilock.connect(make_url()) as locker, multilock.connect(make_url()) as other:
        lease = locker.try_acquire("job")
        assert lease is not None
        session = locker.session_id  # type: ignore[attr-defined]
        drop_connection(locker)
        assert lease.lost.wait(BOUND), "lost did not fire on SUSPENDED (suspended=lost)"
        assert "suspended" in str(lease.lost.reason)
        # Same session after the reconnect, yet the node we gave up is deleted.
        poll("the given-up node deleted", lambda: admin.exists(str(lease.key)) is None)
        assert locker.session_id == session  # type: ignore[attr-defined]
        taken = poll("another locker taking the lock", lambda: other.try_acquire("job"))
        assert lease.release() is False
        assert admin.exists(str(taken.key)) is not None  # the stale release deleted nothing


def test_suspended_keep_policy_keeps_the_lease_across_a_reconnect(
    make_url: Callable[..., str], admin: KazooClient
) -> None:
    with multilock.connect(make_url(suspended="keep")) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        czxid = admin.exists(str(lease.key)).czxid
        drop_connection(locker)
        assert not lease.lost.is_set()
        lease.extend()  # confirms the node is still ours
        assert admin.exists(str(lease.key)).czxid == czxid
        assert lease.release() is True
        assert admin.exists(str(lease.key)) is None


def test_extend_notices_a_deleted_or_replaced_node(
    make_url: Callable[..., str], admin: KazooClient
) -> None:
    with multilock.connect(make_url()) as locker:
        gone = locker.try_acquire("gone")
        replaced = locker.try_acquire("replaced")
        assert gone is not None
        assert replaced is not None
        admin.delete(str(gone.key))
        with pytest.raises(LockLost, match="deleted"):
            gone.extend()
        assert gone.lost.is_set()
        admin.delete(str(replaced.key))
        admin.create(str(replaced.key), b"someone else", ephemeral=True)
        with pytest.raises(NotOwner):
            replaced.extend()
        assert replaced.release() is False
        assert admin.get(str(replaced.key))[0] == b"someone else"


def test_close_releases_every_lease_at_once(
    make_url: Callable[..., str], admin: KazooClient, chroot: str
) -> None:
    locker = multilock.connect(make_url())
    leases = locker.try_acquire_many([f"job-{i}" for i in range(5)])
    assert all(lease is not None for lease in leases.values())
    assert len(admin.get_children(chroot)) == 5
    locker.close()
    assert admin.get_children(chroot) == []
    assert not any(lease.held for lease in leases.values() if lease is not None)


def test_node_records_its_holder_and_locks_lists_it(
    make_url: Callable[..., str], admin: KazooClient
) -> None:
    with multilock.connect(make_url()) as locker:
        lease = locker.try_acquire("a job/with spaces")
        assert lease is not None
        assert str(lease.key).endswith("/a%20job%2Fwith%20spaces")
        data, stat = admin.get(str(lease.key))
        assert stat.ephemeralOwner == locker.session_id  # type: ignore[attr-defined]
        assert lease.fencing_token == stat.czxid
        assert lease.token in data.decode()
        (info,) = locker.locks()  # type: ignore[attr-defined]
        assert info.name == "a job/with spaces"
        assert info.details["token"] == lease.token
        assert info.details["fencing_token"] == lease.fencing_token


def test_a_dead_host_in_the_ensemble_list_is_skipped(chroot: str, zookeeper_url: str) -> None:
    live = LockURL.parse(zookeeper_url)
    dead = free_port()  # a loopback port nobody listens on
    url = f"zookeeper://127.0.0.1:{dead},{live.host}:{live.port or 2181}{chroot}"
    with multilock.connect(url) as locker:
        lease = poll("acquiring through the live host", lambda: locker.try_acquire("job"))
        assert lease.release() is True


def test_async_calls_start_no_thread(
    make_url: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[threading.Thread] = []
    original = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread)
        original(thread)

    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            assert await locker.try_acquire("warm-up") is not None  # kazoo's own threads
            monkeypatch.setattr(threading.Thread, "start", counting_start)
            leases = await asyncio.gather(*(locker.try_acquire(f"job-{i}") for i in range(50)))
            many = await locker.try_acquire_many([f"batch-{i}" for i in range(50)])
            for lease in [*leases, *many.values()]:
                assert lease is not None
                await lease.release()
            monkeypatch.undo()

    asyncio.run(main())
    assert started == [], f"async calls started threads: {started}"


def test_names_up_to_the_limit_work_and_longer_ones_are_refused_before_sending(
    make_url: Callable[..., str],
) -> None:
    with multilock.connect(make_url()) as locker:
        states: list[str] = []
        locker._session.client.add_listener(states.append)  # type: ignore[attr-defined]
        longest = "é" * (16 * 1024)  # 32 KiB of UTF-8, 96 KiB escaped
        lease = locker.try_acquire(longest)
        assert lease is not None
        assert lease.release() is True
        with pytest.raises(InvalidLockName, match="at most 32768 UTF-8 bytes"):
            locker.try_acquire(longest + "x")
        assert "SUSPENDED" not in states  # the connection never dropped
