"""From a ``postgresql://`` lock URL to libpq connection parameters and locker settings."""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from multilock.backend import LockURL, OptionParser, as_bool, as_duration, as_str, parse_duration
from multilock.errors import InvalidOption

from ._errors import redact

__all__ = ["LIBPQ_PARAMETERS", "MAX_MILLISECONDS", "Settings", "milliseconds", "parse_settings"]

# libpq connection parameters handed on unchanged: TLS, auth, routing, keepalive tuning.
LIBPQ_PARAMETERS = frozenset(
    {
        "channel_binding",
        "client_encoding",
        "dbname",
        "gssdelegation",
        "gssencmode",
        "gsslib",
        "host",
        "hostaddr",
        "keepalives",
        "keepalives_count",
        "keepalives_idle",
        "keepalives_interval",
        "krbsrvname",
        "load_balance_hosts",
        "options",
        "passfile",
        "password",
        "port",
        "require_auth",
        "requirepeer",
        "service",
        "sslcert",
        "sslcertmode",
        "sslcompression",
        "sslcrl",
        "sslcrldir",
        "sslkey",
        "sslmax_protocol_version",
        "sslmin_protocol_version",
        "sslmode",
        "sslnegotiation",
        "sslpassword",
        "sslrootcert",
        "sslsni",
        "target_session_attrs",
        "tcp_user_timeout",
        "user",
    }
)

MAX_MILLISECONDS = 2**31 - 1
"""The longest timeout option, in ms: PostgreSQL's and the kernel's limit (an int), 24.9 days."""


def _ms_duration(value: object) -> float:
    """A duration that PostgreSQL (or ``tcp_user_timeout``) will take in milliseconds."""
    return parse_duration(value, what="duration", maximum=MAX_MILLISECONDS / 1000)


def milliseconds(seconds: float) -> int:
    """``seconds`` in whole milliseconds, rounded up: a short timeout never means "none"."""
    return max(1, math.ceil(seconds * 1000))


_OPTIONS = OptionParser(
    {
        "application_name": as_str,
        "connect_timeout": _ms_duration,
        "health_interval": _ms_duration,
        "health_timeout": _ms_duration,
        "lock_timeout": _ms_duration,
        "statement_timeout": _ms_duration,
        "fencing": as_bool,
        "fencing_sequence": as_str,
        "claims_table": as_str,
        "ttl": as_duration,
    },
    {
        "connect_timeout": 5.0,
        "health_interval": 5.0,
        "health_timeout": 1.0,
        "fencing": False,
        "fencing_sequence": "multilock_fence",
        "claims_table": "multilock_tick_claims",
        "ttl": 30.0,
    },
    passthrough=LIBPQ_PARAMETERS,
)
_IDENT = r"[a-z_][a-z0-9_$]*"
_SEQUENCE = re.compile(rf"{_IDENT}(?:\.{_IDENT})?")
_NAMEDATALEN = 63  # the server truncates application_name to this many bytes
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


