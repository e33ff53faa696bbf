"""From a ``mysql://`` lock URL to driver arguments and locker settings."""

from __future__ import annotations

import os
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from pymysql.constants import CLIENT

from multilock.backend import LockURL, OptionParser, as_bool, as_duration, as_str
from multilock.errors import ConfigurationError, InvalidOption, InvalidURL

from ._errors import redact
from ._keys import MAX_PREFIX, is_prefix
from ._sql import FenceTable

__all__ = ["SSL_MODES", "Settings", "default_program_name", "parse_settings"]

MAX_SECONDS = (2**31 - 1) / 1000
"""The longest duration option: what ``poll()`` takes in milliseconds (24.8 days)."""


def _bounded(value: object) -> float:
    seconds = as_duration(value)
    if seconds > MAX_SECONDS:
        raise ConfigurationError(f"{value!r} is longer than {MAX_SECONDS:g} s")
    return seconds


_OPTIONS = OptionParser(
    {
        "connect_timeout": _bounded,
        "health_interval": _bounded,
        "health_timeout": _bounded,
        "timeout": _bounded,
        "fencing": as_bool,
        "fencing_table": as_str,
        "password": as_str,
        "prefix": as_str,
        "program_name": as_str,
        "ssl_ca": as_str,
        "ssl_cert": as_str,
        "ssl_key": as_str,
        "ssl_key_password": as_str,
        "ssl_mode": as_str,
        "ttl": as_duration,
        "unix_socket": as_str,
    },
    {
        "connect_timeout": 5.0,
        "health_interval": 5.0,
        "health_timeout": 1.0,
        "timeout": 5.0,
        "fencing": False,
        "fencing_table": "multilock_fence",
        "prefix": "",
        "ttl": 30.0,
    },
)
_IDENT = r"[A-Za-z0-9_$]{1,64}"
_TABLE = re.compile(rf"(?:({_IDENT})\.)?({_IDENT})")
_PROGRAM_NAME = 64  # bytes the server keeps of a connection attribute's value (MySQL: 1024)
SSL_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
"""The values of ``ssl_mode``: the MySQL client's ``--ssl-mode``, in lower case."""
_TLS_FILES = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_key_password")


