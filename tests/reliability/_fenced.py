"""The fenced resource of the partition tests: a PostgreSQL table that takes a write
only with a fencing token at least as large as the last one it took (Kleppmann's
fence), and a log of every attempt in the order the server applied them.

Writers call ``SELECT fenced_write(name, writer, token)``: one statement, so that a
holder needs nothing but a connection. Concurrent writes of one name queue on its row
lock and log their attempt while holding it, so the log's order is the order in which
the resource saw them.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

__all__ = ["Attempt", "Verdict", "history", "install", "judge"]

_SETUP = """
CREATE TABLE IF NOT EXISTS fenced_resource (
    name text PRIMARY KEY, token bigint NOT NULL, writer text NOT NULL
);
CREATE TABLE IF NOT EXISTS fenced_log (
    seq bigserial PRIMARY KEY, name text NOT NULL, writer text NOT NULL,
    token bigint NOT NULL, accepted boolean NOT NULL, at timestamptz DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION fenced_write(p_name text, p_writer text, p_token bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE ok boolean;
BEGIN
    INSERT INTO fenced_resource AS r VALUES (p_name, p_token, p_writer)
    ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, writer = EXCLUDED.writer
    WHERE r.token <= EXCLUDED.token;
    ok := FOUND;
    INSERT INTO fenced_log (name, writer, token, accepted) VALUES (p_name, p_writer, p_token, ok);
    RETURN ok;
END $$;
"""


def install(conninfo: str) -> None:
    """Create the resource, its log and ``fenced_write`` (idempotent)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(_SETUP)


@dataclass(frozen=True)
class Attempt:
    """One write attempt, as the resource logged it."""

    seq: int
    writer: str
    token: int
    accepted: bool
    at: float
    """Server time (epoch seconds)."""


def history(conninfo: str, name: str) -> list[Attempt]:
    """Every attempt on ``name``, in the order the resource applied them."""
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT seq, writer, token, accepted, extract(epoch FROM at)::float8"
            " FROM fenced_log WHERE name = %s ORDER BY seq",
            (name,),
        ).fetchall()
    return [Attempt(*row) for row in rows]


@dataclass(frozen=True)
class Verdict:
    """What the fence did with a stale writer once a new one wrote."""

    stale_accepted_after: int
    """Stale writes that landed after the new writer's first write: must be 0."""
    stale_rejected_after: int
    """Stale writes refused after it: the fence at work."""
    stale_accepted_before: int
    last_stale_write: float | None
    """When the stale writer's last accepted write landed (server time)."""
    first_new_write: float


def judge(attempts: list[Attempt], stale: str, new: str) -> Verdict:
    """Judge ``attempts`` (see :func:`history`): the stale writer ``stale`` against the
    first accepted write of ``new``."""
    first = next(a for a in attempts if a.writer == new and a.accepted)
    before = [a for a in attempts if a.writer == stale and a.seq < first.seq and a.accepted]
    after = [a for a in attempts if a.writer == stale and a.seq > first.seq]
    return Verdict(
        stale_accepted_after=sum(1 for a in after if a.accepted),
        stale_rejected_after=sum(1 for a in after if not a.accepted),
        stale_accepted_before=len(before),
        last_stale_write=before[-1].at if before else None,
        first_new_write=first.at,
    )
