"""PgBouncer in front of the test server: session pooling works and passes the suite;
transaction and statement pooling are refused when the session is set up, with one
line naming the cause and the fix.

Every pooler here is Debian's ``pgbouncer``, started by the ``pgbouncer`` fixture on
a free loopback port in front of the shared test server.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import psycopg
import pytest

import multilock
from multilock import advisory_key
from multilock.backend import LockURL
from multilock.errors import ConfigurationError
from multilock.testing import ConformanceTests
from multilock_postgres import PostgresLocker
from multilock_postgres._config import parse_settings

pytestmark = pytest.mark.topology

# The fix the error must name, and the cause.
FIX = "pool_mode = session"
CAUSE = "shares server sessions between clients"


@pytest.fixture(scope="module")
def session_pool(pgbouncer: Callable[..., str]) -> str:
    """The test database through PgBouncer in session mode: a server connection for
    each client session (the suite's 20 waiters on one name and their holder)."""
    return pgbouncer(pool_mode="session", default_pool_size=60)


class TestPgBouncerSessionConformance(ConformanceTests):
    """Every promise of the contract, kept through PgBouncer's session pooling (with
    fencing, so the suite's token checks run too)."""

    @pytest.fixture
    def multilock_url(self, session_pool: str) -> str:
        """The pooled URL with fencing and a short health interval."""
        return f"{session_pool}?health_interval=0.5&fencing=true"


def _lock_and_release(url: str) -> None:
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(f"pgbouncer-{uuid.uuid4().hex}")
        assert lease is not None
        lease.release()


def _async_use(url: str) -> None:
    async def main() -> None:
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire(f"pgbouncer-{uuid.uuid4().hex}")
            assert lease is not None
            await lease.release()

    asyncio.run(main())


def _warm(url: str, sessions: int) -> None:
    """Leave ``sessions`` idle server sessions in the pool: as many transactions at once."""
    settings = parse_settings(LockURL.parse(url))
    conns = [psycopg.connect(settings.conninfo) for _ in range(sessions)]
    for conn in conns:
        conn.execute("SELECT 1")  # in a transaction: each holds its server session
    for conn in conns:
        conn.close()


@pytest.mark.parametrize(
    ("settings", "idle"),
    [
        # The most recently freed server session first: the second connection gets the
        # session's own.
        ({"pool_mode": "transaction"}, 0),
        # Round robin over three idle server sessions: the session's second question
        # goes to another one.
        ({"pool_mode": "transaction", "server_round_robin": 1}, 3),
        ({"pool_mode": "statement"}, 0),
    ],
    ids=["transaction", "transaction-round-robin", "statement"],
)
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_transaction_pooler_is_refused_at_connect(
    pgbouncer: Callable[..., str], settings: dict[str, str | int], idle: int, api: str
) -> None:
    url = pgbouncer(**settings)
    _warm(url, idle)
    use = _lock_and_release if api == "sync" else _async_use
    with pytest.raises(ConfigurationError) as caught:
        use(url)
    message = str(caught.value)
    assert CAUSE in message
    assert FIX in message
    assert "directly" in message
    assert "\n" not in message


def test_the_lease_is_held_by_the_server_session_behind_the_pool(
    session_pool: str, holders: Callable[[int], list[int]]
) -> None:
    """Through the pool, ``session_pid`` is the server's process (PgBouncer gives its
    clients a made-up one), so ``pg_locks`` and ``pg_terminate_backend`` find it."""
    with PostgresLocker(LockURL.parse(session_pool)) as locker:
        lease = locker.try_acquire(f"pgbouncer-{uuid.uuid4().hex}")
        assert lease is not None
        assert holders(advisory_key(lease.name)) == [locker.session_pid]
        lease.release()


def test_a_full_session_pool_still_connects_with_a_warning(
    pgbouncer: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """One server session in the pool, taken by the locker: the check's second
    connection waits in vain, so only the first test decides (and passes), said once."""
    url = pgbouncer(pool_mode="session", default_pool_size=1)
    with caplog.at_level(logging.WARNING, logger="multilock.postgres"):
        _lock_and_release(f"{url}?health_timeout=0.5")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "checked with one connection only" in warnings[0]


def test_a_session_pool_beside_transaction_pools(
    pgbouncer: Callable[..., str], postgres_url: str
) -> None:
    """docs/operations.md's recipe: PgBouncer in transaction mode for the application,
    and one database entry in session mode for the locks."""
    database = LockURL.parse(postgres_url).path.lstrip("/")
    pooled = pgbouncer(
        pool_mode="transaction",
        server_reset_query="DISCARD ALL",
        databases={"app_locks": f"dbname={database} pool_mode=session"},
    )
    with pytest.raises(ConfigurationError):
        _lock_and_release(pooled)
    _lock_and_release(pooled.rsplit("/", 1)[0] + "/app_locks")