@dataclass(frozen=True, repr=False)
class Settings:
    """What a locker needs from its URL. ``repr`` never shows the password."""

    url: LockURL
    host: str
    port: int
    user: str | None
    password: str | None = field(compare=False)
    database: str | None
    unix_socket: str | None
    program_name: str
    connect_timeout: float
    health_interval: float
    health_timeout: float
    """The bound of the health check's ``SELECT 1``."""
    timeout: float
    """The bound of every other round trip on the session."""
    prefix: str
    fence: FenceTable | None
    """The sequence table fencing tokens come from, or ``None`` when fencing is off."""
    ttl: float
    ssl_mode: str = "preferred"
    """One of :data:`SSL_MODES`."""
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)
    """The TLS context of every connection (``None``: ``ssl_mode=disabled``). Built once,
    when the URL is parsed: a bad file or key password is an ``InvalidOption`` then."""

    @property
    def tls_required(self) -> bool:
        """Whether a server that does not offer TLS is refused (every mode but
        ``preferred`` and ``disabled``)."""
        return self.ssl_mode not in ("disabled", "preferred")

    def _common(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user or "",
            "password": self.password or "",
            "unix_socket": self.unix_socket,
            "charset": "utf8mb4",
            "autocommit": True,
            "program_name": self.program_name,
            # The fenced acquire is three statements in one round trip.
            "client_flag": CLIENT.MULTI_STATEMENTS if self.fence else 0,
            "connect_timeout": self.connect_timeout,
            "ssl": self.ssl_context,
        }

    def sync_connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pymysql.connect``: every read and write on the
        session's socket is bounded by ``timeout`` (the health check shortens it)."""
        return {
            **self._common(),
            "database": self.database,
            "read_timeout": self.timeout,
            "write_timeout": self.timeout,
            # PyMySQL >= 1.2 tries TLS even when given no context: disabled means none.
            "ssl_disabled": self.ssl_context is None,
        }

    def async_connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``aiomysql.connect`` (each round trip is bounded by
        the locker itself: aiomysql has no read timeout)."""
        return {**self._common(), "db": self.database}

    def __repr__(self) -> str:
        return f"Settings({self.url.masked!r})"


def default_program_name() -> str:
    """``multilock <host> pid <pid>``: who holds a lock, as the server's connection
    attributes (``program_name``) show it."""
    name = f"multilock {socket.gethostname()} pid {os.getpid()}"
    return name.encode()[:_PROGRAM_NAME].decode(errors="ignore")


def parse_settings(url: LockURL) -> Settings:
    """Validate ``url``'s options; bad input raises :class:`~multilock.errors.InvalidOption`
    (or :class:`~multilock.errors.InvalidURL`) naming what is wrong."""
    values, _ = _OPTIONS.parse(url)
    if len(url.hosts) > 1:
        raise InvalidURL(
            f"{url.scheme}:// URL {url.masked!r} names {len(url.hosts)} hosts: user-level"
            " locks live in one server's memory, so a locker talks to exactly one"
        )
    prefix = values["prefix"]
    if not is_prefix(prefix):
        raise InvalidOption(
            f"invalid value for option 'prefix' of {url.scheme}:// URL: {prefix!r} (at most"
            f" {MAX_PREFIX} characters of a-z, 0-9, _, -, ., : and /)"
        )
    database = url.path.strip("/") or None
    if database is not None and "/" in database:
        raise InvalidURL(f"{url.scheme}:// URL {url.masked!r}: the path is one database name")
    table = values["fencing_table"]
    match = _TABLE.fullmatch(table)
    if match is None:
        raise InvalidOption(
            f"invalid value for option 'fencing_table' of {url.scheme}:// URL: {table!r} is"
            " not a table name (name or database.name: letters, digits, _ and $)"
        )
    schema, name = match.groups()
    if values["fencing"] and schema is None and database is None:
        raise InvalidOption(
            f"{url.scheme}:// URL {url.masked!r}: fencing=true needs a database for its table:"
            " name one in the URL's path, or give fencing_table=database.table"
        )
    return Settings(
        url=url,
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username,
        password=values.get("password", url.password),
        database=database,
        unix_socket=values.get("unix_socket"),
        program_name=values.get("program_name") or default_program_name(),
        connect_timeout=float(values["connect_timeout"]),
        health_interval=float(values["health_interval"]),
        health_timeout=float(values["health_timeout"]),
        timeout=float(values["timeout"]),
        prefix=prefix,
        fence=FenceTable(schema, name) if values["fencing"] else None,
        ttl=float(values["ttl"]),
        **_tls(url, values),
    )


def _tls(url: LockURL, values: dict[str, Any]) -> dict[str, Any]:
    """``ssl_mode`` and the context it needs. Without TLS options the mode is
    ``preferred`` (the MySQL client's default: TLS when the server offers it, nothing
    verified); with a CA, certificate or key it is ``verify_identity``."""
    given = [option for option in _TLS_FILES if option in values]
    mode = str(values.get("ssl_mode") or ("verify_identity" if given else "preferred")).lower()
    if mode not in SSL_MODES:
        raise InvalidOption(
            f"invalid value for option 'ssl_mode' of {url.scheme}:// URL: {values['ssl_mode']!r}"
            f" (one of {', '.join(SSL_MODES)})"
        )
    if given and mode in ("disabled", "preferred"):
        # Whoever wrote a CA or a client certificate believes the connection is secured.
        raise InvalidOption(
            f"option {', '.join(map(repr, given))} of {url.masked!r} needs an ssl_mode that"
            f" insists on TLS (required, verify_ca or verify_identity), not {mode}"
        )
    if ("ssl_cert" in values) != ("ssl_key" in values) or (
        "ssl_key_password" in values and "ssl_key" not in values
    ):
        raise InvalidOption(
            f"options 'ssl_cert' and 'ssl_key' of {url.masked!r} go together"
            " (and 'ssl_key_password' with them)"
        )
    if mode == "disabled":
        return {"ssl_mode": mode, "ssl_context": None}
    verify = mode in ("verify_ca", "verify_identity")
    try:
        if verify:
            # With ssl_ca, only that CA is trusted (as libpq's sslrootcert), not the system's.
            context = ssl.create_default_context(cafile=values.get("ssl_ca"))
        else:
            # Nothing verified: no CA store to load (the system's takes tens of ms).
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
        if "ssl_cert" in values:
            context.load_cert_chain(
                values["ssl_cert"], values["ssl_key"], values.get("ssl_key_password")
            )
    except (OSError, ssl.SSLError) as exc:
        raise InvalidOption(
            f"cannot use the TLS files of {url.masked!r}: {redact(url, str(exc))}"
        ) from None
    context.check_hostname = mode == "verify_identity"
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    return {"ssl_mode": mode, "ssl_context": context}
