"""``rediss://`` to a private redis-server that speaks only TLS (``--tls-port``), with
certificates of a throwaway CA made by ``scripts/test-ca``.

Verification is on by default, certificate *and* host name, whatever redis-py's own
defaults (before redis-py 6.0, ``rediss://`` did not check the name): a certificate
of the right CA for another name is refused unless the URL turns the check off.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

import multilock
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable
from multilock.testing._servers import checks
from multilock_redis import RedisLease

PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends" / "redis.md"

TIMEOUT = 1.0  # socket and connect timeouts of the lockers under test
PROMPT = TIMEOUT + 1.5  # what a refused connection may take on a loaded machine


def tls_url(server: Any, *, host: str = "localhost", trust: bool = True, **options: Any) -> str:
    """A ``rediss://`` URL of ``server`` that trusts the test CA (unless not ``trust``)."""
    query: dict[str, Any] = {"socket_timeout": TIMEOUT, "connect_timeout": TIMEOUT}
    if trust:
        query["ssl_ca_certs"] = server.tls / "ca.crt"
    return f"rediss://{host}:{server.port}/0?{urlencode({**query, **options})}"


def works(url: str) -> None:
    """A lock can be taken, is exclusive and is released over ``url``."""
    checks.works(url, RedisLease)


def refused(url: str) -> BackendUnavailable:
    """The error of an acquire over ``url``: one line, within ``PROMPT``."""
    return checks.refused(url, within=PROMPT)


def test_a_verified_server_works_by_name_and_by_address(tls_redis: Any) -> None:
    for host in ("localhost", "127.0.0.1"):  # the certificate names both
        works(tls_url(tls_redis, host=host))


def test_async_api_over_tls(tls_redis: Any) -> None:
    async def main() -> None:
        async with multilock.connect_async(tls_url(tls_redis)) as locker:
            leases = await asyncio.gather(*(locker.try_acquire(f"job-{i}") for i in range(5)))
            many = await locker.try_acquire_many(["a", "b"])
            for lease in [*leases, *many.values()]:
                assert lease is not None
                assert await lease.release()
            # The connection open: an acquire is written on the TLS transport at once.
            started = locker._start_try_acquire("c", 30.0)  # type: ignore[attr-defined]
            assert started is not None
            lease = await started
            assert lease is not None
            assert await lease.release()

    asyncio.run(main())


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_certificate_for_another_name_is_refused(wrong_name_redis: Any, api: str) -> None:
    url = tls_url(wrong_name_redis)
    if api == "sync":
        error: BaseException = refused(url)
    else:

        async def main() -> BaseException:
            async with multilock.connect_async(url) as locker:
                with pytest.raises(BackendUnavailable) as raised:
                    await locker.try_acquire("over-tls")
                return raised.value

        error = asyncio.run(main())
    assert "Hostname mismatch" in str(error), error


def test_turning_verification_off_is_explicit_and_honoured(wrong_name_redis: Any) -> None:
    works(tls_url(wrong_name_redis, ssl_check_hostname="false"))  # right CA, any name
    works(tls_url(wrong_name_redis, trust=False, ssl_cert_reqs="none"))  # nothing checked


def test_verification_is_on_by_default(tls_redis: Any) -> None:
    # Without ssl_ca_certs only the system's CAs are trusted: the test CA is not one.
    error = refused(tls_url(tls_redis, trust=False))
    assert "certificate verify failed" in str(error), error


def test_a_server_that_wants_a_client_certificate(mutual_tls_redis: Any, test_ca: Path) -> None:
    refused(tls_url(mutual_tls_redis))
    works(
        tls_url(
            mutual_tls_redis,
            ssl_certfile=test_ca / "client.crt",
            ssl_keyfile=test_ca / "client.key",
        )
    )


def test_plain_redis_to_a_tls_port_fails_promptly(tls_redis: Any) -> None:
    refused(f"redis://127.0.0.1:{tls_redis.port}/0?socket_timeout={TIMEOUT}")


def test_the_url_of_the_documentation_works(tls_redis: Any, test_ca: Path) -> None:
    if not PAGE.exists():
        pytest.skip("docs/ is not here (not a checkout of the repository)")
    section = PAGE.read_text().split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    documented = LockURL.parse(re.findall(r"^rediss://\S+$", section, re.M)[0])
    # Its options as they are, its files from the test CA; our server (no ACL user).
    options = {
        k: v.replace("/etc/multilock/", f"{test_ca}/") for k, v in documented.options.items()
    }
    works(f"rediss://localhost:{tls_redis.port}{documented.path}?{urlencode(options)}")
