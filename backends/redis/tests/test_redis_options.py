"""URLs and options: what reaches redis-py, what is refused, and no password anywhere."""

from __future__ import annotations

from typing import Any

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import ConfigurationError, InvalidOption, InvalidURL
from multilock_redis._config import async_client, parse_config, sync_client


def _kwargs(url: str) -> dict[str, object]:
    client = sync_client(parse_config(LockURL.parse(url)))
    try:
        pool = client.connection_pool
        return {**pool.connection_kwargs, "connection_class": pool.connection_class}
    finally:
        client.close()


def test_defaults() -> None:
    config = parse_config(LockURL.parse("redis://localhost"))
    assert (config.ttl, config.prefix) == (30.0, "multilock:")
    assert (config.socket_timeout, config.connect_timeout) == (5.0, 5.0)


def test_our_options_are_not_handed_to_redis_py() -> None:
    kwargs = _kwargs("redis://h:6380/3?ttl=5s&prefix=app:&socket_timeout=250ms&connect_timeout=2")
    assert kwargs["host"] == "h"
    assert kwargs["port"] == 6380
    assert kwargs["db"] == 3
    assert kwargs["socket_timeout"] == 0.25
    assert kwargs["socket_connect_timeout"] == 0.25  # never longer than the socket timeout
    assert "ttl" not in kwargs
    assert "prefix" not in kwargs


def test_tls_options_pass_through() -> None:
    kwargs = _kwargs("rediss://h/0?ssl_cert_reqs=none&ssl_ca_certs=/ca.pem")
    assert kwargs["ssl_cert_reqs"] == "none"
    assert kwargs["ssl_ca_certs"] == "/ca.pem"
    assert kwargs["ssl_check_hostname"] is False  # nothing verified: no name to check
    assert "SSL" in kwargs["connection_class"].__name__  # type: ignore[attr-defined]


def test_tls_verifies_the_certificate_and_the_host_name_whatever_redis_py_defaults() -> None:
    # Given explicitly to every redis-py client: before redis-py 6.0 rediss:// did not
    # check the host name by default.
    config = parse_config(LockURL.parse("rediss://h/0?ssl_ca_certs=/ca.pem"))
    assert config.tls == {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    for client in (sync_client(config), async_client(config)):
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("required", True)
    assert parse_config(LockURL.parse("redis://h/0")).tls == {}
    opted_out = parse_config(LockURL.parse("rediss://h/0?ssl_check_hostname=no"))
    assert opted_out.tls == {"ssl_cert_reqs": "required", "ssl_check_hostname": False}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://h/0?ssl_ca_certs=/ca.pem", "'ssl_ca_certs' .* needs a rediss:// URL"),
        ("unix:///run/redis.sock?ssl_cert_reqs=required", "needs a rediss:// URL"),
        ("rediss://h/0?ssl_cert_reqs=none&ssl_check_hostname=true", "ssl_check_hostname=true"),
        ("rediss://h/0?ssl_cert_reqs=sometimes", "expected one of none, optional, required"),
        ("rediss://h/0?ssl_check_hostname=maybe", "expected true or false"),
    ],
)
def test_bad_tls_options_are_named(url: str, says: str) -> None:
    with pytest.raises(InvalidOption, match=says):
        parse_config(LockURL.parse(url))


@pytest.mark.parametrize("scheme", ["unix", "redis+unix"])
def test_unix_socket_urls(scheme: str) -> None:
    kwargs = _kwargs(f"{scheme}:///run/redis/redis.sock?db=2")
    assert kwargs["path"] == "/run/redis/redis.sock"
    assert kwargs["db"] == 2


