"""TLS to a private ZooKeeper that speaks only TLS (Netty, ``secureClientPort``), with
certificates of a throwaway CA made by ``scripts/test-ca``.

The server presents a certificate for localhost/127.0.0.1 (or, to be refused, one for
another name signed by the same CA) and needs a client certificate unless told not to.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable
from multilock.testing import TcpProxy
from multilock.testing._servers.zookeeper import PrivateZooKeeper
from multilock_zookeeper import backend

PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "zookeeper.md"

CONNECT_TIMEOUT = 2.0
PROMPT = CONNECT_TIMEOUT + 1.5  # what a refused connection may take on a loaded machine
BOUND = 15.0


def tls_url(
    server: PrivateZooKeeper,
    ca: Path,
    *,
    host: str = "localhost",
    userinfo: str = "",
    trust: bool = True,
    client_cert: bool = True,
    **options: Any,
) -> str:
    """A TLS lock URL of ``server`` that trusts the test CA (unless not ``trust``) and
    presents the test client certificate (unless not ``client_cert``)."""
    query: dict[str, Any] = {"use_ssl": "true"}
    if trust:
        query["ca"] = ca / "ca.crt"
    if client_cert:
        query |= {"certfile": ca / "client.crt", "keyfile": ca / "client.key"}
    query |= {"connect_timeout": CONNECT_TIMEOUT, **options}
    at = f"{userinfo}@" if userinfo else ""
    return f"zookeeper://{at}{host}:{server.port}/tls?{urlencode(query)}"


def refused(url: str) -> BackendUnavailable:
    """The error of a first acquire on ``url``, which must come within ``PROMPT``."""
    start = time.monotonic()
    with multilock.connect(url) as locker, pytest.raises(BackendUnavailable) as raised:
        locker.try_acquire("job")
    assert time.monotonic() - start < PROMPT
    return raised.value


def test_a_verified_server_works_by_name_and_by_address(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    server = private_zookeeper(tls=test_ca)
    for host in ("localhost", "127.0.0.1"):  # the certificate names both
        with multilock.connect(tls_url(server, test_ca, host=host)) as locker:
            lease = locker.try_acquire(f"job-{host}")
            assert lease is not None
            assert [i.name for i in locker.locks()] == [f"job-{host}"]  # type: ignore[attr-defined]
            assert lease.release() is True


def test_async_api_over_tls(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    url = tls_url(private_zookeeper(tls=test_ca), test_ca)

    async def main() -> None:
        async with multilock.connect_async(url) as locker:
            leases = [await locker.try_acquire("job")]
            leases += (await locker.try_acquire_many(["a", "b"])).values()
            for lease in leases:
                assert lease is not None
                assert await lease.release() is True

    asyncio.run(main())


def test_a_session_ended_over_tls_fires_lost(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    url = tls_url(private_zookeeper(tls=test_ca), test_ca, suspended="keep")
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        # The conformance hook reaches the session over TLS too.
        backend.conformance.break_lease(LockURL.parse(url), locker, lease)
        assert lease.lost.wait(BOUND)
        assert "expired" in str(lease.lost.reason)


def test_the_digest_password_does_not_cross_the_network_in_clear(
    private_zookeeper: Callable[..., PrivateZooKeeper],
    test_ca: Path,
    tcp_proxy: Callable[[tuple[str, int]], TcpProxy],
    zookeeper_url: str,
) -> None:
    secret = "s3cret-on-the-wire"
    plain = LockURL.parse(zookeeper_url)
    seen_plain = tcp_proxy((plain.host or "127.0.0.1", plain.port or 2181))
    server = private_zookeeper(tls=test_ca)
    seen_tls = tcp_proxy(("127.0.0.1", server.port))
    urls = {
        seen_plain: f"zookeeper://app:{secret}@127.0.0.1:{seen_plain.port}/wire-{time.time_ns()}",
        seen_tls: tls_url(server, test_ca, host="127.0.0.1", userinfo=f"app:{secret}").replace(
            f":{server.port}/", f":{seen_tls.port}/"
        ),
    }
    for url in urls.values():
        with multilock.connect(url) as locker:
            lease = locker.try_acquire("job")
            assert lease is not None
            assert lease.release() is True
    assert secret.encode() in seen_plain.sent  # what the network sees without TLS...
    assert seen_tls.sent  # ...and with it: bytes went through, the password not
    assert secret.encode() not in seen_tls.sent


def test_a_certificate_for_another_name_is_refused_unless_verification_is_off(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    server = private_zookeeper(tls=test_ca, cert="wrong")  # for wrong.invalid, same CA
    error = refused(tls_url(server, test_ca))
    assert "Hostname mismatch" in str(error), error
    assert "\n" not in str(error)
    # Turning verification off is an explicit choice the URL makes, and is honoured.
    with multilock.connect(tls_url(server, test_ca, verify_certs="false")) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        assert lease.release() is True


def test_verification_is_on_by_default(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    server = private_zookeeper(tls=test_ca)
    # Without ca=, only the system's CAs are trusted: the test CA is not one of them.
    error = refused(tls_url(server, test_ca, trust=False))
    assert "certificate verify failed" in str(error), error


def test_a_server_that_needs_a_client_certificate_refuses_a_client_without(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    server = private_zookeeper(tls=test_ca, client_auth="need")
    error = refused(tls_url(server, test_ca, client_cert=False))
    assert "certificate" in str(error), error


def test_plain_tcp_to_a_tls_port_fails_promptly(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    server = private_zookeeper(tls=test_ca)
    refused(f"zookeeper://127.0.0.1:{server.port}/tls?connect_timeout={CONNECT_TIMEOUT}")


def test_the_url_of_the_documentation_works(
    private_zookeeper: Callable[..., PrivateZooKeeper], test_ca: Path
) -> None:
    if not PAGE.exists():
        pytest.skip("docs/ is not here (not a checkout of the repository)")
    section = PAGE.read_text().split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    documented = LockURL.parse(re.findall(r"^zookeeper://\S+$", section, re.M)[0])
    server = private_zookeeper(tls=test_ca)
    # Its options as they are, its files from the test CA; its credentials, our server.
    options = {
        k: v.replace("/etc/multilock/", f"{test_ca}/") for k, v in documented.options.items()
    }
    userinfo = f"{documented.username}:{documented.password}"
    url = f"zookeeper://{userinfo}@localhost:{server.port}/docs?{urlencode(options)}"
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        assert lease.release() is True
