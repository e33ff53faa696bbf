"""``tls=true`` to a private ``nats-server`` started with ``--tls`` and certificates of a
throwaway CA made by ``scripts/test-ca``.

Verification is on by default, certificate *and* host name: a certificate of the right
CA for another name is refused unless the URL says ``verify=false``. A server whose
greeting does not require TLS is refused before CONNECT (credentials) goes out: nats-py
would otherwise go on in clear.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable
from multilock.testing._servers import checks
from multilock.testing._servers.nats import PrivateNats, tls_flags
from multilock_nats import NatsLease

TIMEOUT = 1.0  # request and connect timeouts of the lockers under test
PROMPT = TIMEOUT + 1.5  # what a refused connection may take on a loaded machine
SECRET = "s3cret-pa55"
PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "nats.md"


def url(
    server: PrivateNats,
    ca: Path,
    host: str = "localhost",
    trust: bool = True,
    userinfo: str = "",
    **options: object,
) -> str:
    """A URL of ``server`` with TLS on, trusting the test CA ``ca`` (unless not ``trust``)."""
    query: dict[str, object] = {
        "tls": "true",
        "timeout": TIMEOUT,
        "connect_timeout": TIMEOUT,
        **options,
    }
    if trust:
        query["cacert"] = ca / "ca.crt"
    at = f"{userinfo}@" if userinfo else ""
    return f"nats://{at}{host}:{server.port}/tls?{urlencode(query)}"


def works(lock_url: str) -> None:
    """A lock can be taken, is exclusive and is released over ``lock_url``."""
    checks.works(lock_url, NatsLease)


def refused(lock_url: str, api: str = "sync") -> BackendUnavailable:
    """The error of an acquire over ``lock_url``: one line, within ``PROMPT``."""
    return checks.refused(lock_url, api, within=PROMPT)


def test_a_verified_server_works_by_name_and_by_address(
    private_nats: Callable[..., PrivateNats], test_ca: Path
) -> None:
    server = private_nats(*tls_flags(test_ca))
    for host in ("localhost", "127.0.0.1"):  # the certificate names both
        works(url(server, test_ca, host))


def test_async_api_over_tls(private_nats: Callable[..., PrivateNats], test_ca: Path) -> None:
    server = private_nats(*tls_flags(test_ca))

    async def main() -> None:
        async with multilock.connect_async(url(server, test_ca)) as locker:
            leases = await asyncio.gather(*(locker.try_acquire(f"job-{i}") for i in range(5)))
            for lease in leases:
                assert lease is not None
                await lease.extend()
                assert await lease.release()

    asyncio.run(main())


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_certificate_for_another_name_is_refused(
    private_nats: Callable[..., PrivateNats], test_ca: Path, api: str
) -> None:
    server = private_nats(*tls_flags(test_ca, cert="wrong"))
    error = refused(url(server, test_ca), api)
    assert "Hostname mismatch" in str(error), error


@pytest.mark.parametrize("api", ["sync", "async"])
def test_verification_is_on_by_default(
    private_nats: Callable[..., PrivateNats], test_ca: Path, api: str
) -> None:
    # Without cacert only the system's CAs are trusted: the test CA is not one.
    server = private_nats(*tls_flags(test_ca))
    error = refused(url(server, test_ca, trust=False), api)
    assert "certificate verify failed" in str(error), error


def test_turning_verification_off_is_explicit_and_honoured(
    private_nats: Callable[..., PrivateNats], test_ca: Path
) -> None:
    server = private_nats(*tls_flags(test_ca, cert="wrong"))
    works(url(server, test_ca, trust=False, verify="false"))


def test_a_server_that_wants_a_client_certificate(
    private_nats: Callable[..., PrivateNats], test_ca: Path
) -> None:
    server = private_nats(*tls_flags(test_ca, client_auth=True))
    refused(url(server, test_ca))
    works(url(server, test_ca, cert=test_ca / "client.crt", key=test_ca / "client.key"))


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_server_without_tls_is_refused_before_the_credentials_go_out(
    private_nats: Callable[..., PrivateNats], test_ca: Path, api: str
) -> None:
    # What a man in the middle does by taking tls_required out of the server's greeting.
    server = private_nats("--user", "app", "--pass", SECRET)
    error = refused(url(server, test_ca, userinfo=f"app:{SECRET}"), api)
    assert "does not offer TLS" in str(error), error
    assert SECRET not in str(error)


def test_the_password_stays_out_of_errors_over_tls(
    private_nats: Callable[..., PrivateNats], test_ca: Path
) -> None:
    server = private_nats(*tls_flags(test_ca), "--user", "app", "--pass", SECRET)
    works(url(server, test_ca, userinfo=f"app:{SECRET}"))
    lock_url = url(server, test_ca, userinfo=f"app:not-{SECRET}")
    with multilock.connect(lock_url) as locker:
        assert SECRET not in repr(locker)
        with pytest.raises(multilock.errors.MultilockError) as raised:
            locker.try_acquire("over-tls")
        assert SECRET not in str(raised.value)


def test_the_url_of_the_documentation_works(
    private_nats: Callable[..., PrivateNats], test_ca: Path
) -> None:
    if not PAGE.exists():
        pytest.skip("docs/ is not here (not a checkout of the repository)")
    server = private_nats(*tls_flags(test_ca, client_auth=True))
    section = PAGE.read_text().split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    documented = LockURL.parse(re.findall(r"^nats://\S+$", section, re.M)[0])
    # Its options as they are, its files from the test CA; our server (no credentials).
    options = {
        k: v.replace("/etc/multilock/", f"{test_ca}/") for k, v in documented.options.items()
    }
    works(f"nats://localhost:{server.port}{documented.path}?{urlencode(options)}")


@pytest.mark.parametrize("api", ["sync", "async"])
def test_connecting_to_a_frozen_tls_server_is_bounded(
    private_nats: Callable[..., PrivateNats], test_ca: Path, api: str
) -> None:
    # The kernel completes the TCP handshake; neither the greeting nor TLS come.
    server = private_nats(*tls_flags(test_ca))
    server.freeze()
    try:
        error = refused(url(server, test_ca), api)
    finally:
        server.thaw()
    assert "no answer in time" in str(error), error
