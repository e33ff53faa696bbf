"""``locks()`` lists the advisory locks held in the database, by any session."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

import multilock
from multilock import Capability, advisory_key
from multilock_postgres import AsyncPostgresLocker, PostgresLocker


def test_locks_lists_own_and_foreign_locks(
    make_url: Callable[..., str], app_name: str, admin: psycopg.Connection[Any]
) -> None:
    mine, foreign, unknown = (f"intro-{uuid.uuid4().hex}" for _ in range(3))
    admin.execute("SELECT pg_advisory_lock(%s)", (advisory_key(foreign),))
    admin.execute("SELECT pg_advisory_lock(%s)", (advisory_key(unknown),))
    admin_pid = admin.info.backend_pid
    try:
        with multilock.connect(make_url()) as locker:
            assert isinstance(locker, PostgresLocker)
            assert Capability.INTROSPECTION in locker.capabilities
            before = datetime.now(UTC)
            lease = locker.try_acquire(mine)
            assert lease is not None
            assert locker.try_acquire(foreign) is None  # seen, so it can be named
            infos = {info.key: info for info in locker.locks()}

            own = infos[advisory_key(mine)]
            assert own.name == mine
            assert own.details["pid"] == locker.session_pid
            assert own.details["application_name"] == app_name
            assert own.details["since_is"] == "acquired"
            assert own.since is not None
            assert own.since >= before
            assert app_name in (own.holder or "")

            other = infos[advisory_key(foreign)]
            assert other.name == foreign
            assert other.details["pid"] == admin_pid
            assert other.details["since_is"] == "backend_start"
            assert other.since is not None
            assert other.since <= datetime.now(UTC)

            assert infos[advisory_key(unknown)].name is None  # a one-way hash, never seen
            lease.release()
            assert advisory_key(mine) not in {info.key for info in locker.locks()}
    finally:
        admin.execute("SELECT pg_advisory_unlock_all()")


def test_async_locks(make_url: Callable[..., str]) -> None:
    name = f"intro-{uuid.uuid4().hex}"

    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            assert isinstance(locker, AsyncPostgresLocker)
            lease = await locker.try_acquire(name)
            assert lease is not None
            infos = await locker.locks()
            assert [info.name for info in infos if info.key == advisory_key(name)] == [name]
            await lease.release()

    asyncio.run(main())
