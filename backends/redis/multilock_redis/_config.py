"""A lock URL turned into redis-py clients: options checked, retries off, timeouts on,
TLS verified (certificate and host name) unless the URL turns it off.

Three topologies: one server (``redis://``, ``rediss://``, ``unix://``), a Redis
Cluster (``redis+cluster://h1:7000,h2:7001/``: any nodes, the rest discovered)
and a primary found through Sentinel (``redis+sentinel://h1:26379,h2:26379/mymaster``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.connection
import redis.retry
import redis.sentinel
from redis.backoff import NoBackoff

from multilock.backend import LockURL, OptionParser, as_bool, as_duration, as_int, as_str
from multilock.errors import InvalidOption, InvalidURL

__all__ = [
    "CLUSTER",
    "SENTINEL",
    "SERVER",
    "AsyncClient",
    "AsyncClusterClient",
    "RedisConfig",
    "SyncClient",
    "SyncClusterClient",
    "admin_client",
    "async_client",
    "async_cluster_client",
    "async_forget_slots",
    "async_learn_slots",
    "close_admin",
    "parse_config",
    "sentinels_of",
    "sync_client",
    "sync_cluster_client",
    "sync_forget_slots",
    "sync_learn_slots",
]

AsyncClient = redis.asyncio.Redis
"""The asyncio client type (``SyncClient`` in the generated sync code)."""
SyncClient = redis.Redis
"""The sync client type."""
AsyncClusterClient = redis.asyncio.cluster.RedisCluster
"""The asyncio Redis Cluster client type (``SyncClusterClient`` in the sync code)."""
SyncClusterClient = redis.cluster.RedisCluster
"""The sync Redis Cluster client type."""

# redis-py gives these no type hints: mypy --strict would refuse the calls.
_parse_url: Any = redis.connection.parse_url
_SyncSentinel: Any = redis.sentinel.Sentinel
_AsyncSentinel: Any = redis.asyncio.sentinel.Sentinel
_SyncClusterNode: Any = redis.cluster.ClusterNode

SERVER, CLUSTER, SENTINEL = "server", "cluster", "sentinel"
"""The topologies: one server, a Redis Cluster, a primary watched by Sentinel."""

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
# Options of one topology only: refused on the others' URLs.
_SENTINEL_OPTIONS = frozenset({"sentinel_username", "sentinel_password"})
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
        "wait_replicas": as_int,
        "wait_timeout": as_duration,
        "sentinel_username": as_str,
        "sentinel_password": as_str,
    },
    {
        "ttl": 30.0,
        "prefix": "multilock:",
        "socket_timeout": 5.0,
        "connect_timeout": 5.0,
        "wait_replicas": 0,
        "wait_timeout": 1.0,
    },
    passthrough=_PASSTHROUGH,
)
# URL scheme -> (the scheme of redis-py's URL for one node, topology)
_SCHEMES = {
    "redis": ("redis", SERVER),
    "rediss": ("rediss", SERVER),
    "unix": ("unix", SERVER),
    "redis+unix": ("unix", SERVER),
    "redis+cluster": ("redis", CLUSTER),
    "redis+sentinel": ("redis", SENTINEL),
}
_DEFAULT_PORTS = {SERVER: 6379, CLUSTER: 6379, SENTINEL: 26379}
MIN_TTL = 0.01
"""Shorter leases could not be renewed (every ttl/3) over a network; refused."""
MAX_WAIT_REPLICAS = 100
"""More replicas than any deployment has: a larger ``wait_replicas`` is a typo."""


@dataclass(frozen=True)
class RedisConfig:
    """What a locker needs from its URL."""

    url: LockURL
    client_url: str
    """The URL for redis-py: our options removed, scheme normalized. Holds the password.
    For a cluster or Sentinel, the URL of its first node (redis-py reads the
    connection options from it; the nodes come from ``nodes``)."""
    ttl: float
    prefix: str
    socket_timeout: float
    connect_timeout: float
    tls: dict[str, Any] = field(default_factory=dict)
    """redis-py's TLS verification arguments (rediss:// only)."""
    topology: str = SERVER
    """:data:`SERVER`, :data:`CLUSTER` or :data:`SENTINEL`."""
    nodes: tuple[tuple[str, int], ...] = ()
    """The URL's hosts with their ports (cluster nodes or Sentinels)."""
    service: str = ""
    """The name Sentinel knows the primary by."""
    sentinel_auth: dict[str, str] = field(default_factory=dict)
    """``username``/``password`` for the Sentinels themselves. Holds a password."""
    wait_replicas: int = 0
    """Replicas that must acknowledge a grant or renewal (``WAIT``); 0: none."""
    wait_timeout: float = 1.0
    """How long ``WAIT`` may take before the grant or renewal counts as failed."""

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
    if values["wait_replicas"] > MAX_WAIT_REPLICAS:
        raise InvalidOption(
            f"option 'wait_replicas' of {url.masked!r} must be at most {MAX_WAIT_REPLICAS}"
        )
    known = _SCHEMES.get(url.scheme)
    if known is None:
        raise InvalidURL(
            f"{url.masked!r} is not a redis://, rediss://, unix://, redis+cluster://"
            " or redis+sentinel:// URL"
        )
    scheme, topology = known
    misplaced = sorted(_SENTINEL_OPTIONS & set(values)) if topology != SENTINEL else []
    if misplaced:
        raise InvalidOption(
            f"option {', '.join(map(repr, misplaced))} of {url.masked!r} needs a"
            " redis+sentinel:// URL"
        )
    db, service = _path(url, topology, passthrough)
    tls = _tls(url, scheme, values, passthrough)
    nodes = tuple((host, port or _DEFAULT_PORTS[topology]) for host, port in url.hosts)
    if topology != SERVER and not nodes:
        raise InvalidURL(f"invalid Redis URL {url.masked!r}: it names no host")
    # Rebuilt from the parsed URL: redis-py's own parser would cut a password at an
    # unencoded '#', '?' or '/', and then show the rest of it in its errors.
    auth = ""
    if url.username is not None or url.password is not None:
        auth = quote(url.username or "", safe="")
        if url.password is not None:
            auth += ":" + quote(url.password, safe="")
        auth += "@"
    if topology == SERVER:
        client_url = f"{scheme}://{auth}{url.address}"
    else:
        host, port = nodes[0]
        host = f"[{host}]" if ":" in host else host
        client_url = f"{scheme}://{auth}{host}:{port}/{db}"
        passthrough.pop("db", None)
    if passthrough:
        client_url += "?" + urlencode(passthrough)
    sentinel_auth = {
        key: values[f"sentinel_{key}"]
        for key in ("username", "password")
        if f"sentinel_{key}" in values
    }
    config = RedisConfig(
        url,
        client_url,
        values["ttl"],
        prefix,
        values["socket_timeout"],
        values["connect_timeout"],
        tls,
        topology,
        nodes,
        service,
        sentinel_auth,
        values["wait_replicas"],
        values["wait_timeout"],
    )
    _node_options(config)  # let redis-py reject a bad db, port or TLS option now
    if topology == SERVER:
        sync_client(config).close()
    return config


