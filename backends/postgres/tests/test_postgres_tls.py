"""TLS to a private PostgreSQL cluster with ``ssl=on`` and certificates of a throwaway
CA made by ``scripts/test-ca``: libpq's ``sslmode`` is honoured as given, and a URL
that names a root certificate without a mode verifies the server fully.

The cluster presents a certificate for localhost/127.0.0.1, or (reloaded) one of the
same CA for another name; role ``multilock-client`` may only log in with the test
client certificate.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, InvalidOption
from multilock.testing._servers import checks
from multilock.testing._servers.postgres import PrivateServer
from multilock_postgres._config import parse_settings

PROMPT = 3.0  # what a refused connection may take on a loaded machine
CLIENT = "multilock-client"  # the test client certificate's CN
KEY_PASSWORD = "K3y-pa55phrase"
PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "postgres.md"


@pytest.fixture(scope="module")
def tls_server(private_server: PrivateServer, test_ca: Path) -> PrivateServer:
    """The module's private cluster with TLS on and a role that needs a client certificate."""
    for name in ("ca.crt", "server.crt", "server.key", "wrong.crt", "wrong.key"):
        private_server.install(test_ca / name, name)
    private_server.configure(
        ssl="on",
        ssl_ca_file="../ca.crt",  # relative to the data directory
        ssl_cert_file="../server.crt",
        ssl_key_file="../server.key",
        hba=f"hostssl all {CLIENT} 127.0.0.1/32 cert",
    )
    with private_server.admin() as conn:
        conn.execute(f'CREATE ROLE "{CLIENT}" LOGIN')
    return private_server


@pytest.fixture
def wrong_name(tls_server: PrivateServer) -> Iterator[PrivateServer]:
    """The cluster presenting, for the test, a certificate of the test CA for another name."""
    tls_server.configure(ssl_cert_file="../wrong.crt", ssl_key_file="../wrong.key")
    yield tls_server
    tls_server.configure(ssl_cert_file="../server.crt", ssl_key_file="../server.key")


def url(
    server: PrivateServer, *, host: str = "localhost", user: str = "postgres", **options: Any
) -> str:
    """A lock URL of ``server``'s ``postgres`` database, with a unique application_name."""
    query = urlencode({"application_name": f"tls-{uuid.uuid4().hex[:8]}", **options})
    return f"postgresql://{user}@{host}:{server.port}/postgres?{query}"


def tls_in_use(server: PrivateServer, lock_url: str) -> bool:
    """Whether the session a locker of ``lock_url`` holds its locks on speaks TLS."""
    name = LockURL.parse(lock_url).options["application_name"]
    with server.admin() as conn:
        row = conn.execute(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
            " WHERE a.application_name = %s",
            (name,),
        ).fetchone()
    assert row is not None, f"no session named {name!r}"
    return bool(row[0])


def works(server: PrivateServer, lock_url: str) -> bool:
    """Take and release a lock over ``lock_url``; whether its session spoke TLS."""
    with multilock.connect(lock_url) as locker:
        lease = locker.try_acquire("over-tls")
        assert lease is not None
        encrypted = tls_in_use(server, lock_url)
        assert lease.release() is True
    return encrypted


def refused(lock_url: str) -> BackendUnavailable:
    """The error of an acquire over ``lock_url``: one line, within ``PROMPT``."""
    return checks.refused(lock_url, within=PROMPT)


def test_verify_full_with_the_test_ca_works_by_name_and_by_address(
    tls_server: PrivateServer, test_ca: Path
) -> None:
    for host in ("localhost", "127.0.0.1"):  # the certificate names both
        lock_url = url(tls_server, host=host, sslmode="verify-full", sslrootcert=test_ca / "ca.crt")
        assert works(tls_server, lock_url)


def test_async_api_over_verified_tls(tls_server: PrivateServer, test_ca: Path) -> None:
    lock_url = url(tls_server, sslmode="verify-full", sslrootcert=test_ca / "ca.crt")

    async def main() -> None:
        async with multilock.connect_async(lock_url) as locker:
            lease = await locker.try_acquire("over-tls")
            assert lease is not None
            assert await asyncio.to_thread(tls_in_use, tls_server, lock_url)
            assert await lease.release() is True

    asyncio.run(main())


