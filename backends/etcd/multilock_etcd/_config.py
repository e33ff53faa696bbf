"""``etcd://`` URLs: the cluster's members, the key prefix, the options, credentials, TLS."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from multilock.backend import LockURL, OptionParser, as_bool, as_duration, as_str
from multilock.errors import InvalidOption, InvalidURL

__all__ = ["DEFAULT_PORT", "DEFAULT_PREFIX", "MIN_TTL", "EtcdConfig"]

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "multilock/"
"""The key prefix when the URL names none."""
MIN_TTL = 0.1
"""Shorter leases could not be kept alive (every ttl/3) over a network; refused."""

_OPTIONS = OptionParser(
    {
        "ttl": as_duration,
        "timeout": as_duration,
        "connect_timeout": as_duration,
        "tls": as_bool,
        "cacert": as_str,
        "cert": as_str,
        "key": as_str,
        "verify": as_bool,
    },
    {"ttl": 30.0, "timeout": 5.0, "connect_timeout": 5.0},
)
_TLS_OPTIONS = ("cacert", "cert", "key", "verify")


@dataclass(frozen=True, repr=False)
class EtcdConfig:
    """Everything a locker needs from its URL, checked once."""

    url: LockURL
    endpoints: tuple[tuple[str, int], ...]
    """``(host, port)`` of each member, in the URL's order."""
    prefix: bytes
    """Every lock key starts with it; it ends with ``/``."""
    ttl: float
    timeout: float
    """Seconds any one request may take (each of connect, send, answer)."""
    connect_timeout: float
    username: str | None = None
    password: str | None = field(default=None, compare=False)
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        return f"EtcdConfig({self.url.masked!r})"

    @classmethod
    def from_url(cls, url: LockURL) -> EtcdConfig:
        """Check ``url``: members, prefix, options, credentials, TLS files."""
        values, _ = _OPTIONS.parse(url)
        if values["ttl"] < MIN_TTL:
            raise InvalidOption(f"option 'ttl' of {url.masked!r} must be at least {MIN_TTL}s")
        for option in ("timeout", "connect_timeout"):
            if values[option] <= 0:
                raise InvalidOption(f"option {option!r} of {url.masked!r} must be positive")
        if (url.username is None) != (url.password is None) or url.username == "":
            raise InvalidURL(
                f"etcd authentication needs a user name and a password in {url.masked!r}"
                " (etcd://user:password@host:2379/prefix)"
            )
        context = _ssl_context(url, values)
        hosts = url.hosts or (("127.0.0.1", None),)
        endpoints = tuple((host, port or DEFAULT_PORT) for host, port in hosts)
        return cls(
            url=url,
            endpoints=endpoints,
            prefix=_prefix(url),
            ttl=values["ttl"],
            timeout=values["timeout"],
            connect_timeout=values["connect_timeout"],
            username=url.username,
            password=url.password,
            ssl_context=context,
        )


def _prefix(url: LockURL) -> bytes:
    path = url.path.strip("/")
    if not path:
        return DEFAULT_PREFIX.encode()
    if "\x00" in path:
        raise InvalidURL(f"the key prefix of {url.masked!r} contains a NUL character")
    return path.encode("utf-8", "surrogatepass") + b"/"


def _ssl_context(url: LockURL, values: dict[str, object]) -> ssl.SSLContext | None:
    """The TLS context of ``tls=true``: the server's certificate and host name checked
    unless ``verify=false``; TLS options without ``tls=true`` are refused."""
    given = [name for name in _TLS_OPTIONS if name in values]
    if not values.get("tls", False):
        if given:
            raise InvalidOption(
                f"option {', '.join(map(repr, given))} of {url.masked!r} needs tls=true"
                " (TLS is off without it)"
            )
        return None
    if ("cert" in values) != ("key" in values):
        raise InvalidOption(f"options 'cert' and 'key' of {url.masked!r} go together")
    try:
        context = ssl.create_default_context(cafile=values.get("cacert"))  # type: ignore[arg-type]
        if "cert" in values:
            context.load_cert_chain(str(values["cert"]), str(values["key"]))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidOption(f"cannot use the TLS files of {url.masked!r}: {exc}") from None
    if not values.get("verify", True):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
