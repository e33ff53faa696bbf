"""The SQL a locker sends: each statement is one round trip, prepared once per session."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from psycopg import postgres, sql
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = [
    "LOCKS",
    "PING",
    "SERVER_PID",
    "SET_TIMEOUTS",
    "SET_UP",
    "UNLOCK",
    "UNLOCK_ALL",
    "UNLOCK_MANY",
    "BigintArray",
    "BigintArrayDumper",
    "ClaimStatements",
    "Statements",
    "bigint_array",
    "claim_statements",
    "ensure_sequence",
    "statements",
]

PING = "SELECT 1"
SET_TIMEOUTS = (
    "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)"
)
# A new session's first round trip: its timeouts, its server process (a pooler's pid is
# not the server's), and how the server sees our end of the connection.
SET_UP = (
    "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false),"
    " pg_backend_pid(), host(inet_client_addr()), inet_client_port()"
)
SERVER_PID = "SELECT pg_backend_pid()"
UNLOCK = "SELECT pg_advisory_unlock(%b)"
UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"
UNLOCK_MANY = "SELECT pg_advisory_unlock(k) FROM unnest(%b::bigint[]) AS k"

# Tick claims: a table of marks (name -> latest fire time claimed, in microseconds),
# made on first use. One statement raises every mark of a batch where it is below:
# ON CONFLICT ... WHERE takes the row lock and sees the latest committed mark, so of
# concurrent claimers of one tick exactly one updates (or inserts) the row. Rows go
# in name order, so that two batches never wait on each other's rows crosswise.


@dataclass(frozen=True)
class ClaimStatements:
    """The statements of the tick claims table ``table`` (a checked identifier)."""

    table: str
    create: str
    usable: str
    claim: str


def claim_statements(table: str) -> ClaimStatements:
    """The claims statements for ``table``, ``name`` or ``schema.name`` (lower case,
    checked by the URL parser: safe to write into the SQL as it is)."""
    return ClaimStatements(
        table=table,
        create=f"CREATE TABLE IF NOT EXISTS {table} (name text PRIMARY KEY,"
        " fire bigint NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now())",
        usable=f"""
SELECT c.oid IS NOT NULL,
       COALESCE(has_table_privilege(c.oid, 'SELECT')
                AND has_table_privilege(c.oid, 'INSERT')
                AND has_table_privilege(c.oid, 'UPDATE'), false)
FROM (SELECT to_regclass('{table}') AS oid) AS c""",
        claim=f"""
INSERT INTO {table} AS m (name, fire)
SELECT n, f FROM unnest(%b::text[], %b::bigint[]) AS t(n, f) ORDER BY n
ON CONFLICT (name) DO UPDATE SET fire = excluded.fire, claimed_at = now()
WHERE m.fire < excluded.fire
RETURNING m.name""",
    )


# A bigint advisory key is stored as classid (high 32 bits) and objid (low 32 bits),
# objsubid 1; recombined in Python, where the sign is easy to get right. Exclusive
# only: a waiter's watch is granted the key in shared mode for an instant.
LOCKS = """
SELECT l.classid::bigint, l.objid::bigint, l.pid, a.application_name,
       host(a.client_addr), a.backend_start, a.query_start
