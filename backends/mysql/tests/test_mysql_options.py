"""URL options: validated with one clear line, passwords never shown."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import quote

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import InvalidOption, InvalidURL, MultilockError
from multilock.testing._servers.mysql import PrivateServer
from multilock_mysql import AsyncMySQLLocker, MySQLLocker
from multilock_mysql._config import default_program_name, parse_settings

from .conftest import with_options


def test_unknown_option_is_named(mysql_url: str) -> None:
    with pytest.raises(InvalidOption, match=r"unknown option 'helth_interval'.*health_interval"):
        multilock.connect(with_options(mysql_url, helth_interval="1s"))


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("health_interval", "0"),
        ("health_timeout", "soon"),
        ("connect_timeout", "30d"),
        ("fencing", "maybe"),
        ("fencing_table", "a-b"),
        ("fencing_table", "x.y.z"),
    ],
)
def test_bad_values_are_refused(mysql_url: str, option: str, value: str) -> None:
    with pytest.raises(InvalidOption, match=option):
        multilock.connect(with_options(mysql_url, **{option: value}))


def test_one_server_only() -> None:
    with pytest.raises(InvalidURL, match="names 2 hosts"):
        multilock.connect("mysql://app@db1:3306,db2:3306/app")


def test_mariadb_scheme_and_defaults(mysql_url: str) -> None:
    url = "mariadb://" + mysql_url.split("://", 1)[1]
    with multilock.connect(url, ttl="5s") as locker:
        assert isinstance(locker, MySQLLocker)
        lease = locker.try_acquire(f"options-{uuid.uuid4().hex}", ttl="1s")
        assert lease is not None
        assert lease.expires_at is None  # session-bound: the ttl is accepted and ignored
        lease.extend()
        lease.release()
    settings = parse_settings(LockURL.parse("mysql://db"))
    assert (settings.host, settings.port, settings.user, settings.database) == (
        "db",
        3306,
        None,
        None,
    )
    assert settings.program_name == default_program_name()
    assert settings.program_name.startswith("multilock ")
    assert (settings.health_interval, settings.health_timeout, settings.connect_timeout) == (
        5.0,
        1.0,
        5.0,
    )


@pytest.mark.parametrize("form", ["netloc", "query"])
def test_password_is_never_shown(mysql_url: str, form: str) -> None:
    secret = f"Sw0rd-{uuid.uuid4().hex}"
    base = LockURL.parse(mysql_url)
    host = f"{base.host}:{base.port or 3306}"
    if form == "netloc":
        url = f"mysql://nobody-{secret[:4]}:{quote(secret)}@{host}/test?connect_timeout=2s"
    else:
        url = f"mysql://nobody@{host}/test?connect_timeout=2s&password={quote(secret)}"
    with multilock.connect(url) as locker:
        assert secret not in repr(locker)
        assert secret not in locker.url
        with pytest.raises(MultilockError) as caught:
            locker.try_acquire("x")
    assert secret not in str(caught.value)
    assert "Access denied" in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    assert secret not in repr(parse_settings(LockURL.parse(url)))


def test_unix_socket(private: PrivateServer) -> None:
    url = f"mysql://root@localhost/test?unix_socket={quote(str(private.root / 'sock'), safe='')}"

    async def main() -> None:
        async with multilock.connect_async(url) as locker:
            assert isinstance(locker, AsyncMySQLLocker)
            lease = await locker.try_acquire("over-the-socket")
            assert lease is not None
            await lease.release()

    asyncio.run(main())
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("over-the-socket")
        assert lease is not None
        lease.release()
