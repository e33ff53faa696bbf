"""Crash of a holder: SIGKILL the process holding a lock, time until another replica
takes it, against the backend's declared bound (its conformance hook)."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

import multilock
from multilock.testing._process import Child
from tests.reliability._common import apoll, crash_bound, fresh_name, with_options
from tests.reliability.conftest import Measured

pytestmark = pytest.mark.faults

TTL = 1.0  # Redis: the lease's ttl, the whole of its bound
SLACK = 1.0  # what the conformance suite allows on top of a bound, for a loaded machine
OPTIONS = {"zookeeper": {"session_timeout": "2s"}}
EXPECTED = {
    "file": "free at once (kernel drops the flock)",
    "postgres": "free at once (session ends)",
    "redis": f"free after the ttl ({TTL:g} s)",
    "zookeeper": "free after the session timeout (2 s)",
}


@pytest.mark.parametrize("backend", ["file", "postgres", "redis", "zookeeper"])
def test_killed_holder_frees_the_lock_within_its_bound(
    backend: str, request: pytest.FixtureRequest, measured: Measured
) -> None:
    url = with_options(request.getfixturevalue(f"{backend}_url"), **OPTIONS.get(backend, {}))
    bound = crash_bound(url, TTL if backend == "redis" else 0.0)
    name = fresh_name("crash")

    async def main() -> tuple[float, int]:
        async with (
            multilock.connect_async(url) as locker,
            Child("async", url, "hold", name, str(TTL)) as holder,
        ):
            await holder.expect("acquired")
            assert await locker.try_acquire(name) is None
            holder.signal(signal.SIGKILL)
            await holder.wait()
            killed = time.monotonic()
            tries = 0

            async def take() -> multilock.AsyncLease | None:
                nonlocal tries
                tries += 1
                return await locker.try_acquire(name)

            lease = await apoll("the lock free after the kill", take, bound + SLACK)
            took = time.monotonic() - killed
            await lease.release()
            return took, tries

    took, tries = asyncio.run(main())
    measured(
        "holder SIGKILLed",
        backend,
        EXPECTED[backend] + f"; bound {bound:g} s + {SLACK:g} s slack",
        f"taken by another replica after {took:.2f} s ({tries} tries)",
    )
    assert took <= bound + SLACK
