"""Fixtures of the NATS backend's tests, written as a third-party backend would.

``nats_url`` is the shared server (``MULTILOCK_NATS_URL``, default: a NATS server with
JetStream on 127.0.0.1:4222), skipped when it is down -- or failed when backends are
required. ``make_url`` gives each test a bucket of its own, deleted after the test, so
that the shared server keeps nothing of the run. Tests that break a server get a private
``nats-server`` on a free port (``private_nats``); the TLS tests' servers present
certificates of a throwaway CA made by the repository's ``scripts/test-ca`` (``test_ca``).
The servers themselves are the repository's test support,
:mod:`multilock.testing._servers.nats`: these are only their fixtures.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import nats
import pytest

from multilock.backend import LockURL
from multilock.testing import server_url
from multilock.testing._servers import unavailable
from multilock.testing._servers.nats import PrivateNats

DEFAULT_URL = "nats://127.0.0.1:4222/multilock-test"


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> str:
    """The lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_NATS_URL", DEFAULT_URL))


def delete_buckets(server: str, buckets: list[str]) -> None:
    """Delete the KV buckets a test made (those that exist)."""

    async def main() -> None:
        nc = await nats.connect(server, allow_reconnect=False, connect_timeout=5)
        try:
            js = nc.jetstream(timeout=5)
            for bucket in buckets:
                try:
                    await js.delete_key_value(bucket)
                except nats.js.errors.NotFoundError:
                    pass
        finally:
            await nc.close()

    asyncio.run(main())


@pytest.fixture
def make_url(nats_url: str) -> Iterator[Callable[..., str]]:
    """``make_url(**options)``: the test server, a bucket of this test's own, options."""
    parsed = LockURL.parse(nats_url)
    host, port = parsed.host or "127.0.0.1", parsed.port or 4222
    base = parsed.path.strip("/") or "multilock-test"
    bucket = f"{base}-{uuid.uuid4().hex[:12]}"
    made: list[str] = []

    def make(**options: Any) -> str:
        made.append(bucket)
        query = f"?{urlencode(options)}" if options else ""
        return f"nats://{host}:{port}/{bucket}{query}"

    yield make
    if made:
        delete_buckets(f"nats://{host}:{port}", [bucket])


@pytest.fixture
def private_nats(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., PrivateNats]]:
    """``private_nats(*auth_flags)``: a started private server, killed after the test."""
    servers: list[PrivateNats] = []

    def make(*auth: str) -> PrivateNats:
        server = PrivateNats(tmp_path / f"nats{len(servers)}", *auth)
        servers.append(server)
        try:
            server.start()
        except (RuntimeError, AssertionError) as exc:  # not installed, or did not start in time
            unavailable(request.config, str(exc))
        return server

    yield make
    for server in servers:
        server.stop()
