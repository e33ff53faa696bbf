"""A tiny cross-process TTL backend, correct or with one flaw, for the model check's tests.

``modeltoy:///path/to/table.json?flaw=F``: leases live in a JSON file that every
call reads and writes under an ``flock``, so lockers in other processes share
them. ``F`` is ``none`` (correct: TTL, FENCING, CROSS_PROCESS, INTROSPECTION) or
one defect the hand-written checks of the suite miss:

* ``stale-extend``: ``extend()`` of a lease that expired and was taken by another
  holder succeeds silently (it checks nothing).
* ``process-tokens``: owner tokens are a per-process counter, unique within one
  process only, so a stale holder in one process can release a fresh holder's
  lock in another.

Child processes find it through an entry point (``tests/test_model_check.py``
writes one); it is not installed.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from multilock.backend import (
    AsyncLeaseBase,
    AsyncLockerBase,
    Capability,
    LeaseBase,
    LockerBase,
    LockInfo,
    LockURL,
    OptionParser,
    as_duration,
    new_token,
)
from multilock.errors import NotOwner

__all__ = ["FLAWS", "backend"]

FLAWS = ("none", "stale-extend", "process-tokens")
_OPTIONS = OptionParser({"ttl": as_duration, "flaw": str}, {"ttl": 30.0, "flaw": "none"})
_counter = itertools.count(1)
T = TypeVar("T")


class _Table:
    """name -> [token, expiry (Unix time)], and name -> last fencing token."""

    def __init__(self, path: str, flaw: str) -> None:
        self.path = Path(path)
        self.flaw = flaw

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with open(f"{self.path}.lock", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            text = self.path.read_text() if self.path.exists() else ""
            state = json.loads(text) if text else {"holders": {}, "fences": {}}
            yield state
            self.path.write_text(json.dumps(state))

    def token(self) -> str:
        return str(next(_counter)) if self.flaw == "process-tokens" else new_token()

    def take(self, name: str, token: str, ttl: float) -> int | None:
        with self._state() as state:
            now = time.time()
            held = state["holders"].get(name)
            if held is not None and held[1] > now:
                return None
            state["holders"][name] = [token, now + ttl]
            fence: int = state["fences"].get(name, 0) + 1
            state["fences"][name] = fence
            return fence

    def drop(self, name: str, token: str) -> bool:
        with self._state() as state:
            held = state["holders"].get(name)
            if held is None or held[0] != token:
                return False
            del state["holders"][name]
            return True

    def extend(self, name: str, token: str, ttl: float) -> bool:
        with self._state() as state:
            now = time.time()
            held = state["holders"].get(name)
            if held is None or held[0] != token or held[1] <= now:
                return self.flaw == "stale-extend"
            held[1] = now + ttl
            return True

    def holders(self) -> list[LockInfo]:
        with self._state() as state:
            now = time.time()
            return [
                LockInfo(key=name, name=name, expires_at=datetime.fromtimestamp(exp, UTC))
                for name, (_token, exp) in state["holders"].items()
                if exp > now
            ]


class _Lease(LeaseBase):
    __slots__ = ("acquired_ttl", "mine", "table")
    table: _Table
    mine: set[Any]
    acquired_ttl: float

    def _release(self) -> bool:
        self.mine.discard(self)
        return self.table.drop(self.name, self.token)

    def _extend(self, ttl: float | None) -> float | None:
        seconds = self.acquired_ttl if ttl is None else ttl
        if not self.table.extend(self.name, self.token, seconds):
            raise NotOwner(f"lease on {self.name!r} expired")
        return seconds


class _AsyncLease(AsyncLeaseBase):
    __slots__ = ("acquired_ttl", "mine", "table")
    table: _Table
    mine: set[Any]
    acquired_ttl: float

    async def _release(self) -> bool:
        self.mine.discard(self)
        return await asyncio.to_thread(self.table.drop, self.name, self.token)

    async def _extend(self, ttl: float | None) -> float | None:
        seconds = self.acquired_ttl if ttl is None else ttl
        if not await asyncio.to_thread(self.table.extend, self.name, self.token, seconds):
            raise NotOwner(f"lease on {self.name!r} expired")
        return seconds


class _Common:
    capabilities = frozenset(
        {Capability.TTL, Capability.FENCING, Capability.CROSS_PROCESS, Capability.INTROSPECTION}
    )

    def _setup(self, url: LockURL) -> float:
        values, _ = _OPTIONS.parse(url)
        self.table = _Table(url.path, values["flaw"])
        self.mine: set[Any] = set()
        return float(values["ttl"])

    def _grant(self, cls: Callable[..., T], name: str, ttl: float) -> T | None:
        token = self.table.token()
        fence = self.table.take(name, token, ttl)
        if fence is None:
            return None
        lease: Any = cls(name, name, token, fence, ttl)
        lease.table, lease.mine, lease.acquired_ttl = self.table, self.mine, ttl
        self.mine.add(lease)
        return lease  # type: ignore[no-any-return]

    def _drop_all(self) -> None:
        for lease in list(self.mine):
            lease._released = True
            self.table.drop(lease.name, lease.token)
        self.mine.clear()


class _Locker(_Common, LockerBase):
    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        return self._grant(_Lease, name, ttl)

    def locks(self) -> list[LockInfo]:
        return self.table.holders()

    def _close(self) -> None:
        self._drop_all()


class _AsyncLocker(_Common, AsyncLockerBase):
    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        return await asyncio.to_thread(self._grant, _AsyncLease, name, ttl)

    async def locks(self) -> list[LockInfo]:
        return await asyncio.to_thread(self.table.holders)

    async def _close(self) -> None:
        await asyncio.to_thread(self._drop_all)


class _Backend:
    conformance = None

    def connect(self, url: LockURL) -> _Locker:
        return _Locker(url)

    def connect_async(self, url: LockURL) -> _AsyncLocker:
        return _AsyncLocker(url)


backend = _Backend()
"""What the ``modeltoy`` entry point resolves to."""
