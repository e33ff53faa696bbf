"""Fencing tokens from a sequence table: made when missing, strictly increasing across
holders and sessions, refused with a clear error where the table cannot serve."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pymysql
import pytest

import multilock
from multilock.errors import ConfigurationError, InvalidOption
from multilock.testing._servers.mysql import PrivateServer

from .conftest import query, with_options


def _admin(server: PrivateServer) -> Any:
    return pymysql.connect(
        host="127.0.0.1", port=server.port, user="root", database="test", autocommit=True
    )


def _table() -> str:
    return f"fence_{uuid.uuid4().hex[:12]}"


def test_table_is_made_and_tokens_increase_across_lockers(private: PrivateServer) -> None:
    table = _table()
    url = with_options(private.url, fencing=True, fencing_table=table)
    name = f"fenced-{uuid.uuid4().hex}"
    tokens: list[int] = []
    with multilock.connect(url) as one, multilock.connect(url) as two:
        for locker in (one, two, one, two):
            lease = locker.try_acquire(name)
            assert lease is not None
            assert isinstance(lease.fencing_token, int)
            tokens.append(lease.fencing_token)
            assert two.try_acquire(name) is None  # a refused try burns no token
            lease.release()
    assert tokens == sorted(set(tokens))
    assert tokens == list(range(tokens[0], tokens[0] + 4))
    admin = _admin(private)
    assert query(
        admin, f"SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_NAME = '{table}'"
    ) == [("InnoDB",)]
    assert query(admin, f"SELECT id, value FROM {table}") == [(1, tokens[-1])]
    admin.close()


def test_async_tokens_continue_the_same_sequence(private: PrivateServer) -> None:
    url = with_options(private.url, fencing=True, fencing_table=_table())
    name = f"fenced-{uuid.uuid4().hex}"
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(name)
        assert lease is not None
        first = lease.fencing_token
        lease.release()

    async def main() -> int | None:
        async with multilock.connect_async(url) as locker:
            got = await locker.try_acquire_many([name, name + "-2"])
            tokens = [lease.fencing_token for lease in got.values() if lease is not None]
            assert len(tokens) == 2
            return tokens[0]

    assert first is not None
    assert asyncio.run(main()) == first + 1


def test_a_volatile_table_is_refused(private: PrivateServer) -> None:
    table = _table()
    admin = _admin(private)
    query(
        admin,
        f"CREATE TABLE {table} (id TINYINT UNSIGNED PRIMARY KEY, value BIGINT UNSIGNED)"
        " ENGINE=MEMORY",
    )
    query(admin, f"INSERT INTO {table} VALUES (1, 0)")
    admin.close()
    url = with_options(private.url, fencing=True, fencing_table=table)
    with multilock.connect(url) as locker, pytest.raises(ConfigurationError, match="MEMORY engine"):
        locker.try_acquire("x")


def test_a_table_without_its_row_is_refused(private: PrivateServer) -> None:
    table = _table()
    url = with_options(private.url, fencing=True, fencing_table=table)
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("made")
        assert lease is not None
        lease.release()
    admin = _admin(private)
    query(admin, f"DELETE FROM {table}")
    admin.close()
    # A new session refuses to start over; a live one refuses to hand out a token.
    with multilock.connect(url) as locker, pytest.raises(ConfigurationError, match="no row id=1"):
        locker.try_acquire("again")


def test_a_lost_row_under_a_live_session_hands_out_nothing(private: PrivateServer) -> None:
    table = _table()
    url = with_options(private.url, fencing=True, fencing_table=table)
    with multilock.connect(url) as locker, multilock.connect(private.url) as other:
        assert locker.try_acquire("warm") is not None
        admin = _admin(private)
        query(admin, f"DELETE FROM {table}")
        admin.close()
        with pytest.raises(ConfigurationError, match="lost its row"):
            locker.try_acquire("refused")
        # The lock the statement took was released, not leaked.
        lease = other.try_acquire("refused")
        assert lease is not None
        lease.release()


def test_a_user_who_may_not_create_the_table_is_told_what_to_grant(
    private: PrivateServer,
) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    admin = _admin(private)
    query(admin, f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 's3cret-{user}'")
    query(admin, f"GRANT SELECT ON test.* TO '{user}'@'127.0.0.1'")
    admin.close()
    url = f"mysql://{user}:s3cret-{user}@127.0.0.1:{private.port}/test"
    fenced = with_options(url, fencing=True, fencing_table=_table())
    with (
        multilock.connect(fenced) as locker,
        pytest.raises(ConfigurationError, match="Have an administrator run") as caught,
    ):
        locker.try_acquire("x")
    assert f"s3cret-{user}" not in str(caught.value)
    # Without fencing the same user needs no privilege at all.
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("x")
        assert lease is not None
        lease.release()


def test_fencing_needs_a_database(private: PrivateServer) -> None:
    with pytest.raises(InvalidOption, match="needs a database"):
        multilock.connect(f"mysql://root@127.0.0.1:{private.port}?fencing=true")
    with multilock.connect(
        f"mysql://root@127.0.0.1:{private.port}?fencing=true&fencing_table=test.{_table()}"
    ) as locker:
        lease = locker.try_acquire("qualified")
        assert lease is not None
        assert lease.fencing_token == 1
        lease.release()
