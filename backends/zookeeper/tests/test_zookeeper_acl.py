"""Digest auth: our lock nodes cannot be deleted, nor the lock taken, by clients without
our credentials (ZooKeeper checks DELETE and CREATE on the parent: the chroot's ACL)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, ConfigurationError
from multilock_zookeeper._config import Config


def test_others_cannot_delete_our_node_or_take_the_lock(
    make_url: Callable[..., str], admin: KazooClient, chroot: str
) -> None:
    with multilock.connect(make_url("app:s3cret")) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        with pytest.raises(NoAuthError):
            admin.delete(str(lease.key))
        with pytest.raises(NoAuthError):
            admin.create(f"{chroot}/other", ephemeral=True)
        assert admin.get_children(chroot) == ["job"]  # reading is allowed
        # The same credentials elsewhere are the same application: they see it held.
        with multilock.connect(make_url(username="app", password="s3cret")) as peer:
            assert peer.try_acquire("job") is None
            other = peer.try_acquire("other")
            assert other is not None
            other.release()
        assert lease.release() is True


def test_wrong_credentials_are_refused_without_touching_the_locks(
    make_url: Callable[..., str], admin: KazooClient, chroot: str
) -> None:
    with multilock.connect(make_url("app:s3cret")) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        with multilock.connect(make_url("app:wrong")) as intruder:
            with pytest.raises(ConfigurationError, match="lets others") as raised:
                intruder.try_acquire("job")
            assert "wrong" not in str(raised.value)
            assert "s3cret" not in str(raised.value)
        assert admin.exists(str(lease.key)) is not None


def test_an_open_chroot_is_not_trusted_with_auth_until_its_acl_is_fixed(
    make_url: Callable[..., str], admin: KazooClient, chroot: str
) -> None:
    admin.ensure_path(chroot)  # world may create and delete children here
    with multilock.connect(make_url("app:s3cret")) as locker:
        with pytest.raises(ConfigurationError, match="world:anyone"):
            locker.try_acquire("job")
        # Fixed by an administrator: the same locker works, without a reconnect.
        admin.set_acls(chroot, Config.from_url(LockURL.parse(make_url("app:s3cret"))).acl)
        assert locker.try_acquire("job") is not None
    with multilock.connect(make_url()) as open_locker:  # without auth, an open chroot is fine
        admin.delete(chroot)
        assert open_locker.try_acquire("job") is not None


def test_a_user_without_rights_gets_backend_unavailable_not_none(
    make_url: Callable[..., str], admin: KazooClient, chroot: str
) -> None:
    with multilock.connect(make_url("owner:pw")) as owner:
        assert owner.try_acquire("first") is not None  # makes the chroot, ours only
        with (
            multilock.connect(make_url()) as anonymous,
            pytest.raises(BackendUnavailable, match="not authorized"),
        ):
            anonymous.try_acquire("job")


def test_the_password_stays_out_of_kazoo_debug_logs(
    make_url: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(1)  # kazoo logs the Auth packet it sends at DEBUG
    with multilock.connect(make_url("app:s3cret")) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        lease.release()
    assert "Auth(" in caplog.text  # the packet was logged...
    assert "s3cret" not in caplog.text  # ...without the password
