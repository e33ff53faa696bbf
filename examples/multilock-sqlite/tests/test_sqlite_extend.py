"""``extend()`` without a ttl pushes the expiry by the acquire's ttl (the kit's contract)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

from multilock_sqlite import SQLiteLocker

import multilock


def _remaining(path: Path, name: str) -> float:
    """Seconds until the row of ``name`` expires, as another process would read it."""
    with multilock.connect(f"sqlite:///{path}") as viewer:
        assert isinstance(viewer, SQLiteLocker)
        found = viewer.locks()
    for info in found:
        if info.name == name:
            assert info.expires_at is not None
            left: float = (info.expires_at - datetime.now(UTC)).total_seconds()
            return left
    raise AssertionError(f"{name!r} is not held")


def test_extend_default_is_the_acquire_ttl(tmp_path: Path) -> None:
    """try_acquire(ttl=1) then extend(): about 1 s left (not the URL's 30 s default)."""
    path = tmp_path / "locks.db"
    with multilock.connect(f"sqlite:///{path}") as locker:
        lease = locker.try_acquire("job", ttl=1)
        assert lease is not None
        time.sleep(0.2)
        lease.extend()
        assert lease.expires_at is not None
        left = (lease.expires_at - datetime.now(UTC)).total_seconds()
        assert 0.7 < left <= 1.0, f"expires_at is {left:.2f} s away after extend()"
        assert 0.7 < _remaining(path, "job") <= 1.0
        lease.extend(5)
        assert 4.7 < _remaining(path, "job") <= 5.0


def test_async_extend_default_is_the_acquire_ttl(tmp_path: Path) -> None:
    """The same through the async API."""
    path = tmp_path / "locks.db"

    async def main() -> None:
        async with multilock.connect_async(f"sqlite:///{path}") as locker:
            lease = await locker.try_acquire("job", ttl=1)
            assert lease is not None
            await lease.extend()
            assert 0.7 < _remaining(path, "job") <= 1.0

    asyncio.run(main())
