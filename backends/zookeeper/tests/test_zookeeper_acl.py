"""Digest auth: our lock nodes cannot be deleted, read, nor the lock taken, by clients
without our credentials (ZooKeeper checks DELETE and CREATE on the parent: the chroot's
ACL; READ on the node itself)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, ConfigurationError
from multilock_zookeeper._config import Config


@pytest.fixture
def other_identity(kazoo_client: Callable[..., KazooClient]) -> KazooClient:
    """A kazoo client authenticated as another digest user than the tests' lockers."""
    return kazoo_client(auth_data=[("digest", "other:pw")])


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
        # The same credentials elsewhere are the same application: they see it held.
        with multilock.connect(make_url(username="app", password="s3cret")) as peer:
            assert peer.try_acquire("job") is None
            other = peer.try_acquire("other")
            assert other is not None
            other.release()
        assert lease.release() is True


def test_lock_nodes_are_readable_only_by_the_identity_that_created_them(
    make_url: Callable[..., str],
    admin: KazooClient,
    other_identity: KazooClient,
    chroot: str,
    zookeeper_url: str,
) -> None:
    with multilock.connect(make_url("app:s3cret")) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        node = str(lease.key)
        acls, _ = locker._session.client.get_acls(node)  # type: ignore[attr-defined]
        assert [(acl.id.scheme, acl.id.id.split(":")[0], acl.perms) for acl in acls] == [
            ("digest", "app", 31)
        ]
        # Neither anonymous clients nor another identity read the holder record (host,
        # pid, token) or list the locks.
        for stranger in (admin, other_identity):
            with pytest.raises(NoAuthError):
                stranger.get(node)
            with pytest.raises(NoAuthError):
                stranger.get_children(chroot)
            with pytest.raises(NoAuthError):
                stranger.delete(node)
        # Another identity through multilock is refused too, with one clear line.
        with (
            multilock.connect(make_url("other:pw")) as other,
            pytest.raises(ConfigurationError, match="belongs to another identity"),
        ):
            other.locks()  # type: ignore[attr-defined]
        # The same identity elsewhere reads them.
        with multilock.connect(make_url("app:s3cret")) as peer:
            (info,) = peer.locks()  # type: ignore[attr-defined]
            assert info.name == "job"
            assert info.details["token"] == lease.token
        # Listing a parent that holds such a private node shows it, without its holder.
        with multilock.connect(zookeeper_url) as lister:
            parent, _, child = chroot.rpartition("/")
            assert parent == LockURL.parse(zookeeper_url).path
            hidden = [i for i in lister.locks() if i.name == child]  # type: ignore[attr-defined]
            assert [(i.key, i.holder, i.details) for i in hidden] == [
                (chroot, None, {"readable": False})
            ]
        assert lease.release() is True


def test_wrong_credentials_are_refused_without_touching_the_locks(
    make_url: Callable[..., str], admin: KazooClient, chroot: str
) -> None:
    with multilock.connect(make_url("app:s3cret")) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        with multilock.connect(make_url("app:Wr0ngPw")) as intruder:
            with pytest.raises(ConfigurationError, match="a wrong password") as raised:
                intruder.try_acquire("job")
            assert "Wr0ngPw" not in str(raised.value)
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
