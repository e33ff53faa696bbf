"""The locker on psycopg's pure-Python libpq wrapper, the one users get without
``multilock-postgres[binary]``: the test run itself uses the C implementation
when it is installed, so this path is run in a subprocess that asks for it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

_CHILD = """
import asyncio, sys, uuid
import psycopg
import multilock

assert psycopg.pq.__impl__ == "python", psycopg.pq.__impl__
url = sys.argv[1]
names = [f"impl-{uuid.uuid4().hex}-{i}" for i in range(50)]

with multilock.connect(url) as locker, multilock.connect(url) as other:
    leases = locker.try_acquire_many(names)
    tokens = [lease.fencing_token for lease in leases.values()]
    assert all(isinstance(token, int) and token > 0 for token in tokens), tokens
    assert len(set(tokens)) == len(tokens)
    assert other.try_acquire_many(names[:5]) == dict.fromkeys(names[:5])
    assert {info.name for info in locker.locks()} >= set(names)
    assert all(lease.release() for lease in leases.values())
    single = other.try_acquire(names[0])
    assert single is not None and single.fencing_token > max(tokens)
    assert single.release()

async def main() -> None:
    async with multilock.connect_async(url) as locker:
        leases = await locker.try_acquire_many(names)
        assert all(leases.values())
        assert (await locker.try_acquire(names[0])) is None
        for lease in leases.values():
            assert await lease.release()

asyncio.run(main())
print("ok")
"""


def test_pure_python_psycopg(make_url: Callable[..., str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, make_url(fencing=True)],
        env={**os.environ, "PSYCOPG_IMPL": "python"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
