"""TLS to a private MariaDB started with ``--ssl-ca``/``--ssl-cert``/``--ssl-key`` from a
throwaway CA made by ``scripts/test-ca``: ``ssl_mode`` (the MySQL client's names) is
honoured, and a URL that names a CA, certificate or key verifies the server fully.

The server presents a certificate for localhost/127.0.0.1, or (swapped and reloaded with
``FLUSH SSL``) one of the same CA for another name; user ``multilock-client`` may only
log in with the test client certificate. A server without TLS is refused, before any
credential goes out, wherever the URL insists on TLS: both drivers would go on in clear.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, InvalidOption, MultilockError
from multilock.testing._servers import checks
from multilock.testing._servers.mysql import PrivateServer, private_server
from multilock_mysql import AsyncMySQLLocker, MySQLLease
from multilock_mysql._config import parse_settings

from .conftest import with_options

PROMPT = 3.0  # what a refused connection may take on a loaded machine
CLIENT = "multilock-client"  # the user that needs the test client certificate
KEY_PASSWORD = "K3y-pa55phrase"
PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "mysql.md"


class TLSServer:
    """The module's private server with TLS on, and the files it presents."""

    def __init__(self, server: PrivateServer, files: Path) -> None:
        self.server = server
        self.files = files

    def url(self, host: str = "localhost", user: str = "root", **options: Any) -> str:
        """A URL of this server with ``options``."""
        url = f"mysql://{user}@{host}:{self.server.port}/test?connect_timeout=2"
        return with_options(url, **options)

    def present(self, ca: Path, name: str) -> None:
        """Present the certificate ``name`` of ``ca`` from now on (``FLUSH SSL``)."""
        for suffix in ("crt", "key"):
            shutil.copyfile(ca / f"{name}.{suffix}", self.files / f"active.{suffix}")
        admin = pymysql.connect(host="127.0.0.1", port=self.server.port, user="root")
        try:
            with admin.cursor() as cursor:
                cursor.execute("FLUSH SSL")
        finally:
            admin.close()


@pytest.fixture(scope="module")
def tls_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, test_ca: Path
) -> TLSServer:
    """A private server with TLS on (see the module's docstring)."""
    root = tmp_path_factory.mktemp("mariadb-tls")
    files = root / "tls"
    files.mkdir()
    shutil.copyfile(test_ca / "ca.crt", files / "ca.crt")
    for suffix in ("crt", "key"):
        shutil.copyfile(test_ca / f"server.{suffix}", files / f"active.{suffix}")
    server = private_server(
        request,
        root,
        f"--ssl-ca={files / 'ca.crt'}",
        f"--ssl-cert={files / 'active.crt'}",
        f"--ssl-key={files / 'active.key'}",
    )
    admin = pymysql.connect(host="127.0.0.1", port=server.port, user="root")
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE USER '{CLIENT}'@'%' REQUIRE SUBJECT '/CN={CLIENT}'")
            cursor.execute(f"GRANT ALL ON test.* TO '{CLIENT}'@'%'")
    finally:
        admin.close()
    return TLSServer(server, files)


@pytest.fixture
def wrong_name(tls_server: TLSServer, test_ca: Path) -> Iterator[TLSServer]:
    """The server presenting, for the test, a certificate of the test CA for another name."""
    tls_server.present(test_ca, "wrong")
    yield tls_server
    tls_server.present(test_ca, "server")


def works(url: str) -> None:
    """A lock can be taken, is exclusive and is released over ``url``."""
    checks.works(url, MySQLLease)


def refused(url: str, api: str = "sync") -> MultilockError:
    """The error of an acquire over ``url``: one line, within ``PROMPT``."""
    return checks.refused(url, api, within=PROMPT, error=MultilockError)


def test_a_verified_server_works_by_name_and_by_address(
    tls_server: TLSServer, test_ca: Path
) -> None:
    for host in ("localhost", "127.0.0.1"):  # the certificate names both
        works(tls_server.url(host, ssl_ca=test_ca / "ca.crt"))


def test_async_api_over_verified_tls(tls_server: TLSServer, test_ca: Path) -> None:
    async def main() -> None:
        url = tls_server.url(ssl_ca=test_ca / "ca.crt")
        async with multilock.connect_async(url) as locker:
            assert isinstance(locker, AsyncMySQLLocker)
            leases = await asyncio.gather(*(locker.try_acquire(f"job-{i}") for i in range(5)))
            many = await locker.try_acquire_many(["a", "b"])
            for lease in [*leases, *many.values()]:
                assert lease is not None
                assert await lease.release()
            assert locker._conn._secure  # the session itself went through TLS

    asyncio.run(main())


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_certificate_for_another_name_is_refused(
    wrong_name: TLSServer, test_ca: Path, api: str
) -> None:
    error = refused(wrong_name.url(ssl_ca=test_ca / "ca.crt"), api)
    assert isinstance(error, BackendUnavailable)
    assert "Hostname mismatch" in str(error) or "doesn't match" in str(error), error


