"""URL options, libpq pass-through, error mapping and password masking."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import multilock
from multilock import Capability
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, InvalidOption
from multilock.testing import TcpProxy
from multilock_postgres import PostgresLocker, backend
from multilock_postgres._config import parse_settings

SECRET = "s3cr3t-Pa55word"


def _with_password(url: str) -> str:
    scheme, rest = url.split("://", 1)
    userinfo, _, hostpart = rest.rpartition("@")
    user = userinfo.split(":", 1)[0] if userinfo else "postgres"
    return f"{scheme}://{user}:{SECRET}@{hostpart}"


def test_unknown_option_is_an_error_naming_it(postgres_url: str) -> None:
    with pytest.raises(InvalidOption, match="'colour'") as info:
        multilock.connect(postgres_url, colour="blue")
    assert "health_interval" in str(info.value)  # the known options are listed


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("health_interval", "soon", "health_interval"),
        ("connect_timeout", "-1", "connect_timeout"),
        ("fencing", "perhaps", "fencing"),
        ("fencing_sequence", "Robert'); DROP TABLE x;--", "fencing_sequence"),
    ],
)
def test_bad_option_values_are_errors(
    postgres_url: str, option: str, value: str, problem: str
) -> None:
    with pytest.raises(InvalidOption, match=problem):
        multilock.connect(postgres_url, **{option: value})


def test_libpq_parameters_pass_through(make_url: Callable[..., str]) -> None:
    url = make_url(sslmode="disable", target_session_attrs="any", keepalives_idle=7)
    settings = parse_settings(LockURL.parse(url))
    assert "sslmode=disable" in settings.conninfo
    assert "keepalives_idle=7" in settings.conninfo
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(f"opts-{uuid.uuid4().hex}")
        assert lease is not None
        lease.release()


def test_several_hosts_default_to_the_primary() -> None:
    settings = parse_settings(LockURL.parse("postgresql://app@db1:5432,db2:5433/app"))
    assert "host=db1,db2" in settings.conninfo
    assert "port=5432,5433" in settings.conninfo
    assert "target_session_attrs=read-write" in settings.conninfo


def test_default_application_name_names_host_and_pid(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    with multilock.connect(postgres_url) as locker:
        assert isinstance(locker, PostgresLocker)
        lease = locker.try_acquire(f"opts-{uuid.uuid4().hex}")
        assert lease is not None
        row = admin.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (locker.session_pid,)
        ).fetchone()
        assert row is not None
        assert row[0].startswith("multilock ")
        assert f"pid {os.getpid()}" in row[0]
        lease.release()


def test_ttl_is_accepted_and_ignored(make_url: Callable[..., str]) -> None:
    with multilock.connect(make_url(ttl="2s")) as locker:
        assert Capability.TTL not in locker.capabilities
        assert Capability.SESSION in locker.capabilities
        lease = locker.try_acquire(f"opts-{uuid.uuid4().hex}", ttl=0.5)
        assert lease is not None
        assert lease.expires_at is None
        lease.release()


def test_password_is_masked_everywhere(postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    url = _with_password(postgres_url)
    with multilock.connect(url) as locker:
        assert SECRET not in repr(locker)
        assert SECRET not in locker.url
    missing_db = url.rsplit("/", 1)[0] + f"/no_such_db_{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.DEBUG)
    with multilock.connect(missing_db) as locker, pytest.raises(BackendUnavailable) as info:
        locker.try_acquire("x")
    assert "no_such_db" in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(parse_settings(LockURL.parse(url)))
    assert SECRET not in parse_settings(LockURL.parse(url)).conninfo
    assert all(SECRET not in record.getMessage() for record in caplog.records)


def test_password_given_as_an_option_is_masked_too(postgres_url: str) -> None:
    url = postgres_url.rsplit("/", 1)[0] + f"/no_such_db_{uuid.uuid4().hex[:8]}"
    url += f"?password={SECRET}"
    with multilock.connect(url) as locker, pytest.raises(BackendUnavailable) as info:
        locker.try_acquire("x")
    assert SECRET not in repr(locker)
    assert SECRET not in str(info.value)
    assert SECRET not in parse_settings(LockURL.parse(url)).conninfo


def test_connect_timeout_bounds_a_server_that_never_answers(
    frozen_proxy: TcpProxy, postgres_url: str
) -> None:
    frozen_proxy.freeze()  # TCP connects, the startup handshake never completes
    path = LockURL.parse(postgres_url).path
    url = f"postgresql://postgres@127.0.0.1:{frozen_proxy.port}{path}?connect_timeout=2"
    started = time.monotonic()
    with multilock.connect(url) as locker, pytest.raises(BackendUnavailable):
        locker.try_acquire("x")
    assert time.monotonic() - started < 4.0


def test_unreachable_server_raises_promptly(postgres_url: str) -> None:
    hooks = backend.conformance
    url = hooks.unreachable_url(LockURL.parse(_with_password(postgres_url)))
    assert SECRET in url  # the same URL, on a closed port
    assert ":1/" in url
    started = time.monotonic()
    with multilock.connect(url) as locker, pytest.raises(BackendUnavailable) as info:
        locker.try_acquire("x")
    assert SECRET not in str(info.value)

    async def main() -> None:
        async with multilock.connect_async(url) as alocker:
            with pytest.raises(BackendUnavailable):
                await alocker.try_acquire("x")

    asyncio.run(main())
    assert time.monotonic() - started < 5.0


def test_break_lease_hook_terminates_the_session(make_url: Callable[..., str]) -> None:
    url = make_url()
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(f"opts-{uuid.uuid4().hex}")
        assert lease is not None
        backend.conformance.break_lease(LockURL.parse(url), locker, lease)
        with multilock.connect(url) as other:
            stolen = other.try_acquire(lease.name)
            assert stolen is not None
            stolen.release()
