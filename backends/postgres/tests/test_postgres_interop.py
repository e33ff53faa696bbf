"""A replica running the raw SQL of the Go seed and a multilock replica exclude each other."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

import multilock
from multilock import advisory_key


def test_keys_are_the_go_job_lock_keys() -> None:
    assert advisory_key("nightly-reindex") == 2151323058446577676
    assert advisory_key("a") == -5808556873153909620
    assert advisory_key("") == -3750763034362895579


def test_raw_sql_holder_excludes_multilock(
    make_url: Callable[..., str], admin: psycopg.Connection[Any]
) -> None:
    name = f"interop-{uuid.uuid4().hex}"
    key = advisory_key(name)
    row = admin.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
    assert row == (True,)
    try:
        with multilock.connect(make_url()) as locker:
            assert locker.try_acquire(name) is None
            assert locker.try_acquire_many([name])[name] is None
    finally:
        admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
    with multilock.connect(make_url()) as locker:
        lease = locker.try_acquire(name)
        assert lease is not None
        assert lease.key == key
        lease.release()


def test_multilock_holder_excludes_raw_sql(
    make_url: Callable[..., str], admin: psycopg.Connection[Any]
) -> None:
    name = f"interop-{uuid.uuid4().hex}"
    key = advisory_key(name)
    with multilock.connect(make_url()) as locker:
        lease = locker.try_acquire(name)
        assert lease is not None
        assert admin.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (False,)
        lease.release()
        assert admin.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
        admin.execute("SELECT pg_advisory_unlock(%s)", (key,))


def test_async_multilock_holder_excludes_raw_sql(
    make_url: Callable[..., str], admin: psycopg.Connection[Any]
) -> None:
    name = f"interop-{uuid.uuid4().hex}"
    key = advisory_key(name)

    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            lease = await locker.try_acquire(name)
            assert lease is not None
            got = admin.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            assert got == (False,)
            await lease.release()

    asyncio.run(main())
    assert admin.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
    admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
