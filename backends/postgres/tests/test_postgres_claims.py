"""Tick claims on PostgreSQL: a table made on first use, one statement per batch, and a
clear error for a role that may not make or write the table."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

import multilock
from multilock.errors import ClaimsUnavailable, InvalidOption
from multilock_postgres import PostgresLocker

from .test_postgres_roundtrips import _round_trips

FIRE = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
FIRE_US = 1767236400 * 1_000_000


@pytest.fixture
def table(admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A claims table name of this test alone, dropped afterwards."""
    name = f"mlpg_claims_{uuid.uuid4().hex[:12]}"
    yield name
    admin.execute(f"DROP TABLE IF EXISTS {name}")


def _connect(url: str) -> PostgresLocker:
    locker = multilock.connect(url)
    assert isinstance(locker, PostgresLocker)
    return locker


def _url(postgres_url: str, table: str, role: str | None = None) -> str:
    base = postgres_url if role is None else f"postgresql://{role}@{postgres_url.split('@', 1)[1]}"
    return f"{base}{'&' if '?' in base else '?'}claims_table={table}"


def test_the_table_is_made_on_first_use_and_holds_the_marks(
    postgres_url: str, table: str, admin: psycopg.Connection[Any]
) -> None:
    assert admin.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,)
    with _connect(_url(postgres_url, table)) as locker:
        assert locker.claim_ticks({"a": FIRE, "b": FIRE}) == {"a": True, "b": True}
        assert locker.claim_tick("a", FIRE) is False
    rows = admin.execute(f"SELECT name, fire FROM {table} ORDER BY name").fetchall()
    assert rows == [("a", FIRE_US), ("b", FIRE_US)]


def test_a_role_that_may_not_create_the_table_gets_a_clear_error_then_works(
    postgres_url: str, table: str, admin: psycopg.Connection[Any], other_role: str
) -> None:
    url = _url(postgres_url, table, other_role)
    with _connect(url) as locker:
        with pytest.raises(ClaimsUnavailable, match="may not create") as info:
            locker.claim_tick("a", FIRE)
        message = str(info.value)
        assert f"CREATE TABLE IF NOT EXISTS {table}" in message
        assert f"GRANT SELECT, INSERT, UPDATE ON {table} TO <role>" in message
        # The advisory-lock path is untouched.
        lease = locker.try_acquire(f"claims-{uuid.uuid4().hex}")
        assert lease is not None
        lease.release()
    admin.execute(
        f"CREATE TABLE {table} (name text PRIMARY KEY, fire bigint NOT NULL,"
        " claimed_at timestamptz NOT NULL DEFAULT now())"
    )
    with _connect(url) as locker, pytest.raises(ClaimsUnavailable, match="read and write"):
        locker.claim_tick("a", FIRE)
    admin.execute(f"GRANT SELECT, INSERT, UPDATE ON {table} TO {other_role}")
    with _connect(url) as locker:
        assert locker.claim_tick("a", FIRE) is True
        assert locker.claim_tick("a", FIRE) is False


def test_a_batch_of_1000_claims_is_one_round_trip(postgres_url: str, table: str) -> None:
    names = [f"job-{i}" for i in range(1000)]
    with _connect(_url(postgres_url, table)) as locker:
        assert locker.claim_tick("warm-up", FIRE) is True  # connects, makes the table
        with _round_trips(locker) as trips:
            won = locker.claim_ticks(dict.fromkeys(names, FIRE))
        assert list(won) == names
        assert all(won.values())
        assert trips == [1]
        with _round_trips(locker) as trips:
            again = locker.claim_ticks(dict.fromkeys(names, FIRE))
        assert not any(again.values())
        assert trips == [1]


def test_a_bad_table_name_is_refused(postgres_url: str) -> None:
    with pytest.raises(InvalidOption, match="claims_table"):
        multilock.connect(_url(postgres_url, "Bad;Name"))
