"""nats:// URLs: servers, bucket, prefix, options and credentials, checked before connecting."""

from __future__ import annotations

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, InvalidOption, InvalidURL
from multilock_nats import escape, unescape
from multilock_nats._config import NatsConfig

SECRET = "s3cret-t0ken"


def config(url: str) -> NatsConfig:
    return NatsConfig.from_url(LockURL.parse(url))


def test_servers_bucket_and_defaults() -> None:
    parsed = config("nats://n1:4222,n2,[::1]:4223/locks?ttl=10s")
    assert parsed.servers == ("nats://n1:4222", "nats://n2:4222", "nats://[::1]:4223")
    assert (parsed.bucket, parsed.stream, parsed.subjects) == ("locks", "KV_locks", "$KV.locks.")
    assert (parsed.ttl, parsed.bucket_ttl, parsed.prefix) == (10.0, 10.0, "")
    assert config("nats://n1").bucket == "multilock"
    assert config("nats://n1/b?bucket_ttl=1m").bucket_ttl == 60.0


@pytest.mark.parametrize(
    ("url", "error", "message"),
    [
        ("nats://n1/bad.bucket", InvalidURL, "letters, digits"),
        ("nats://n1/b?prefix=.x", InvalidOption, "KV key fragment"),
        ("nats://n1/b?prefix=a%20b", InvalidOption, "KV key fragment"),
        ("nats://n1/b?bucket_ttl=500ms", InvalidOption, "at least 1s"),
        ("nats://n1/b?ttl=1ms", InvalidOption, "at least 0.1s"),
        ("nats://n1/b?tll=1s", InvalidOption, "did you mean 'ttl'"),
        ("nats://n1/b?cacert=/tmp/ca.crt", InvalidOption, "needs tls=true"),
    ],
)
def test_bad_input_is_one_clear_line(url: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as raised:
        config(url)
    assert "\n" not in str(raised.value)


def test_credentials() -> None:
    assert (config("nats://u:p@n1/b").user, config("nats://u:p@n1/b").password) == ("u", "p")
    token = config(f"nats://:{SECRET}@n1/b")
    assert (token.user, token.token) == (None, SECRET)
    assert SECRET not in repr(token)


def test_a_bare_word_before_the_host_is_refused_without_showing_it() -> None:
    with pytest.raises(InvalidURL) as raised:
        config(f"nats://{SECRET}@n1/b")
    assert SECRET not in str(raised.value)
    assert "nats://:TOKEN@host" in str(raised.value)


def test_a_token_is_never_shown() -> None:
    url = f"nats://:{SECRET}@127.0.0.1:1/b?connect_timeout=0.5"
    locker = multilock.connect(url)
    try:
        assert SECRET not in repr(locker)
        with pytest.raises(BackendUnavailable) as raised:
            locker.try_acquire("x")
        assert SECRET not in str(raised.value)
    finally:
        locker.close()


@pytest.mark.parametrize(
    "name", ["", "a", "a.b", "a=b", "..", "/", "замок", "nul\x00", "line\nbreak", "k" * 300]
)
def test_keys_are_valid_and_reversible(name: str) -> None:
    key = escape(name)
    assert key
    assert not key.startswith(".")
    assert not key.endswith(".")
    assert all(char.isascii() and (char.isalnum() or char in "-/_=") for char in key)
    assert unescape(key) == name


def test_names_that_cannot_be_keys_of_this_backend() -> None:
    assert unescape("a=2") is None
    assert unescape("a.b") is None
    assert unescape("=ZZ") is None
