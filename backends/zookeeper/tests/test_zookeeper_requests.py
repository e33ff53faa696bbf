"""A lock's requests go straight to kazoo's connection (``_requests``): what kazoo's
public ``create_async(makepath=True)`` and ``delete_async`` promised still holds, and
the callback an asyncio waiter sets runs once, even when it raises."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, ConnectionClosedError, NodeExistsError
from kazoo.security import OPEN_ACL_UNSAFE

import multilock
from multilock.testing import poll
from multilock_zookeeper._requests import EphemeralCreate, VersionedDelete

BOUND = 10.0


def test_the_first_lock_makes_the_root_and_a_deleted_root_is_made_again(
    make_url: Callable[..., str], kazoo_client: Callable[..., KazooClient], chroot: str
) -> None:
    admin = kazoo_client()
    assert admin.exists(chroot) is None
    with multilock.connect(make_url()) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        assert admin.exists(str(lease.key)) is not None
        assert lease.release() is True
        admin.delete(chroot)  # an operator tidies up between two runs
        again = locker.try_acquire("job")
        assert again is not None
        assert admin.exists(str(again.key)) is not None
        assert locker.try_acquire("job") is None


def test_async_the_first_lock_makes_the_root_and_a_deleted_root_is_made_again(
    make_url: Callable[..., str], kazoo_client: Callable[..., KazooClient], chroot: str
) -> None:
    admin = kazoo_client()

    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            warm = await locker.try_acquire("warm-up")  # connected: the hot path from here
            assert warm is not None
            assert await warm.release() is True
            admin.delete(chroot)
            lease = await locker.try_acquire("job")
            assert lease is not None
            assert admin.exists(str(lease.key)) is not None
            assert await locker.try_acquire("job") is None
            assert await lease.release() is True
            assert admin.exists(str(lease.key)) is None

    asyncio.run(main())


def test_a_create_answers_as_kazoos_and_a_delete_checks_the_version(
    kazoo_client: Callable[..., KazooClient], chroot: str
) -> None:
    client = kazoo_client()
    path = f"{chroot}/a/b"  # two parents missing
    create = EphemeralCreate(client, path, b"holder", OPEN_ACL_UNSAFE)
    assert create.wait(BOUND)
    created, stat = create.get_nowait()
    assert created == path
    assert stat.ephemeralOwner == client.client_id[0]
    assert client.get(path)[0] == b"holder"
    again = EphemeralCreate(client, path, b"", OPEN_ACL_UNSAFE)
    assert again.wait(BOUND)
    with pytest.raises(NodeExistsError):
        again.get_nowait()
    stale = VersionedDelete(client, path, stat.version + 1)
    assert stale.wait(BOUND)
    with pytest.raises(BadVersionError):
        stale.get_nowait()
    delete = VersionedDelete(client, path, stat.version)
    assert delete.wait(BOUND)
    assert delete.get_nowait() is True
    assert client.exists(path) is None


def test_the_callback_runs_once_where_the_answer_lands_and_may_raise(
    kazoo_client: Callable[..., KazooClient], chroot: str
) -> None:
    client = kazoo_client()
    client.ensure_path(chroot)
    calls: list[str] = []

    def failing() -> None:
        calls.append(threading.current_thread().name)
        raise RuntimeError("a waiter's bug")

    create = EphemeralCreate(client, f"{chroot}/job", b"", OPEN_ACL_UNSAFE)
    create.when_ready(failing)
    poll("the callback", lambda: calls, BOUND)
    assert calls[0] != threading.current_thread().name
    # Set on a ready result, it runs at once, here.
    create.when_ready(lambda: calls.append("at once"))
    assert calls[1:] == ["at once"]
    assert client.get(f"{chroot}/job") is not None  # the connection survived the raise


def test_a_request_on_a_closed_client_is_ready_with_the_error_at_once(
    kazoo_client: Callable[..., KazooClient], chroot: str
) -> None:
    client = kazoo_client()
    client.stop()
    create = EphemeralCreate(client, f"{chroot}/job", b"", OPEN_ACL_UNSAFE)
    assert create.ready()
    with pytest.raises(ConnectionClosedError):
        create.get_nowait()
