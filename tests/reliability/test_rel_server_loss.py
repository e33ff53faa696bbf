"""Server-side loss while a job runs: the lock session terminated, the lease's key
deleted, the ZooKeeper session expired (on the shared servers, through each backend's
conformance hook), and restarts of PostgreSQL, Redis and ZooKeeper (on private
throwaway servers). Two scheduler replicas run one job; the fault hits the replica
running it. Expected: ``lease_lost`` fires within the bound, the run is cancelled,
both schedulers keep running and reconnect, and every tick after recovery runs
exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from multilock.backend import LockURL
from multilock.testing._servers.postgres import PrivateServer, private_server
from multilock.testing._servers.redis import RedisServer
from multilock.testing._servers.zookeeper import PrivateZooKeeper
from multilock_redis._keys import lock_key
from tests.reliability import _private
from tests.reliability._common import crash_bound, fresh_name, hooks, with_options
from tests.reliability._replicas import Outcome, run_replicas
from tests.reliability.conftest import Measured

pytestmark = [pytest.mark.faults, pytest.mark.slow]

LOST_WITHIN = 3.0
FAST = {
    "postgres": {"health_interval": "0.3s", "health_timeout": "1s", "connect_timeout": "1s"},
    "redis": {"socket_timeout": "0.5s", "connect_timeout": "0.5s"},
    "zookeeper": {"session_timeout": "2s", "connect_timeout": "1s"},
}
BREAK = {
    "postgres": "pg_terminate_backend of the lock session",
    "redis": "lease's key deleted on the server",
    "zookeeper": "session expired",
}


def _check(outcome: Outcome, measured: Measured, fault: str, backend: str) -> None:
    counts = outcome.runs_per_tick()
    later = outcome.later_ticks()
    twice = sorted(t for t in later if counts[t] > 1)
    missed = sorted(t for t in later if counts[t] == 0)
    lost = "never" if outcome.lost_after is None else f"{outcome.lost_after:.2f} s"
    measured(
        fault,
        backend,
        f"lease_lost within {LOST_WITHIN:g} s, run cancelled, every tick from"
        f" {outcome.settle:g} s after recovery once",
        f"lease_lost after {lost}; run cancelled: {outcome.cancelled}; {len(later)} later"
        f" ticks: {len(twice)} twice, {len(missed)} missed",
    )
    assert outcome.lost_after is not None, "lease_lost never fired"
    assert outcome.lost_after <= LOST_WITHIN
    assert outcome.cancelled, "the run whose lease was lost went on"
    assert len(later) >= 2, f"too few ticks after recovery: {later}"
    assert not twice, f"ticks run twice after recovery: {twice}"
    assert not missed, f"ticks missed after recovery: {missed}"


@pytest.mark.parametrize("backend", ["postgres", "redis", "zookeeper"])
def test_server_side_loss_cancels_the_run(
    backend: str, request: pytest.FixtureRequest, measured: Measured
) -> None:
    url = with_options(request.getfixturevalue(f"{backend}_url"), **FAST[backend])
    name = fresh_name("loss")

    async def fault(victim: int, locker: Any) -> float:
        lease = SimpleNamespace(key=lock_key(name))  # Redis deletes it; others ignore it
        breaker = hooks(url).break_lease
        await asyncio.to_thread(breaker, LockURL.parse(url), locker, lease)
        return time.time()

    outcome = asyncio.run(run_replicas(url, name, fault, LOST_WITHIN))
    _check(outcome, measured, BREAK[backend], backend)


@pytest.mark.parametrize("backend", ["postgres", "redis", "zookeeper"])
def test_server_restart_cancels_the_run_and_replicas_reconnect(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, measured: Measured
) -> None:
    server: PrivateServer | RedisServer | PrivateZooKeeper
    if backend == "postgres":
        server = private_server(request.config)
    elif backend == "redis":
        server = _private.redis_server(request.config, tmp_path)
    else:
        server = _private.zookeeper_server(request.config, tmp_path / "zk")
    url = with_options(server.url, **FAST[backend])
    name = fresh_name("restart")
    # A ZooKeeper restarted with its data keeps the sessions, and the victim's node,
    # until the victim reconnects and deletes it or its session times out.
    settle = crash_bound(url, 0.0) + 1.0 if backend == "zookeeper" else 0.5

    async def fault(victim: int, locker: Any) -> float:
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(1.0)  # down long enough for every detector to notice
        await asyncio.to_thread(server.start)
        return time.time()

    try:
        outcome = asyncio.run(run_replicas(url, name, fault, LOST_WITHIN, settle))
    finally:
        getattr(server, "remove", server.stop)()
    _check(outcome, measured, f"{backend} restart", backend)
