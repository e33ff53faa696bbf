"""Fencing tokens from a sequence, taken in the acquire's round trip, only when enabled."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import multilock
from multilock import Capability
from multilock.errors import ConfigurationError
from multilock.testing import poll
from multilock_postgres import PostgresLocker


@pytest.fixture
def sequence(admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A fencing sequence of this test alone, dropped afterwards."""
    name = f"mlpg_fence_{uuid.uuid4().hex[:12]}"
    yield name
    admin.execute(f"DROP SEQUENCE IF EXISTS {name}")


def _last_value(admin: psycopg.Connection[Any], sequence: str) -> int | None:
    row = admin.execute(f"SELECT last_value, is_called FROM {sequence}").fetchone()
    assert row is not None
    return int(row[0]) if row[1] else None


def test_no_fencing_by_default(make_url: Callable[..., str]) -> None:
    with multilock.connect(make_url()) as locker:
        assert Capability.FENCING not in locker.capabilities
        lease = locker.try_acquire(f"fence-{uuid.uuid4().hex}")
        assert lease is not None
        assert lease.fencing_token is None
        lease.release()


def test_tokens_increase_across_holders_and_processes(
    make_url: Callable[..., str], sequence: str
) -> None:
    url = make_url(fencing=True, fencing_sequence=sequence)
    name = f"fence-{uuid.uuid4().hex}"
    tokens: list[int] = []
    child = (
        "import multilock, sys\n"
        "with multilock.connect(sys.argv[1]) as locker:\n"
        "    lease = locker.try_acquire(sys.argv[2])\n"
        "    print(lease.fencing_token)\n"
        "    lease.release()\n"
    )
    with multilock.connect(url) as one, multilock.connect(url) as two:
        assert Capability.FENCING in one.capabilities
        for round_ in range(6):
            locker = one if round_ % 2 else two
            lease = locker.try_acquire(name)
            assert lease is not None
            assert lease.fencing_token is not None
            tokens.append(lease.fencing_token)
            lease.release()
            if round_ == 2:
                out = subprocess.run(
                    [sys.executable, "-c", child, url, name],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout
                tokens.append(int(out))
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


def test_async_tokens_and_batch_tokens_increase(
    make_url: Callable[..., str], sequence: str
) -> None:
    url = make_url(fencing=True, fencing_sequence=sequence)
    names = [f"fence-{uuid.uuid4().hex}" for _ in range(5)]

    async def main() -> list[int | None]:
        async with multilock.connect_async(url) as locker:
            batch = await locker.try_acquire_many(names)
            first = [lease.fencing_token for lease in batch.values() if lease]
            for lease in batch.values():
                assert lease is not None
                await lease.release()
            single = await locker.try_acquire(names[0])
            assert single is not None
            await single.release()
            return [*first, single.fencing_token]

    tokens = asyncio.run(main())
    assert len(tokens) == 6
    assert all(isinstance(token, int) for token in tokens)
    assert max(tokens[:5]) < tokens[5]  # type: ignore[type-var,operator]


def test_a_refused_try_burns_no_token(
    make_url: Callable[..., str], sequence: str, admin: psycopg.Connection[Any]
) -> None:
    url = make_url(fencing=True, fencing_sequence=sequence)
    name = f"fence-{uuid.uuid4().hex}"
    with multilock.connect(url) as holder, multilock.connect(url) as other:
        lease = holder.try_acquire(name)
        assert lease is not None
        before = _last_value(admin, sequence)
        assert before is not None
        assert before == lease.fencing_token
        for _ in range(5):
            assert other.try_acquire(name) is None
        assert other.try_acquire_many([name, name + "-free"])[name] is None
        assert _last_value(admin, sequence) == before + 1  # only the free name took one
        lease.release()


def test_a_sequence_with_a_cache_is_refused(
    make_url: Callable[..., str], sequence: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute(f"CREATE SEQUENCE {sequence} CACHE 20")
    url = make_url(fencing=True, fencing_sequence=sequence)
    with multilock.connect(url) as locker, pytest.raises(ConfigurationError, match="CACHE 1"):
        locker.try_acquire("x")


def _as_role(postgres_url: str, role: str, **options: str) -> str:
    host_part = postgres_url.split("@", 1)[1]
    query = "&".join(f"{key}={value}" for key, value in options.items())
    return f"postgresql://{role}@{host_part}?{query}"


def test_a_role_without_create_privilege_gets_a_clear_error_then_works_as_owner(
    postgres_url: str, sequence: str, admin: psycopg.Connection[Any], other_role: str
) -> None:
    url = _as_role(postgres_url, other_role, fencing="true", fencing_sequence=sequence)
    with multilock.connect(url) as locker:
        with pytest.raises(ConfigurationError, match="CREATE SEQUENCE") as info:
            locker.try_acquire("x")
        assert f"ALTER SEQUENCE {sequence} OWNER TO" in str(info.value)
    admin.execute(f"CREATE SEQUENCE {sequence} AS bigint CACHE 1")
    admin.execute(f"GRANT USAGE ON SEQUENCE {sequence} TO {other_role}")
    # USAGE is not enough: the owner (postgres) could rewind the tokens.
    with multilock.connect(url) as locker, pytest.raises(ConfigurationError) as info:
        locker.try_acquire("x")
    assert str(info.value).count("\n") == 0
    assert f"is owned by role 'postgres', not by '{other_role}'" in str(info.value)
    admin.execute(f"ALTER SEQUENCE {sequence} OWNER TO {other_role}")
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(f"fence-{uuid.uuid4().hex}")
        assert lease is not None
        assert lease.fencing_token == 1
        lease.release()


def test_a_sequence_of_another_role_is_refused_even_first_in_the_search_path(
    make_url: Callable[..., str], sequence: str, admin: psycopg.Connection[Any], other_role: str
) -> None:
    # The other role plants a sequence of the same name in a schema of its own that
    # comes first in the locker's search_path: it could setval it at will.
    schema = f"{other_role}_s"
    admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {other_role}")
    admin.execute(f"SET ROLE {other_role}")
    admin.execute(f"CREATE SEQUENCE {schema}.{sequence} AS bigint CACHE 1")
    admin.execute("RESET ROLE")
    admin.execute(f"CREATE SEQUENCE {sequence} AS bigint CACHE 1")  # ours, in public
    options = f"-c search_path={schema},public"
    url = make_url(fencing=True, fencing_sequence=sequence, options=options)
    with multilock.connect(url) as locker, pytest.raises(ConfigurationError) as info:
        locker.try_acquire("x")
    message = str(info.value)
    assert f"fencing sequence {schema}.{sequence} is owned by role '{other_role}'" in message
    # Named with its schema, ours is used whatever the search_path says.
    url = make_url(fencing=True, fencing_sequence=f"public.{sequence}", options=options)
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(f"fence-{uuid.uuid4().hex}")
        assert lease is not None
        assert lease.fencing_token == _last_value(admin, f"public.{sequence}") == 1
        lease.release()


def test_the_sequence_is_used_by_its_schema_qualified_name(
    make_url: Callable[..., str], sequence: str, admin: psycopg.Connection[Any]
) -> None:
    with multilock.connect(make_url(fencing=True, fencing_sequence=sequence)) as locker:
        lease = locker.try_acquire(f"fence-{uuid.uuid4().hex}")
        assert lease is not None
        lease.release()
        assert isinstance(locker, PostgresLocker)
        assert f'nextval(\'"public"."{sequence}"\')' in locker._statements.lock


def test_a_sequence_another_role_may_update_is_refused(
    make_url: Callable[..., str], sequence: str, admin: psycopg.Connection[Any], other_role: str
) -> None:
    admin.execute(f"CREATE SEQUENCE {sequence} AS bigint CACHE 1")
    admin.execute(f"GRANT UPDATE ON SEQUENCE {sequence} TO {other_role}")
    url = make_url(fencing=True, fencing_sequence=sequence)
    with multilock.connect(url) as locker, pytest.raises(ConfigurationError, match=other_role):
        locker.try_acquire("x")
    admin.execute(f"REVOKE UPDATE ON SEQUENCE {sequence} FROM {other_role}")
    with multilock.connect(make_url(fencing=True, fencing_sequence=sequence)) as locker:
        lease = locker.try_acquire(f"fence-{uuid.uuid4().hex}")
        assert lease is not None
        lease.release()


def test_a_table_of_that_name_is_refused(
    make_url: Callable[..., str], sequence: str, admin: psycopg.Connection[Any]
) -> None:
    admin.execute(f"CREATE TABLE {sequence} (x int)")
    try:
        url = make_url(fencing=True, fencing_sequence=sequence)
        with multilock.connect(url) as locker, pytest.raises(ConfigurationError, match="not a seq"):
            locker.try_acquire("x")
    finally:
        admin.execute(f"DROP TABLE {sequence}")


def test_a_sequence_made_by_another_session_meanwhile_is_used(
    make_url: Callable[..., str], sequence: str, admin: psycopg.Connection[Any]
) -> None:
    """Replicas starting together on a fresh database all find the sequence missing and
    create it: ``CREATE SEQUENCE IF NOT EXISTS`` does not see another session's creation
    until it commits, then fails on the catalog's unique index. The locker looks again."""
    url = make_url(fencing=True, fencing_sequence=sequence, lock_timeout="5s", health_timeout="10s")
    creator = psycopg.connect(admin.info.dsn)  # the other replica, in the middle of its creation
    creator.execute(f"CREATE SEQUENCE {sequence} AS bigint MINVALUE 1 CACHE 1")
    tokens: list[int | None] = []
    with multilock.connect(url) as locker:

        def acquire() -> None:
            lease = locker.try_acquire(f"fence-{uuid.uuid4().hex}")
            assert lease is not None
            tokens.append(lease.fencing_token)
            lease.release()

        worker = threading.Thread(target=acquire)
        worker.start()

        def waiting() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE %s",
                (f"CREATE SEQUENCE%{sequence}%",),
            ).fetchone()
            return bool(row and row[0])

        poll("the locker's CREATE waiting for the other one's", waiting, 10.0)
        creator.commit()
        creator.close()
        worker.join(10)
    assert tokens == [1]