def test_a_certificate_for_another_name_is_refused(
    wrong_name: PrivateServer, test_ca: Path
) -> None:
    ca = test_ca / "ca.crt"
    error = refused(url(wrong_name, sslmode="verify-full", sslrootcert=ca))
    assert 'does not match host name "localhost"' in str(error), error
    # Naming the root certificate is enough: verify-full is then the default.
    error = refused(url(wrong_name, sslrootcert=ca))
    assert "does not match host name" in str(error), error
    # A weaker mode the URL asks for is honoured.
    assert works(wrong_name, url(wrong_name, sslmode="verify-ca", sslrootcert=ca))
    assert works(wrong_name, url(wrong_name, sslmode="require"))


def test_async_a_certificate_for_another_name_is_refused(
    wrong_name: PrivateServer, test_ca: Path
) -> None:
    lock_url = url(wrong_name, sslrootcert=test_ca / "ca.crt")

    async def main() -> BaseException:
        async with multilock.connect_async(lock_url) as locker:
            with pytest.raises(BackendUnavailable) as raised:
                await locker.try_acquire("over-tls")
            return raised.value

    assert "does not match host name" in str(asyncio.run(main()))


def test_the_system_store_does_not_trust_the_test_ca(tls_server: PrivateServer) -> None:
    error = refused(url(tls_server, sslmode="verify-full", sslrootcert="system"))
    assert "certificate verify failed" in str(error), error


def test_sslmode_is_honoured(tls_server: PrivateServer) -> None:
    assert works(tls_server, url(tls_server, sslmode="require"))
    assert not works(tls_server, url(tls_server, sslmode="disable"))


def test_a_client_certificate_with_an_encrypted_key(
    tls_server: PrivateServer, test_ca: Path, tmp_path: Path
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
    key.chmod(0o600)
    tls: dict[str, Any] = {
        "sslmode": "verify-full",
        "sslrootcert": test_ca / "ca.crt",
        "sslcert": test_ca / "client.crt",
        "sslkey": key,
    }
    assert works(tls_server, url(tls_server, user=CLIENT, **tls, sslpassword=KEY_PASSWORD))
    refused(url(tls_server, user=CLIENT, **{**tls, "sslcert": "", "sslkey": ""}))
    refused(url(tls_server, user=CLIENT, **tls, sslpassword="not-the-passphrase"))
    # The key's passphrase stays out of the connection string and the locker's repr.
    settings = parse_settings(LockURL.parse(url(tls_server), sslpassword=KEY_PASSWORD))
    assert KEY_PASSWORD not in settings.conninfo
    assert settings.connect_kwargs()["sslpassword"] == KEY_PASSWORD
    assert KEY_PASSWORD not in repr(settings)


def test_the_url_of_the_documentation_works(tls_server: PrivateServer, test_ca: Path) -> None:
    if not PAGE.exists():
        pytest.skip("docs/ is not here (not a checkout of the repository)")
    section = PAGE.read_text().split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    documented = LockURL.parse(re.findall(r"^postgresql://\S+$", section, re.M)[0])
    # Its options as they are, its files from the test CA; our server, role and database.
    options = {
        k: v.replace("/etc/multilock/", f"{test_ca}/") for k, v in documented.options.items()
    }
    assert works(tls_server, url(tls_server, **options))


def test_a_root_certificate_without_a_mode_means_verify_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def conninfo(query: str) -> str:
        return parse_settings(LockURL.parse(f"postgresql://h/db?{query}")).conninfo

    monkeypatch.delenv("PGSSLMODE", raising=False)
    assert "sslmode" not in conninfo("connect_timeout=1")  # libpq's own default
    assert "sslmode=verify-full" in conninfo("sslrootcert=/ca.pem")
    assert "sslmode=require" in conninfo("sslrootcert=/ca.pem&sslmode=require")
    monkeypatch.setenv("PGSSLMODE", "verify-ca")  # libpq's environment still decides
    assert "sslmode" not in conninfo("sslrootcert=/ca.pem")


@pytest.mark.parametrize("mode", ["VERIFY_FULL", "strict", ""])
def test_an_unknown_sslmode_is_refused_when_parsed(mode: str) -> None:
    with pytest.raises(InvalidOption, match=r"'sslmode'.*verify-full"):
        parse_settings(LockURL.parse(f"postgresql://h/db?sslmode={mode}"))
