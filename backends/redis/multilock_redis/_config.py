"""A lock URL turned into redis-py clients: options checked, retries off, timeouts on,
TLS verified (certificate and host name) unless the URL turns it off."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.retry
from redis.backoff import NoBackoff

from multilock.backend import LockURL, OptionParser, as_bool, as_duration, as_str
from multilock.errors import InvalidOption, InvalidURL

__all__ = [
    "AsyncClient",
    "RedisConfig",
    "SyncClient",
    "async_client",
    "parse_config",
    "sync_client",
]

AsyncClient = redis.asyncio.Redis
"""The asyncio client type (``SyncClient`` in the generated sync code)."""
SyncClient = redis.Redis
"""The sync client type."""

# TLS files handed to redis-py untouched (rediss:// only).
_TLS_FILES = frozenset(
    {"ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password"}
)
_CERT_REQS = ("none", "optional", "required")


def _as_cert_reqs(value: object) -> str:
    text = as_str(value).strip().lower()
    if text not in _CERT_REQS:
        raise InvalidOption(f"expected one of {', '.join(_CERT_REQS)}, got {value!r}")
    return text


# Handed to redis-py untouched, which converts and checks them (db, pool...).
_PASSTHROUGH = _TLS_FILES | frozenset(
    {
        "db",
        "password",
        "client_name",
        "health_check_interval",
        "max_connections",
        "socket_keepalive",
        "protocol",
    }
)
_OPTIONS = OptionParser(
    {
        "ttl": as_duration,
        "prefix": as_str,
        "socket_timeout": as_duration,
        "connect_timeout": as_duration,
        # Ours, not redis-py's: their defaults changed across redis-py versions
        # (before 6.0, rediss:// did not check the host name), so they are always given.
        "ssl_cert_reqs": _as_cert_reqs,
        "ssl_check_hostname": as_bool,
    },
    {"ttl": 30.0, "prefix": "multilock:", "socket_timeout": 5.0, "connect_timeout": 5.0},
    passthrough=_PASSTHROUGH,
)
_SCHEMES = {"redis": "redis", "rediss": "rediss", "unix": "unix", "redis+unix": "unix"}
MIN_TTL = 0.01
"""Shorter leases could not be renewed (every ttl/3) over a network; refused."""


@dataclass(frozen=True)
class RedisConfig:
    """What a locker needs from its URL."""

    url: LockURL
    client_url: str
    """The URL for redis-py: our options removed, scheme normalized. Holds the password."""
    ttl: float
    prefix: str
    socket_timeout: float
    connect_timeout: float
    tls: dict[str, Any] = field(default_factory=dict)
    """redis-py's TLS verification arguments (rediss:// only)."""

    def __repr__(self) -> str:
        return f"RedisConfig({self.url.masked!r})"


def parse_config(url: LockURL) -> RedisConfig:
    """Check ``url``'s options and build the redis-py URL; errors name the problem."""
    values, passthrough = _OPTIONS.parse(url)
    prefix = values["prefix"]
    if "{" in prefix or "}" in prefix:
        raise InvalidOption(
            f"option 'prefix' of {url.masked!r} may not contain '{{' or '}}':"
            " the lock name is the Redis Cluster hash tag"
        )
    if values["ttl"] < MIN_TTL:
        raise InvalidOption(f"option 'ttl' of {url.masked!r} must be at least {MIN_TTL}s")
    scheme = _SCHEMES.get(url.scheme)
    if scheme is None:
        raise InvalidURL(f"{url.masked!r} is not a redis://, rediss:// or unix:// URL")
    if scheme != "unix" and url.path.strip("/") and not url.path.strip("/").isdigit():
        raise InvalidURL(f"invalid Redis URL {url.masked!r}: the path is the db number, like /0")
    tls = _tls(url, scheme, values, passthrough)
    # Rebuilt from the parsed URL: redis-py's own parser would cut a password at an
    # unencoded '#', '?' or '/', and then show the rest of it in its errors.
    auth = ""
    if url.username is not None or url.password is not None:
        auth = quote(url.username or "", safe="")
        if url.password is not None:
            auth += ":" + quote(url.password, safe="")
        auth += "@"
    client_url = f"{scheme}://{auth}{url.address}"
    if passthrough:
        client_url += "?" + urlencode(passthrough)
    config = RedisConfig(
        url,
        client_url,
        values["ttl"],
        prefix,
        values["socket_timeout"],
        values["connect_timeout"],
        tls,
    )
    sync_client(config).close()  # let redis-py reject a bad db, port or TLS option now
    return config


def _tls(
    url: LockURL, scheme: str, values: dict[str, Any], passthrough: dict[str, str]
) -> dict[str, Any]:
    """redis-py's TLS arguments: the certificate required and its host name checked
    unless the URL says otherwise; TLS options on a URL without TLS are refused."""
    given = sorted(name for name in (*values, *passthrough) if name.startswith("ssl_"))
    if scheme != "rediss":
        if given:
            raise InvalidOption(
                f"option {', '.join(map(repr, given))} of {url.masked!r} needs a rediss://"
                " URL (TLS is off without it)"
            )
        return {}
    cert_reqs = values.get("ssl_cert_reqs", "required")
    check_hostname = values.get("ssl_check_hostname", cert_reqs != "none")
    if check_hostname and cert_reqs == "none":
        raise InvalidOption(
            f"ssl_check_hostname=true needs ssl_cert_reqs other than none in {url.masked!r}"
            " (a name cannot be checked on a certificate that is not verified)"
        )
    return {"ssl_cert_reqs": cert_reqs, "ssl_check_hostname": check_hostname}


def sync_client(config: RedisConfig, timeout: float | None = None) -> redis.Redis:
    """A redis-py client (it connects on first use); ``timeout`` caps the socket timeouts."""
    client: redis.Redis = _open(
        redis.Redis.from_url, config, redis.retry.Retry(NoBackoff(), 0), timeout
    )
    return client


def async_client(config: RedisConfig) -> redis.asyncio.Redis:
    """An asyncio redis-py client (it connects on first use, in the running loop)."""
    client: redis.asyncio.Redis = _open(
        redis.asyncio.Redis.from_url, config, redis.asyncio.retry.Retry(NoBackoff(), 0), None
    )
    return client


def _open(factory: Any, config: RedisConfig, retry: object, timeout: float | None) -> Any:
    socket_timeout = config.socket_timeout if timeout is None else timeout
    try:
        return factory(
            config.client_url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=min(config.connect_timeout, socket_timeout),
            # A retried acquire whose first answer was lost would report "held
            # elsewhere" for our own lock: failures are reported, never replayed.
            retry=retry,
            **config.tls,
        )
    except ValueError as exc:
        raise InvalidURL(
            f"invalid Redis URL {config.url.masked!r}: {config.url.redact(str(exc))}"
        ) from None