def _path(url: LockURL, topology: str, passthrough: dict[str, str]) -> tuple[str, str]:
    """The db number and Sentinel's service name in ``url``'s path, checked."""
    parts = [part for part in url.path.split("/") if part]
    if topology == SENTINEL:
        if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise InvalidURL(
                f"invalid Redis URL {url.masked!r}: the path is the name Sentinel knows"
                " the primary by, then maybe a db number: /mymaster or /mymaster/0"
            )
        if len(parts) == 2 and "db" in passthrough:
            raise InvalidOption(f"{url.masked!r} gives the db twice: in its path and as ?db=")
        return passthrough.get("db", parts[1] if len(parts) == 2 else "0"), parts[0]
    if url.scheme in ("unix", "redis+unix"):
        return passthrough.get("db", "0"), ""  # the path is the socket's
    if len(parts) > 1 or (parts and not parts[0].isdigit()):
        raise InvalidURL(f"invalid Redis URL {url.masked!r}: the path is the db number, like /0")
    db = passthrough.get("db", parts[0] if parts else "0")
    if topology == CLUSTER and db.strip() != "0":
        raise InvalidURL(f"invalid Redis URL {url.masked!r}: a Redis Cluster has only db 0")
    return db, ""


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


def _node_options(config: RedisConfig) -> dict[str, Any]:
    """redis-py's connection arguments for one node of a cluster or the primary behind
    Sentinel (password, db, client name...), read from the URL by redis-py itself."""
    try:
        options: dict[str, Any] = _parse_url(config.client_url)
    except ValueError as exc:
        raise InvalidURL(
            f"invalid Redis URL {config.url.masked!r}: {config.url.redact(str(exc))}"
        ) from None
    for name in ("host", "port", *(("db",) if config.topology == CLUSTER else ())):
        options.pop(name, None)
    return options


def _timeouts(config: RedisConfig, timeout: float | None) -> dict[str, Any]:
    socket_timeout = config.socket_timeout if timeout is None else timeout
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": min(config.connect_timeout, socket_timeout),
    }


def sync_client(config: RedisConfig, timeout: float | None = None) -> redis.Redis:
    """A redis-py client of the server, or of the primary Sentinel names (it connects
    on first use); ``timeout`` caps the socket timeouts."""
    retry = redis.retry.Retry(NoBackoff(), 0)
    if config.topology == SENTINEL:
        sentinel = _SyncSentinel(
            list(config.nodes), sentinel_kwargs=_sentinel_options(config, timeout, retry)
        )
        primary: redis.Redis = sentinel.master_for(
            config.service, **_timeouts(config, timeout), retry=retry, **_node_options(config)
        )
        return primary
    client: redis.Redis = _open(redis.Redis.from_url, config, retry, timeout)
    return client