@pytest.mark.parametrize("api", ["sync", "async"])
def test_verification_is_on_by_default(tls_server: TLSServer, api: str) -> None:
    # Without ssl_ca only the system's CAs are trusted: the test CA is not one.
    error = refused(tls_server.url(ssl_mode="verify_identity"), api)
    assert isinstance(error, BackendUnavailable)
    assert "certificate verify failed" in str(error), error


def test_weaker_modes_are_explicit_and_honoured(wrong_name: TLSServer, test_ca: Path) -> None:
    works(wrong_name.url(ssl_ca=test_ca / "ca.crt", ssl_mode="verify_ca"))  # any name
    works(wrong_name.url(ssl_mode="required"))  # nothing verified, but encrypted
    works(wrong_name.url(ssl_mode="preferred"))


def test_a_user_that_needs_a_client_certificate(tls_server: TLSServer, test_ca: Path) -> None:
    tls: dict[str, Any] = {"ssl_ca": test_ca / "ca.crt"}
    error = refused(tls_server.url(user=CLIENT, **tls))
    assert "Access denied" in str(error), error
    works(
        tls_server.url(
            user=CLIENT, **tls, ssl_cert=test_ca / "client.crt", ssl_key=test_ca / "client.key"
        )
    )


def test_a_client_certificate_with_an_encrypted_key(
    tls_server: TLSServer, test_ca: Path, tmp_path: Path
) -> None:
    key = tmp_path / "client.key"
    subprocess.run(
        [
            *("openssl", "pkey", "-in", str(test_ca / "client.key"), "-aes256"),
            *("-passout", f"pass:{KEY_PASSWORD}", "-out", str(key)),
        ],
        check=True,
        capture_output=True,
    )
    tls: dict[str, Any] = {
        "ssl_ca": test_ca / "ca.crt",
        "ssl_cert": test_ca / "client.crt",
        "ssl_key": key,
    }
    works(tls_server.url(user=CLIENT, **tls, ssl_key_password=KEY_PASSWORD))
    # A wrong passphrase is an error of the URL, when it is parsed; no passphrase shown.
    wrong = tls_server.url(user=CLIENT, **tls, ssl_key_password=f"not-{KEY_PASSWORD}")
    with pytest.raises(InvalidOption, match="cannot use the TLS files") as raised:
        multilock.connect(wrong)
    assert KEY_PASSWORD not in str(raised.value)
    url = tls_server.url(user=CLIENT, **tls, ssl_key_password=KEY_PASSWORD)
    with multilock.connect(url) as locker:
        assert KEY_PASSWORD not in repr(locker)
        assert KEY_PASSWORD not in locker.url
    assert KEY_PASSWORD not in repr(parse_settings(LockURL.parse(url)))


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_server_without_tls_is_refused_where_the_url_insists(
    private: PrivateServer, test_ca: Path, api: str
) -> None:
    # What a man in the middle does by taking TLS out of the server's greeting.
    url = with_options(private.url, connect_timeout=2)
    for options in ({"ssl_mode": "required"}, {"ssl_ca": test_ca / "ca.crt"}):
        error = refused(with_options(url, **options), api)
        assert isinstance(error, BackendUnavailable)
        assert "does not offer TLS" in str(error), error
    works(with_options(url, ssl_mode="preferred"))  # the default: TLS if offered
    works(with_options(url, ssl_mode="disabled"))


def test_the_url_of_the_documentation_works(tls_server: TLSServer, test_ca: Path) -> None:
    if not PAGE.exists():
        pytest.skip("docs/ is not here (not a checkout of the repository)")
    section = PAGE.read_text().split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    documented = LockURL.parse(re.findall(r"^mysql://\S+$", section, re.M)[0])
    # Its options as they are, its files from the test CA; our server, user and database.
    options = {
        k: v.replace("/etc/multilock/", f"{test_ca}/") for k, v in documented.options.items()
    }
    works(tls_server.url(**options))


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("ssl_mode=verify_full", "one of disabled, preferred"),
        ("ssl_ca=/tmp/ca.crt&ssl_mode=preferred", "needs an ssl_mode that insists"),
        ("ssl_cert=/tmp/c.crt&ssl_mode=disabled", "needs an ssl_mode that insists"),
        ("ssl_cert=/tmp/c.crt", "go together"),
        ("ssl_ca=/nonexistent/ca.crt", "cannot use the TLS files"),
    ],
)
def test_bad_tls_options_are_refused_when_parsed(query: str, message: str) -> None:
    with pytest.raises(InvalidOption, match=message) as raised:
        parse_settings(LockURL.parse(f"mysql://root:{KEY_PASSWORD}@h1/test?{query}"))
    assert "\n" not in str(raised.value)
    assert KEY_PASSWORD not in str(raised.value)


def test_modes_by_default() -> None:
    assert parse_settings(LockURL.parse("mysql://h1/test")).ssl_mode == "preferred"
    strict = parse_settings(LockURL.parse("mysql://h1/test?ssl_mode=VERIFY_IDENTITY"))
    assert strict.ssl_mode == "verify_identity"
    assert strict.ssl_context is not None
    assert strict.ssl_context.check_hostname
    assert parse_settings(LockURL.parse("mysql://h1/test?ssl_mode=disabled")).ssl_context is None
