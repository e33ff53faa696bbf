"""Network faults through a TCP proxy the tests control (``multilock.testing.TcpProxy``): a
slow link, a blackhole (bytes vanish, connections stay open) and resets. Calls never
hang past their timeouts; a blackholed holder learns it lost its lease before another
replica can take the lock -- or, where the backend cannot make that so, the test
states why (PostgreSQL keeps a dead link's session until its TCP connection ends)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import multilock
from multilock.abc import AsyncLease
from multilock.errors import BackendUnavailable, MultilockError
from multilock.testing import TcpProxy
from tests.reliability._common import apoll, fresh_name, poll, with_options
from tests.reliability.conftest import Measured

pytestmark = pytest.mark.faults

BACKENDS = ["postgres", "redis", "zookeeper"]
OPTIONS: dict[str, dict[str, object]] = {
    "postgres": {"connect_timeout": "1s", "health_interval": "0.3s", "health_timeout": "0.5s"},
    "redis": {"socket_timeout": "0.5s", "connect_timeout": "0.5s", "ttl": "1s"},
    "zookeeper": {"session_timeout": "2s", "connect_timeout": "1s"},
}
TIMEOUT = {"postgres": 0.3 + 0.5 + 2.0, "redis": 1.0, "zookeeper": 1.0}
"""The longest a call may take with the options above. PostgreSQL: a call stuck on a
session the health check then cuts off (interval + timeout) and connects again,
within libpq's connect_timeout -- at least 2 s, whatever the option says. Redis:
socket + connect timeouts. ZooKeeper: the connect timeout."""
SLACK = 1.0  # a loaded 2-core machine
DELAY = 0.05  # per chunk and direction: a 100 ms round trip


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each server backend."""
    return str(request.param)


@pytest.fixture
def server(backend: str, request: pytest.FixtureRequest) -> str:
    """The shared server's URL with this module's short timeouts."""
    return with_options(request.getfixturevalue(f"{backend}_url"), **OPTIONS[backend])


@pytest.fixture
def proxy(server: str) -> Iterator[TcpProxy]:
    """A fault proxy in front of the shared server."""
    with TcpProxy.before(server) as proxy:
        yield proxy


def timed(call: Callable[[], Any], limit: float) -> tuple[float, Any]:
    """Run ``call`` in a thread; (seconds it took, its result or exception). A call
    still running after ``limit`` is a hang: the test fails (the thread is abandoned)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(limit)
    took = time.monotonic() - start
    assert outcome, f"the call hung: still running after {limit:g} s"
    return took, outcome[0]


def _said(outcome: object) -> str:
    """A call's result, or the class of the error it raised (its message is long)."""
    return type(outcome).__name__ if isinstance(outcome, Exception) else repr(outcome)


def test_slow_link_works(backend: str, server: str, proxy: TcpProxy, measured: Measured) -> None:
    proxy.delay(DELAY)
    with multilock.connect(proxy.url(server)) as locker:
        locker.try_acquire(fresh_name("warm")).release()  # type: ignore[union-attr]
        name = fresh_name("slow")
        took, lease = timed(lambda: locker.try_acquire(name), TIMEOUT[backend] + SLACK)
        assert lease is not None
        assert not isinstance(lease, Exception), lease
        released_in, released = timed(lease.release, TIMEOUT[backend] + SLACK)
        assert released is True
    measured(
        f"{DELAY * 2000:g} ms round trip",
        backend,
        "acquire and release work, slower",
        f"acquire {took * 1000:.0f} ms, release {released_in * 1000:.0f} ms",
    )
    assert took >= DELAY * 2


def test_blackhole_never_hangs_a_call(
    backend: str, server: str, proxy: TcpProxy, measured: Measured
) -> None:
    limit = TIMEOUT[backend] + SLACK
    with multilock.connect(proxy.url(server)) as locker:
        held = locker.try_acquire(fresh_name("held"))
        assert held is not None
        proxy.blackhole()
        took, error = timed(lambda: locker.try_acquire(fresh_name("cut")), limit * 3)
        released_in, released = timed(held.release, limit * 3)
        proxy.heal()
        proxy.drop_connections()
        again = poll("the locker back after the blackhole", lambda: locker.try_acquire("x"), 10)
        again.release()
    measured(
        "blackhole (bytes vanish, connections stay open)",
        backend,
        f"acquire raises BackendUnavailable, release returns, each within {limit:g} s",
        f"acquire: {type(error).__name__} after {took:.2f} s; release: {_said(released)}"
        f" after {released_in:.2f} s",
    )
    assert isinstance(error, BackendUnavailable), error
    assert took <= limit
    assert released_in <= limit
    assert not isinstance(released, Exception) or isinstance(released, MultilockError)


@pytest.mark.parametrize("connected", [False, True], ids=["before", "idle"])
def test_blackhole_without_leases_never_hangs(
    backend: str, server: str, proxy: TcpProxy, measured: Measured, connected: bool
) -> None:
    limit = TIMEOUT[backend] + SLACK
    with multilock.connect(proxy.url(server)) as locker:
        if connected:  # an established connection, no lease held: no health check runs
            locker.try_acquire(fresh_name("warm")).release()  # type: ignore[union-attr]
        proxy.blackhole()
        took, error = timed(lambda: locker.try_acquire(fresh_name("cut")), limit * 3)
    measured(
        "blackhole on an idle connection" if connected else "blackhole before connecting",
        backend,
        f"acquire raises BackendUnavailable within {limit:g} s",
        f"{type(error).__name__} after {took:.2f} s",
    )
    assert isinstance(error, BackendUnavailable), error
    assert took <= limit


