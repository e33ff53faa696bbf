"""The SQL a locker sends: each acquire and release is one statement, one round trip.

Keys are made of ``a-z 0-9 _ - . : / #`` only (see ``_keys``), so they are written
into the statements as literals, with nothing to escape. A batch is one ``SELECT
CONCAT(...)`` of a character per key -- ``1`` granted, ``0`` held elsewhere, ``-``
an error (``NULL``) -- evaluated left to right: one row, one column to decode
however many names.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FENCE_ROW",
    "UNLOCK_ALL",
    "VOLATILE_ENGINES",
    "FenceTable",
    "answers",
    "fenced_lock",
    "lock",
    "lock_many",
    "unlock",
    "unlock_many",
]

UNLOCK_ALL = "SELECT RELEASE_ALL_LOCKS()"
FENCE_ROW = 1  # the sequence table's one row
_GRANTED = "@multilock_granted"
_GET = "GET_LOCK('{}',0)"
_RELEASE = "RELEASE_LOCK('{}')"


def lock(key: str) -> str:
    """Take one key; the answer is ``1``, ``0`` or ``NULL``."""
    return f"SELECT GET_LOCK('{key}',0)"


def _each(call: str, keys: list[str]) -> str:
    """``IFNULL(call,'-')`` for each key, ``{}`` in ``call`` standing for the key."""
    return ",".join(f"IFNULL({call.format(key)},'-')" for key in keys)


def lock_many(keys: list[str]) -> str:
    """Take ``keys`` in order; the answer is one string, a character per key."""
    return f"SELECT CONCAT({_each(_GET, keys)})"


def fenced_lock(keys: list[str], table: FenceTable) -> str:
    """Take ``keys`` and, if any was granted, as many fencing tokens from the sequence
    table ``table``: three statements, one round trip (the connection allows
    multi-statements only when fencing is on). The last result is one row: the
    grants (a character per key), the last token handed out, and how many rows the
    UPDATE changed (1, or 0 when nothing was granted -- or the row is missing).

    The counter moves by the number of grants in one atomic UPDATE, so a batch's
    tokens are consecutive; ``LAST_INSERT_ID(expr)`` keeps the new value for this
    session alone. A try refused everywhere burns no token.
    """
    count = f"(CHAR_LENGTH({_GRANTED}) - CHAR_LENGTH(REPLACE({_GRANTED}, '1', '')))"
    return (
        f"SELECT CONCAT({_each(_GET, keys)}) INTO {_GRANTED};"
        f" UPDATE {table.quoted} SET value = LAST_INSERT_ID(value + {count})"
        f" WHERE id = {FENCE_ROW} AND LOCATE('1', {_GRANTED}) > 0;"
        f" SELECT {_GRANTED}, LAST_INSERT_ID(), ROW_COUNT()"
    )


def unlock(key: str) -> str:
    """Release one key; the answer is ``1`` (freed), ``0`` (not ours) or ``NULL`` (free)."""
    return f"SELECT RELEASE_LOCK('{key}')"


def unlock_many(keys: list[str]) -> str:
    """Release ``keys``; the answer is one string, a character per key (``1``: freed)."""
    return f"SELECT CONCAT({_each(_RELEASE, keys)})"


def answers(text: object, count: int) -> list[bool]:
    """Read a batch's answer: ``True`` for each key whose character is ``1``."""
    if isinstance(text, bytes):
        text = text.decode("ascii")
    if not isinstance(text, str) or len(text) != count:
        raise ValueError(f"expected {count} answers, got {text!r}")
    return [c == "1" for c in text]


@dataclass(frozen=True)
class FenceTable:
    """The sequence table fencing tokens come from: ``database.name`` or ``name`` (in the
    URL's database), each part made of letters, digits, ``_`` and ``$`` only."""

    schema: str | None
    name: str

    @property
    def quoted(self) -> str:
        """The table as SQL names it, each part in backquotes."""
        return ".".join(f"`{part}`" for part in (self.schema, self.name) if part is not None)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    def engine(self) -> str:
        """The table's storage engine, or no row when it does not exist."""
        schema = f"'{self.schema}'" if self.schema else "DATABASE()"
        return (
            "SELECT ENGINE FROM information_schema.TABLES"
            f" WHERE TABLE_SCHEMA = {schema} AND TABLE_NAME = '{self.name}'"
        )

    def create(self) -> str:
        """Make the table, if missing. InnoDB: the counter must survive a crash."""
        return (
            f"CREATE TABLE IF NOT EXISTS {self.quoted} (id TINYINT UNSIGNED NOT NULL PRIMARY KEY,"
            " value BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
        )

    def seed(self) -> str:
        """Add the counter's row, if missing."""
        return f"INSERT IGNORE INTO {self.quoted} (id, value) VALUES ({FENCE_ROW}, 0)"

    def row(self) -> str:
        """The counter's row, if there."""
        return f"SELECT value FROM {self.quoted} WHERE id = {FENCE_ROW}"

    def may_update(self) -> str:
        """An UPDATE that changes nothing: refused at once if this user may not update."""
        return f"UPDATE {self.quoted} SET value = value WHERE 1 = 0"


VOLATILE_ENGINES = frozenset({"MEMORY", "BLACKHOLE", "HEAP"})
"""Engines that lose or never keep the counter: tokens would start again from 1."""