FROM pg_locks AS l
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY a.backend_start, l.pid, l.classid, l.objid
"""


@dataclass(frozen=True)
class Statements:
    """The acquire statements of one configuration (with or without fencing).

    Both compute the fencing token -- ``0`` when the lock was not granted and
    ``NULL`` when it was but fencing is off -- so that one code path reads both.
    ``nextval`` runs only for a granted lock: a failed try burns no token.

    ``lock`` returns that token. ``lock_many`` takes the keys as one binary array
    (:func:`bigint_array`) and returns one row: the granted keys and their tokens,
    two arrays in the same order (``NULL``, ``NULL`` when none was granted). One
    row of two arrays, not a row per key, because decoding rows is most of the
    client's work on a large batch, and refused keys need no answer at all.
    """

    lock: str
    lock_many: str


def statements(sequence: tuple[str, str] | None) -> Statements:
    """The acquire statements, fenced by ``sequence`` (schema, name) when it is given:
    named with its schema, so that no ``search_path`` can put another in its place."""
    token: sql.Composable = sql.SQL("NULL::bigint")
    if sequence is not None:
        qualified = sql.Identifier(*sequence).as_string(None)
        token = sql.SQL("nextval({})").format(sql.Literal(qualified))
    granted = sql.SQL("CASE WHEN pg_try_advisory_lock({key}) THEN {token} ELSE 0 END")
    # The locks are taken in a WITH query: one with volatile functions is evaluated
    # exactly once per row, never inlined into the outer query, where the filter
    # could evaluate the CASE a second time and lock a key twice.
    many = sql.SQL(
        "WITH t AS (SELECT k, {} AS f FROM unnest(%b::bigint[]) AS k)"
        " SELECT array_agg(k), array_agg(f) FROM t WHERE f IS DISTINCT FROM 0"
    )
    # Rendered once to text: psycopg caches the parsing of a text query, not of a
    # composed one, and that parsing would otherwise cost a third of a round trip.
    return Statements(
        lock=sql.SQL("SELECT {}")
        .format(granted.format(key=sql.SQL("%b"), token=token))
        .as_string(None),
        lock_many=many.format(granted.format(key=sql.Identifier("k"), token=token)).as_string(None),
    )


_INT8_OID = postgres.types["int8"].oid


class BigintArray(bytes):
    """Advisory keys already in the binary wire format of a ``bigint[]``."""


class BigintArrayDumper(Dumper):
    """Sends a :class:`BigintArray` as it is: registered on the locker's connection."""

    format = Format.BINARY
    oid = postgres.types["int8"].array_oid

    def dump(self, obj: Any) -> bytes:
        """The bytes of the array, unchanged."""
        assert isinstance(obj, BigintArray)
        return obj


def bigint_array(keys: list[int]) -> BigintArray:
    """``keys`` as a binary ``bigint[]``, the parameter of ``lock_many`` and
    ``UNLOCK_MANY``: one dimension, no nulls, element type, length, lower bound 1,
    then each key after its length. One ``struct.pack`` for a thousand keys is
    several times cheaper than psycopg's dumping of a list of ``Int8``, and the
    server reads it faster than the text of the same array."""
    n = len(keys)
    fields = [8] * (2 * n)
    fields[1::2] = keys
    return BigintArray(struct.pack(f"!5i{'iq' * n}", 1, 0, _INT8_OID, n, 1, *fields))


def ensure_sequence(sequence: str) -> tuple[sql.Composed, sql.Composed]:
    """(look-up, creation) statements for the fencing sequence ``name`` or
    ``schema.name``. The look-up returns no row when nothing has that name, else one
    row: schema, name, relkind, cache size (``NULL`` if not a sequence), whether the
    current role owns it, its owner, the current role, whether this role may use it,
    and the other roles that may ``setval`` it (``UPDATE``), comma-separated.

    Look first and create only when missing, so that a role without CREATE privilege
    can use a sequence an administrator made for it. ``CACHE 1`` matters: with a
    larger cache each session hands out its own block of numbers and tokens would no
    longer increase across holders. The catalogs, not ``pg_sequences``: that view
    reads the sequence itself, which waits for a lock on it.
    """
    look = sql.SQL(
        "SELECT n.nspname, c.relname, c.relkind, s.seqcache,"
        " c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user),"
        " pg_get_userbyid(c.relowner), current_user::text,"
        " CASE c.relkind WHEN 'S' THEN has_sequence_privilege(c.oid, 'USAGE') END,"
        " (SELECT string_agg(DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC'"
        " ELSE pg_get_userbyid(a.grantee) END, ', ')"
        " FROM aclexplode(c.relacl) AS a"
        " WHERE a.grantee <> c.relowner AND a.privilege_type = 'UPDATE')"
        " FROM pg_class AS c"
        " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_sequence AS s ON s.seqrelid = c.oid"
        " WHERE c.oid = to_regclass({name})"
    ).format(name=sql.Literal(sequence))
    create = sql.SQL("CREATE SEQUENCE IF NOT EXISTS {} AS bigint MINVALUE 1 CACHE 1").format(
        sql.Identifier(*sequence.split("."))
    )
    return look, create