@dataclass(frozen=True, repr=False)
class Settings:
    """What a locker needs from its URL. ``conninfo`` never holds the password, nor
    the TLS key's (``sslpassword``)."""

    url: LockURL
    conninfo: str
    password: str | None = field(compare=False)
    sslpassword: str | None = field(compare=False)
    health_interval: float
    health_timeout: float
    fencing_sequence: str | None
    """The sequence fencing tokens come from, or ``None`` when fencing is off."""
    ttl: float
    claims_table: str = "multilock_tick_claims"
    """The table of tick claims' marks (``name`` or ``schema.name``), made on first use."""
    lock_timeout: float = 0.5
    """The session's ``lock_timeout``: how long a statement may wait for a lock."""
    statement_timeout: float = 0.8
    """The session's ``statement_timeout``: how long the server runs one statement."""

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``psycopg.Connection.connect`` besides the conninfo."""
        return {"password": self.password, "sslpassword": self.sslpassword, "autocommit": True}

    def __repr__(self) -> str:
        return f"Settings({self.url.masked!r})"


def default_application_name() -> str:
    """``multilock <host> pid <pid>``: who holds a lock, as pg_stat_activity shows it."""
    name = f"multilock {socket.gethostname()} pid {os.getpid()}"
    return name.encode()[:_NAMEDATALEN].decode(errors="ignore")


def _check_sslmode(url: LockURL, params: dict[str, Any]) -> None:
    """Refuse an sslmode libpq does not know, now rather than at each connect; and
    verify the server fully when the URL names a root certificate without a mode
    (libpq's default, ``prefer``, would neither verify it nor insist on TLS)."""
    mode = params.get("sslmode")
    if mode is None:
        if params.get("sslrootcert") and "PGSSLMODE" not in os.environ:
            params["sslmode"] = "verify-full"
        return
    if mode not in _SSLMODES:
        raise InvalidOption(
            f"invalid value for option 'sslmode' of {url.scheme}:// URL: expected one of"
            f" {', '.join(_SSLMODES)}, got {mode!r}"
        )


def parse_settings(url: LockURL) -> Settings:
    """Validate ``url``'s options and build the libpq parameters; bad input raises
    :class:`~multilock.errors.InvalidOption` naming the option."""
    values, libpq = _OPTIONS.parse(url)
    sequence = values["fencing_sequence"]
    if not _SEQUENCE.fullmatch(sequence):
        raise InvalidOption(
            f"invalid value for option 'fencing_sequence' of {url.scheme}:// URL: {sequence!r}"
            " is not a sequence name (name or schema.name in lower case: letters, digits, _ and $)"
        )
    table = values["claims_table"]
    if not _SEQUENCE.fullmatch(table):
        raise InvalidOption(
            f"invalid value for option 'claims_table' of {url.scheme}:// URL: {table!r}"
            " is not a table name (name or schema.name in lower case: letters, digits, _ and $)"
        )
    password = libpq.pop("password", url.password)
    sslpassword = libpq.pop("sslpassword", None)
    interval = float(values["health_interval"])
    params: dict[str, Any] = {
        "host": ",".join(host for host, _ in url.hosts) or None,
        "port": ",".join(str(port or "") for _, port in url.hosts) or None,
        "dbname": url.path.lstrip("/") or None,
        "user": url.username,
        "application_name": values.get("application_name") or default_application_name(),
        # libpq takes whole seconds; round up so that a short timeout never means "none".
        "connect_timeout": max(1, math.ceil(values["connect_timeout"])),
        # Keepalives and a TCP user timeout bound how long a cut network goes unnoticed.
        "keepalives": 1,
        "keepalives_idle": max(1, math.ceil(interval)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": max(1000, milliseconds(interval)),
    }
    if len(url.hosts) > 1:
        # Advisory locks taken on a standby do not exclude holders on the primary.
        params["target_session_attrs"] = "read-write"
    params.update(libpq)
    _check_sslmode(url, params)
    if params["port"] is not None and not params["port"].strip(","):
        params["port"] = None
    try:
        conninfo = make_conninfo("", **params)
    except psycopg.ProgrammingError as exc:  # a parameter this libpq does not know
        raise InvalidOption(
            f"invalid libpq parameter in {url.scheme}:// URL {url.masked!r}:"
            f" {redact(url, str(exc))}"
        ) from None
    return Settings(
        url=url,
        conninfo=conninfo,
        password=password,
        sslpassword=sslpassword,
        health_interval=interval,
        health_timeout=float(values["health_timeout"]),
        fencing_sequence=sequence if values["fencing"] else None,
        ttl=float(values["ttl"]),
        claims_table=table,
        **_server_timeouts(url, values),
    )


LOCK_SHARE = 0.5
"""``lock_timeout``'s default, as a share of ``health_timeout``."""
STATEMENT_SHARE = 0.8
"""``statement_timeout``'s default, as a share of ``health_timeout``."""


def _server_timeouts(url: LockURL, values: dict[str, Any]) -> dict[str, float]:
    """``lock_timeout`` and ``statement_timeout``, given or by default, each shorter
    than ``health_timeout``: a round trip still unanswered after that is cut off with
    the session (its leases lost), so the server must give up first and answer."""
    health = float(values["health_timeout"])
    timeouts = {
        "lock_timeout": float(values.get("lock_timeout", LOCK_SHARE * health)),
        "statement_timeout": float(values.get("statement_timeout", STATEMENT_SHARE * health)),
    }
    for option, seconds in timeouts.items():
        if seconds >= health:
            raise InvalidOption(
                f"invalid value for option {option!r} of {url.scheme}:// URL: {seconds:g} s is"
                f" not shorter than health_timeout ({health:g} s), after which a round trip"
                " is cut off; raise health_timeout too"
            )
    return timeouts