@pytest.mark.parametrize(
    ("url", "error", "says"),
    [
        ("redis://h/0?bogus=1", InvalidOption, "unknown option 'bogus'"),
        ("redis://h/0?ttl=soon", InvalidOption, "'ttl'"),
        ("redis://h/0?ttl=1ms", InvalidOption, "at least"),
        ("redis://h/0?prefix=a{b", InvalidOption, "hash tag"),
        ("redis://h/notadb", InvalidURL, "invalid Redis URL"),
        ("redis://h/0?db=x", InvalidURL, "invalid Redis URL"),
    ],
)
def test_bad_input_is_named(url: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        multilock.connect(url)


def test_too_short_ttl_at_acquire_is_refused() -> None:
    with (
        multilock.connect("redis://127.0.0.1:1/0") as locker,
        pytest.raises(ConfigurationError, match="too short"),
    ):
        locker.try_acquire("x", ttl=0.001)


def test_password_is_masked_in_repr_and_errors() -> None:
    with multilock.connect("redis://user:s3cret@127.0.0.1:1/0") as locker:
        assert "s3cret" not in repr(locker)
        assert "s3cret" not in locker.url
    with pytest.raises(InvalidOption) as info:
        multilock.connect("redis://user:s3cret@h/0?bogus=1")
    assert "s3cret" not in str(info.value)
    assert "s3cret" not in repr(parse_config(LockURL.parse("redis://:s3cret@h/0")))


def test_cluster_url_names_its_nodes() -> None:
    config = parse_config(LockURL.parse("redis+cluster://:pw@h1:7000,h2,[::1]:7002/?ttl=5s"))
    assert config.topology == "cluster"
    assert config.nodes == (("h1", 7000), ("h2", 6379), ("::1", 7002))
    assert config.ttl == 5.0
    assert "pw" not in repr(config)


def test_sentinel_url_names_the_sentinels_the_primary_and_the_db() -> None:
    config = parse_config(LockURL.parse("redis+sentinel://s1,s2:26380/mymaster/3"))
    assert (config.topology, config.service) == ("sentinel", "mymaster")
    assert config.nodes == (("s1", 26379), ("s2", 26380))
    pool: Any = sync_client(config).connection_pool
    assert (pool.service_name, pool.connection_kwargs["db"]) == ("mymaster", 3)
    assert parse_config(LockURL.parse("redis+sentinel://s1/app?db=2")).client_url.endswith("/2")


def test_sentinels_get_their_own_credentials_and_every_timeout() -> None:
    url = "redis+sentinel://app:pw@s1/mymaster?sentinel_password=spw&socket_timeout=2s"
    config = parse_config(LockURL.parse(url))
    for client in (sync_client(config), async_client(config)):
        pool: Any = client.connection_pool
        assert pool.connection_kwargs["password"] == "pw"  # the primary's
        sentinel_kwargs = pool.sentinel_manager.sentinel_kwargs
        assert sentinel_kwargs["password"] == "spw"
        assert (sentinel_kwargs["socket_timeout"], pool.connection_kwargs["socket_timeout"]) == (
            2.0,
            2.0,
        )
    assert "spw" not in repr(config)
    with pytest.raises(InvalidOption) as info:
        multilock.connect(f"{url}&bogus=1")
    assert "spw" not in str(info.value)
    assert "pw@" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "error", "says"),
    [
        ("redis+cluster://h/1", InvalidURL, "only db 0"),
        ("redis+cluster://h/?db=2", InvalidURL, "only db 0"),
        ("redis+cluster://h/x", InvalidURL, "the path is the db number"),
        ("redis+cluster:///", InvalidURL, "names no host"),
        ("redis+sentinel://s1", InvalidURL, "the name Sentinel knows the primary by"),
        ("redis+sentinel://s1/mymaster/x", InvalidURL, "/mymaster/0"),
        ("redis+sentinel://s1/mymaster/1?db=2", InvalidOption, "db twice"),
        ("redis://h/0?sentinel_password=x", InvalidOption, "needs a redis\\+sentinel:// URL"),
        ("redis+cluster://h/?sentinel_username=x", InvalidOption, "redis\\+sentinel://"),
        ("redis://h/0?wait_replicas=-1", InvalidOption, "'wait_replicas'"),
        ("redis://h/0?wait_replicas=101", InvalidOption, "at most 100"),
        ("redis://h/0?wait_timeout=0", InvalidOption, "'wait_timeout' .* must be positive"),
    ],
)
def test_bad_topology_input_is_named(url: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        multilock.connect(url)
