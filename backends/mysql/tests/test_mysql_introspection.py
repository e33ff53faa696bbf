"""``locks()`` from MariaDB's METADATA_LOCK_INFO, from the performance schema, or a
clear error where the server has neither -- never a partial list passed off as whole."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql
import pytest

import multilock
from multilock.errors import ConfigurationError
from multilock.testing._servers.mysql import PrivateServer, private_server
from multilock_mysql import AsyncMySQLLocker, MySQLLocker, lock_key

from .conftest import connect, query, with_options


def _check_listing(url: str, source: str, program: str | None) -> None:
    readable, hashed = f"intro-{uuid.uuid4().hex}", f"Intro {uuid.uuid4().hex}"
    other = connect(url)
    try:
        query(other, "SELECT GET_LOCK(%s, 0)", f"raw-{readable}")  # not multilock's
        with multilock.connect(url) as locker, multilock.connect(url) as viewer:
            assert isinstance(locker, MySQLLocker)
            assert isinstance(viewer, MySQLLocker)
            leases = [locker.try_acquire(name) for name in (readable, hashed)]
            assert all(leases)
            mine = {info.key: info for info in locker.locks()}
            seen = {info.key: info for info in viewer.locks()}
            for name in (readable, hashed):
                info = mine[lock_key(name)]
                assert info.name == name
                assert info.since is not None  # own lease: when it was granted
                assert info.details["connection_id"] == locker.connection_id
                assert info.details["source"] == source
                assert info.holder is not None
                assert f"connection {locker.connection_id}" in info.holder
                if program is not None:
                    assert info.details["program_name"] == program
            # Another locker names a readable key by itself, a hashed one it never saw not.
            assert seen[lock_key(readable)].name == readable
            assert seen[lock_key(hashed)].name is None
            assert seen[lock_key(hashed)].since is None
            raw = seen[f"raw-{readable}"]
            assert raw.name == f"raw-{readable}"  # a readable key is its name
            assert [(raw.details["connection_id"],)] == query(other, "SELECT CONNECTION_ID()")
            for lease in leases:
                assert lease is not None
                lease.release()
            assert lock_key(readable) not in {info.key for info in viewer.locks()}
    finally:
        other.close()


def test_locks_from_metadata_lock_info(make_url: Callable[..., str], mysql_url: str) -> None:
    """The test server: MariaDB with the plugin that scripts/test installs."""
    rows = query(connect(mysql_url), "SELECT @@performance_schema")
    if rows[0][0]:
        pytest.skip("the test server has the performance schema on: covered below")
    _check_listing(make_url(), "information_schema.METADATA_LOCK_INFO", None)


def test_locks_from_the_performance_schema(
    request: pytest.FixtureRequest, tmp_path: Path, program_name: str
) -> None:
    server = private_server(
        request,
        tmp_path,
        "--performance-schema=ON",
        "--performance-schema-instrument=wait/lock/metadata/sql/mdl=ON",
    )
    url = with_options(server.url, program_name=program_name)
    _check_listing(url, "performance_schema.metadata_locks", program_name)


def test_async_locks(make_url: Callable[..., str]) -> None:
    async def main() -> None:
        async with multilock.connect_async(make_url()) as locker:
            assert isinstance(locker, AsyncMySQLLocker)
            lease = await locker.try_acquire(f"intro-async-{uuid.uuid4().hex}")
            assert lease is not None
            found = {info.key: info for info in await locker.locks()}
            assert found[lease.key].name == lease.name
            assert found[lease.key].details["connection_id"] == locker.connection_id
            await lease.release()

    asyncio.run(main())


def test_without_a_source_locks_says_how_to_get_one(private: PrivateServer) -> None:
    """The private server: performance schema off, no plugin (MariaDB's defaults)."""
    admin: Any = pymysql.connect(host="127.0.0.1", port=private.port, user="root")
    plugins = query(
        admin,
        "SELECT COUNT(*) FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'METADATA_LOCK_INFO'",
    )
    admin.close()
    assert plugins == [(0,)]
    with multilock.connect(private.url) as locker:
        lease = locker.try_acquire("no-source")
        assert lease is not None
        with pytest.raises(ConfigurationError, match="INSTALL SONAME 'metadata_lock_info'"):
            locker.locks()  # type: ignore[attr-defined]
        lease.release()
