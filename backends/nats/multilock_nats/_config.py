"""``nats://`` URLs: the servers, the bucket, the options, credentials, TLS."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field

from multilock.backend import LockURL, OptionParser, as_bool, as_duration, as_str
from multilock.errors import InvalidOption, InvalidURL

__all__ = ["DEFAULT_BUCKET", "DEFAULT_PORT", "MIN_TTL", "NatsConfig"]

DEFAULT_PORT = 4222
DEFAULT_BUCKET = "multilock"
MIN_TTL = 0.1
"""Shorter leases could not be renewed (every ttl/3) over a network; refused."""
_BUCKET = re.compile(r"[A-Za-z0-9_-]+")
_PREFIX = re.compile(r"[-/_=.A-Za-z0-9]*")

_OPTIONS = OptionParser(
    {
        "ttl": as_duration,
        "bucket_ttl": as_duration,
        "prefix": as_str,
        "timeout": as_duration,
        "connect_timeout": as_duration,
        "tls": as_bool,
        "cacert": as_str,
        "cert": as_str,
        "key": as_str,
        "verify": as_bool,
    },
    {"ttl": 30.0, "prefix": "", "timeout": 5.0, "connect_timeout": 5.0},
)
_TLS_OPTIONS = ("cacert", "cert", "key", "verify")


@dataclass(frozen=True, repr=False)
class NatsConfig:
    """Everything a locker needs from its URL, checked once."""

    url: LockURL
    servers: tuple[str, ...]
    """``nats://host:port`` (``tls://`` with TLS) of each server, without credentials."""
    bucket: str
    prefix: str
    """Every lock key starts with it (a KV key fragment, possibly empty)."""
    ttl: float
    bucket_ttl: float
    """The TTL (``max_age``) of a bucket this locker creates: how long after its last
    renewal a dead holder's key stays."""
    timeout: float
    connect_timeout: float
    user: str | None = None
    password: str | None = field(default=None, compare=False)
    token: str | None = field(default=None, compare=False)
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        return f"NatsConfig({self.url.masked!r})"

    @property
    def stream(self) -> str:
        """The JetStream stream behind the bucket."""
        return f"KV_{self.bucket}"

    @property
    def subjects(self) -> str:
        """The subject of the bucket's key ``""``: a key's subject is this plus the key."""
        return f"$KV.{self.bucket}."

    @classmethod
    def from_url(cls, url: LockURL) -> NatsConfig:
        """Check ``url``: servers, bucket, options, credentials, TLS files."""
        user, password, token = _credentials(url)
        values, _ = _OPTIONS.parse(url)
        if values["ttl"] < MIN_TTL:
            raise InvalidOption(f"option 'ttl' of {url.masked!r} must be at least {MIN_TTL}s")
        bucket_ttl = values.get("bucket_ttl", values["ttl"])
        if bucket_ttl < 1.0:
            raise InvalidOption(f"option 'bucket_ttl' of {url.masked!r} must be at least 1s")
        for option in ("timeout", "connect_timeout"):
            if values[option] <= 0:
                raise InvalidOption(f"option {option!r} of {url.masked!r} must be positive")
        bucket = url.path.strip("/") or DEFAULT_BUCKET
        if not _BUCKET.fullmatch(bucket):
            raise InvalidURL(
                f"invalid bucket {bucket!r} in {url.masked!r}: letters, digits, '-' and '_' only"
            )
        prefix = values["prefix"]
        if not _PREFIX.fullmatch(prefix) or prefix.startswith(".") or ".." in prefix:
            raise InvalidOption(
                f"option 'prefix' of {url.masked!r} must be a NATS KV key fragment:"
                " letters, digits and -/_=. without a leading '.' or '..'"
            )
        context = _ssl_context(url, values)
        scheme = "tls" if context is not None else "nats"
        hosts = url.hosts or (("127.0.0.1", None),)
        servers = tuple(
            f"{scheme}://{f'[{host}]' if ':' in host else host}:{port or DEFAULT_PORT}"
            for host, port in hosts
        )
        return cls(
            url=url,
            servers=servers,
            bucket=bucket,
            prefix=prefix,
            ttl=values["ttl"],
            bucket_ttl=bucket_ttl,
            timeout=values["timeout"],
            connect_timeout=values["connect_timeout"],
            user=user,
            password=password,
            token=token,
            ssl_context=context,
        )


def _credentials(url: LockURL) -> tuple[str | None, str | None, str | None]:
    """User and password (``nats://user:password@host``), or a token
    (``nats://:token@host``). A bare ``nats://word@host`` is refused without repeating
    it: it is a token to NATS, and a user name to everything that prints URLs."""
    if url.username is not None and url.password is None:
        raise InvalidURL(
            "a nats:// URL with a user name and no password: write a token as"
            " nats://:TOKEN@host:4222/bucket, so that it is masked like a password"
        )
    if url.password is not None and url.username is None:
        return None, None, url.password
    return url.username, url.password, None


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
