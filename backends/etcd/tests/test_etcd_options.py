"""etcd:// URLs: members, prefix, options and credentials, checked before any connection."""

from __future__ import annotations

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import InvalidOption, InvalidURL
from multilock_etcd._config import DEFAULT_PREFIX, EtcdConfig

SECRET = "s3cret-pa55"


def config(url: str) -> EtcdConfig:
    return EtcdConfig.from_url(LockURL.parse(url))


def test_members_prefix_and_defaults() -> None:
    parsed = config("etcd://h1:2379,h2,[::1]:2381/app/locks")
    assert parsed.endpoints == (("h1", 2379), ("h2", 2379), ("::1", 2381))
    assert parsed.prefix == b"app/locks/"
    assert (parsed.ttl, parsed.timeout) == (30.0, 5.0)
    assert config("etcd://h1").prefix == DEFAULT_PREFIX.encode()
    assert config("etcd:///").endpoints == (("127.0.0.1", 2379),)


def test_unknown_option_names_the_closest() -> None:
    with pytest.raises(InvalidOption, match="did you mean 'ttl'"):
        config("etcd://h1/x?tll=5s")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("ttl=10ms", "at least 0.1s"),
        ("timeout=0", "must be positive"),
        ("cacert=/tmp/ca.crt", "needs tls=true"),
        ("tls=true&cert=/tmp/c.crt", "go together"),
        ("tls=true&cacert=/nonexistent/ca.crt", "cannot use the TLS files"),
    ],
)
def test_bad_options_are_refused_with_one_clear_line(query: str, message: str) -> None:
    with pytest.raises(InvalidOption, match=message) as raised:
        config(f"etcd://h1/x?{query}")
    assert "\n" not in str(raised.value)


def test_a_user_needs_a_password() -> None:
    with pytest.raises(InvalidURL, match="user name and a password"):
        config("etcd://root@h1/x")


def test_the_password_is_never_shown() -> None:
    url = f"etcd://root:{SECRET}@127.0.0.1:1/x"
    parsed = config(url)
    assert SECRET not in repr(parsed)
    locker = multilock.connect(url)
    try:
        assert SECRET not in repr(locker)
        assert SECRET not in locker.url
        with pytest.raises(multilock.errors.BackendUnavailable) as raised:
            locker.try_acquire("x")
        assert SECRET not in str(raised.value)
    finally:
        locker.close()
