"""Which user-level locks are held on the server, and by whom: ``locks()``.

MySQL and MariaDB list them in one of two places, and in neither by default
everywhere:

* ``performance_schema.metadata_locks`` (MySQL 5.7+, MariaDB 10.5+), when the
  performance schema is on and its ``wait/lock/metadata/sql/mdl`` instrument is
  enabled -- the default of MySQL 8, not of MariaDB or MySQL 5.7;
* ``information_schema.METADATA_LOCK_INFO``, the ``metadata_lock_info`` plugin
  MariaDB ships (``INSTALL SONAME 'metadata_lock_info'``).

``locks()`` asks which one the server has, then reads it. With neither it raises a
:class:`~multilock.errors.ConfigurationError` that says how to get one: listing only
this process's own leases would pass for the whole truth, and is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from multilock.backend import LockInfo, LockURL
from multilock.errors import ConfigurationError

from ._keys import KeyNames

__all__ = ["PROBE", "Source", "choose", "infos"]

PROBE = (
    "SELECT @@performance_schema,"
    " (SELECT ENABLED FROM performance_schema.setup_instruments"
    "  WHERE NAME = 'wait/lock/metadata/sql/mdl'),"
    " (SELECT COUNT(*) FROM information_schema.PLUGINS"
    "  WHERE PLUGIN_NAME = 'METADATA_LOCK_INFO' AND PLUGIN_STATUS = 'ACTIVE')"
)
"""One row: whether the performance schema is on, whether its metadata-lock instrument
is enabled, and whether MariaDB's metadata_lock_info plugin is active."""


@dataclass(frozen=True)
class Source:
    """Where the locks are read from: ``query`` gives (key, connection id, user, host,
    program name) per lock held."""

    name: str
    query: str


PERFORMANCE_SCHEMA = Source(
    "performance_schema.metadata_locks",
    "SELECT m.OBJECT_NAME, t.PROCESSLIST_ID, t.PROCESSLIST_USER, t.PROCESSLIST_HOST,"
    " a.ATTR_VALUE"
    " FROM performance_schema.metadata_locks AS m"
    " JOIN performance_schema.threads AS t ON t.THREAD_ID = m.OWNER_THREAD_ID"
    " LEFT JOIN performance_schema.session_connect_attrs AS a"
    "  ON a.PROCESSLIST_ID = t.PROCESSLIST_ID AND a.ATTR_NAME = 'program_name'"
    " WHERE m.OBJECT_TYPE = 'USER LEVEL LOCK' AND m.LOCK_STATUS = 'GRANTED'"
    " ORDER BY t.PROCESSLIST_ID, m.OBJECT_NAME",
)

METADATA_LOCK_INFO = Source(
    "information_schema.METADATA_LOCK_INFO",
    "SELECT l.TABLE_SCHEMA, l.THREAD_ID, p.USER, p.HOST, NULL"
    " FROM information_schema.METADATA_LOCK_INFO AS l"
    " LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = l.THREAD_ID"
    " WHERE l.LOCK_TYPE = 'User lock'"
    " ORDER BY l.THREAD_ID, l.TABLE_SCHEMA",
)


def choose(url: LockURL, probe: tuple[Any, ...] | None) -> Source:
    """The source the server has, from the row of :data:`PROBE`; else an error that
    says how to get one."""
    schema_on, instrument, plugin = probe if probe is not None else (0, None, 0)
    if schema_on and str(instrument).upper() == "YES":
        return PERFORMANCE_SCHEMA
    if plugin:
        return METADATA_LOCK_INFO
    why = (
        "its metadata-lock instrument is off"
        if schema_on
        else "the performance schema is off (performance_schema=OFF)"
    )
    raise ConfigurationError(
        f"MySQL at {url.masked}: locks() cannot list user-level locks: {why} and MariaDB's"
        " metadata_lock_info plugin is not installed. Either run UPDATE"
        " performance_schema.setup_instruments SET ENABLED = 'YES' WHERE NAME ="
        " 'wait/lock/metadata/sql/mdl' (with performance_schema=ON at server start), or, on"
        " MariaDB, INSTALL SONAME 'metadata_lock_info'"
    )


class _Lease(Protocol):
    name: str
    fencing_token: int | None
    acquired_at: datetime


def infos(
    rows: list[tuple[Any, ...]],
    source: Source,
    keys: KeyNames,
    mine: Mapping[str, _Lease],
    own_connection: int | None,
) -> list[LockInfo]:
    """``rows`` of ``source`` as :class:`LockInfo`: named where the key says it, or this
    locker hashed it; ``since`` known only for this locker's own leases (the server
    does not record when a user-level lock was taken)."""
    found = []
    for key, connection, user, host, program in rows:
        key = key.decode() if isinstance(key, bytes) else str(key)
        lease = mine.get(key) if connection == own_connection else None
        who = f"connection {connection}"
        if user:
            who += f" {user}@{host}" if host else f" {user}"
        if program:
            who += f" {program!r}"
        found.append(
            LockInfo(
                key=key,
                name=lease.name if lease else keys.name(key),
                holder=who,
                since=lease.acquired_at if lease else None,
                details={
                    "connection_id": connection,
                    "user": user,
                    "host": host,
                    "program_name": program,
                    "source": source.name,
                    "fencing_token": lease.fencing_token if lease else None,
                },
            )
        )
    return found