def async_client(config: RedisConfig, timeout: float | None = None) -> redis.asyncio.Redis:
    """An asyncio redis-py client of the server, or of the primary Sentinel names (it
    connects on first use, in the running loop)."""
    retry = redis.asyncio.retry.Retry(NoBackoff(), 0)
    if config.topology == SENTINEL:
        sentinel = _AsyncSentinel(
            list(config.nodes), sentinel_kwargs=_sentinel_options(config, timeout, retry)
        )
        primary: redis.asyncio.Redis = sentinel.master_for(
            config.service, **_timeouts(config, timeout), retry=retry, **_node_options(config)
        )
        return primary
    client: redis.asyncio.Redis = _open(redis.asyncio.Redis.from_url, config, retry, timeout)
    return client


def _sentinel_options(config: RedisConfig, timeout: float | None, retry: object) -> dict[str, Any]:
    """Arguments of the connections to the Sentinels themselves."""
    return {**_timeouts(config, timeout), "retry": retry, **config.sentinel_auth}


def sync_cluster_client(
    config: RedisConfig, timeout: float | None = None
) -> redis.cluster.RedisCluster:
    """A Redis Cluster client. It connects at once, to learn the cluster's slots:
    make it when it is first needed."""
    return redis.cluster.RedisCluster(
        startup_nodes=[_SyncClusterNode(host, port) for host, port in config.nodes],
        retry=redis.retry.Retry(NoBackoff(), 0),
        **_timeouts(config, timeout),
        **_node_options(config),
    )


def async_cluster_client(
    config: RedisConfig, timeout: float | None = None
) -> redis.asyncio.cluster.RedisCluster:
    """An asyncio Redis Cluster client (it connects on first use, in the running loop)."""
    return redis.asyncio.cluster.RedisCluster(
        startup_nodes=[
            redis.asyncio.cluster.ClusterNode(host, port) for host, port in config.nodes
        ],
        retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
        **_timeouts(config, timeout),
        **_node_options(config),
    )


async def async_learn_slots(client: redis.asyncio.cluster.RedisCluster) -> None:
    """Have ``client`` learn which primary serves which slot, if it has not yet (the
    asyncio client does on its first command: before one, it knows none)."""
    await client.initialize()


def sync_learn_slots(client: redis.cluster.RedisCluster) -> None:
    """Nothing to do: the sync client learnt the slots when it was made."""


async def async_forget_slots(client: redis.asyncio.cluster.RedisCluster) -> None:
    """Have ``client`` learn the cluster's slots again before its next command. Its
    single commands see to that after a connection error, its pipelines do not (with
    retries off): without this, a pipeline would dial a dead primary forever."""
    await client.aclose()


def sync_forget_slots(client: redis.cluster.RedisCluster) -> None:
    """Nothing to do: the sync client's pipelines learn the slots again themselves
    after a connection error."""


def admin_client(config: RedisConfig) -> redis.Redis | redis.cluster.RedisCluster:
    """A sync client for listing or breaking locks from outside a locker: the
    cluster's (which connects at once), or the server's."""
    if config.topology == CLUSTER:
        return sync_cluster_client(config)
    return sync_client(config)


def sentinels_of(client: redis.Redis | redis.asyncio.Redis) -> list[Any]:
    """The clients of the Sentinels that ``client`` asks where its primary is: closed
    with it (redis-py closes only the primary's pool)."""
    pool = client.connection_pool
    if isinstance(
        pool, redis.sentinel.SentinelConnectionPool | redis.asyncio.sentinel.SentinelConnectionPool
    ):
        sentinels: list[Any] = pool.sentinel_manager.sentinels
        return sentinels
    return []


def close_admin(client: redis.Redis | redis.cluster.RedisCluster) -> None:
    """Close a client made by :func:`admin_client`, and its Sentinels' clients."""
    client.close()
    if isinstance(client, redis.Redis):
        for sentinel in sentinels_of(client):
            sentinel.close()


def _open(factory: Any, config: RedisConfig, retry: object, timeout: float | None) -> Any:
    try:
        return factory(
            config.client_url,
            **_timeouts(config, timeout),
            # A retried acquire whose first answer was lost would report "held
            # elsewhere" for our own lock: failures are reported, never replayed.
            retry=retry,
            **config.tls,
        )
    except ValueError as exc:
        raise InvalidURL(
            f"invalid Redis URL {config.url.masked!r}: {config.url.redact(str(exc))}"
        ) from None