EXPECTED_TAKEOVER = {
    "postgres": "lost by the health check; the server keeps the session (and the lock)"
    " while the dead link's connection stays open: another replica takes it once that"
    " connection ends",
    "redis": "lost at the lease's expiry by the holder's clock, no later than the key's"
    " expiry on the server",
    "zookeeper": "lost when the connection is suspended (2/3 of the session timeout),"
    " before the server expires the session",
}


def test_blackholed_holder_is_lost_before_another_takes_over(
    backend: str, server: str, proxy: TcpProxy, measured: Measured
) -> None:
    name = fresh_name("blackholed")
    with multilock.connect(proxy.url(server)) as holder, multilock.connect(server) as other:
        lease = holder.try_acquire(name)
        assert lease is not None
        proxy.blackhole()
        start = time.monotonic()
        assert lease.lost.wait(10), "the blackholed holder never learnt it lost the lease"
        lost_after = time.monotonic() - start
        dropped = ""
        if backend == "postgres":
            # Nothing tells the server the link is dead: the lock stays its session's.
            assert other.try_acquire(name) is None
            proxy.drop_connections()  # the connection ends (keepalive, or the link back)
            dropped = f" (the connection dropped at {time.monotonic() - start:.2f} s)"
        taken = poll("another replica taking the lock", lambda: other.try_acquire(name), 10)
        taken_after = time.monotonic() - start
        taken.release()
        proxy.heal()
    measured(
        "blackholed holder",
        backend,
        EXPECTED_TAKEOVER[backend],
        f"lost after {lost_after:.2f} s; another replica took it after {taken_after:.2f} s"
        + dropped,
    )
    assert lost_after <= taken_after


def test_reset_loses_the_lease_and_the_locker_recovers(
    backend: str, server: str, proxy: TcpProxy, measured: Measured
) -> None:
    limit = TIMEOUT[backend] + SLACK
    with multilock.connect(proxy.url(server)) as locker:
        lease = locker.try_acquire(fresh_name("reset"))
        assert lease is not None
        proxy.reset()
        start = time.monotonic()
        took, error = timed(lambda: locker.try_acquire(fresh_name("refused")), limit * 3)
        assert lease.lost.wait(10), "a reset connection never fired lost"
        lost_after = time.monotonic() - start
        proxy.heal()
        back = poll("the locker back after the resets", lambda: locker.try_acquire("y"), 10)
        back_after = time.monotonic() - start
        back.release()
        # Never raises. Redis may still free the key: its lease is reported lost a
        # little before the key's expiry (lost means "not confirmed", not "gone").
        assert lease.release() in (True, False)
    measured(
        "connections reset",
        backend,
        f"acquire raises BackendUnavailable within {limit:g} s, lease lost, reconnects",
        f"acquire: {type(error).__name__} after {took:.2f} s; lost after {lost_after:.2f} s;"
        f" acquiring again {back_after - lost_after:.2f} s after the link healed",
    )
    assert isinstance(error, BackendUnavailable), error
    assert took <= limit


async def _cancelled_then_taken(backend: str, server: str, proxy: TcpProxy) -> dict[str, float]:
    """A scheduler behind the proxy runs a long job; blackhole it; seconds from the
    blackhole to the job's cancellation, to another locker taking the job's lock and
    (PostgreSQL) to the dead connection being dropped."""
    name = fresh_name("job")
    running = asyncio.Event()
    seen: dict[str, float] = {}

    async def job() -> None:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["cancelled"] = time.monotonic() - seen["blackhole"]
            raise

    scheduler = multilock.Scheduler(
        proxy.url(server), skew_tolerance=0.5, lease_ttl=1.0, stop_timeout=2, metrics=False
    )
    scheduler.add_job(job, multilock.once(at=datetime.now(UTC) + timedelta(seconds=1)), name=name)
    async with scheduler, multilock.connect_async(server) as other:
        await asyncio.wait_for(running.wait(), 10)
        proxy.blackhole()
        seen["blackhole"] = time.monotonic()

        async def take() -> AsyncLease | None:
            if backend == "postgres" and "cancelled" in seen and "dropped" not in seen:
                # Nothing tells the server the link is dead: end the connection.
                proxy.drop_connections()
                seen["dropped"] = time.monotonic() - seen["blackhole"]
            return await other.try_acquire(name)

        lease = await apoll("another locker taking the lock", take, 10)
        seen["taken"] = time.monotonic() - seen["blackhole"]
        await lease.release()
        proxy.heal()
    return seen


@pytest.mark.parametrize("backend", ["postgres", "redis", "zookeeper"], indirect=True)
def test_blackholed_job_is_cancelled_before_another_takes_over(
    backend: str, server: str, proxy: TcpProxy, measured: Measured
) -> None:
    expected = "its job is cancelled before another replica can take the lock"
    try:
        _, seen = timed(lambda: asyncio.run(_cancelled_then_taken(backend, server, proxy)), 15)
    except AssertionError:
        measured("blackholed scheduler replica running a job", backend, expected, "hung > 15 s")
        raise
    if isinstance(seen, Exception):
        raise seen
    measured(
        "blackholed scheduler replica running a job",
        backend,
        expected,
        f"job cancelled after {seen.get('cancelled', float('nan')):.2f} s; lock taken after"
        f" {seen['taken']:.2f} s"
        + (f" (connection dropped at {seen['dropped']:.2f} s)" if "dropped" in seen else ""),
    )
    assert "cancelled" in seen, "the blackholed replica's job was never cancelled"
    assert seen["cancelled"] <= seen["taken"]
