"""``tls=true`` to a private etcd whose client URL is ``https://`` only, with certificates
of a throwaway CA made by ``scripts/test-ca``.

Verification is on by default, certificate *and* host name: a certificate of the right
CA for another name is refused unless the URL says ``verify=false``.
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
from multilock.testing._servers.etcd import TLSEtcd
from multilock_etcd import EtcdLease

TIMEOUT = 1.0  # request and connect timeouts of the lockers under test
PROMPT = TIMEOUT + 1.5  # what a refused connection may take on a loaded machine
SECRET = "s3cret-pa55"
PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "etcd.md"


def url(server: TLSEtcd, host: str = "localhost", trust: bool = True, **options: object) -> str:
    """A URL of ``server`` with TLS on, trusting the test CA (unless not ``trust``)."""
    query: dict[str, object] = {"timeout": TIMEOUT, "connect_timeout": TIMEOUT, **options}
    if trust:
        query["cacert"] = server.ca / "ca.crt"
    return server.url(host, **query)


def works(lock_url: str) -> None:
    """A lock can be taken, is exclusive and is released over ``lock_url``."""
    checks.works(lock_url, EtcdLease)


def refused(lock_url: str, api: str = "sync") -> BackendUnavailable:
    """The error of an acquire over ``lock_url``: one line, within ``PROMPT``."""
    return checks.refused(lock_url, api, within=PROMPT)


def test_a_verified_server_works_by_name_and_by_address(
    tls_etcd: Callable[..., TLSEtcd],
) -> None:
    server = tls_etcd()
    for host in ("localhost", "127.0.0.1"):  # the certificate names both
        works(url(server, host))


def test_async_api_over_tls(tls_etcd: Callable[..., TLSEtcd]) -> None:
    async def main() -> None:
        async with multilock.connect_async(url(tls_etcd())) as locker:
            leases = await asyncio.gather(*(locker.try_acquire(f"job-{i}") for i in range(5)))
            for lease in leases:
                assert lease is not None
                await lease.extend()
                assert await lease.release()

    asyncio.run(main())


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_certificate_for_another_name_is_refused(
    tls_etcd: Callable[..., TLSEtcd], api: str
) -> None:
    error = refused(url(tls_etcd(cert="wrong")), api)
    assert "Hostname mismatch" in str(error), error


@pytest.mark.parametrize("api", ["sync", "async"])
def test_verification_is_on_by_default(tls_etcd: Callable[..., TLSEtcd], api: str) -> None:
    # Without cacert only the system's CAs are trusted: the test CA is not one.
    error = refused(url(tls_etcd(), trust=False), api)
    assert "certificate verify failed" in str(error), error


def test_turning_verification_off_is_explicit_and_honoured(
    tls_etcd: Callable[..., TLSEtcd],
) -> None:
    works(url(tls_etcd(cert="wrong"), trust=False, verify="false"))


def test_a_server_that_wants_a_client_certificate(tls_etcd: Callable[..., TLSEtcd]) -> None:
    server = tls_etcd(client_auth=True)
    refused(url(server))
    works(url(server, cert=server.ca / "client.crt", key=server.ca / "client.key"))


def test_plain_etcd_to_a_tls_port_fails_promptly(tls_etcd: Callable[..., TLSEtcd]) -> None:
    server = tls_etcd()
    refused(f"etcd://127.0.0.1:{server.port}/tls?timeout={TIMEOUT}&connect_timeout={TIMEOUT}")


def test_the_password_stays_out_of_errors_over_tls(tls_etcd: Callable[..., TLSEtcd]) -> None:
    server = tls_etcd(cert="wrong")
    lock_url = url(server).replace("etcd://", f"etcd://root:{SECRET}@")
    error = refused(lock_url)
    assert SECRET not in str(error)
    with multilock.connect(lock_url) as locker:
        assert SECRET not in repr(locker)


def test_the_url_of_the_documentation_works(tls_etcd: Callable[..., TLSEtcd]) -> None:
    if not PAGE.exists():
        pytest.skip("docs/ is not here (not a checkout of the repository)")
    server = tls_etcd(client_auth=True)
    section = PAGE.read_text().split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    documented = LockURL.parse(re.findall(r"^etcd://\S+$", section, re.M)[0])
    # Its options as they are, its files from the test CA; our server (no auth).
    options = {
        k: v.replace("/etc/multilock/", f"{server.ca}/") for k, v in documented.options.items()
    }
    works(f"etcd://localhost:{server.port}{documented.path}?{urlencode(options)}")


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_handshake_with_a_frozen_server_is_bounded(
    tls_etcd: Callable[..., TLSEtcd], api: str
) -> None:
    # The kernel completes the TCP handshake; the TLS one gets no answer.
    server = tls_etcd()
    server.freeze()
    try:
        error = refused(url(server), api)
    finally:
        server.thaw()
    assert "no answer in time" in str(error) or "timed out" in str(error), error
