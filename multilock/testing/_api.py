"""One adapter over the sync and the async API, so that each check is written once.

A check is an ``async def`` that talks to a backend only through an
:class:`Api`. :class:`AsyncApi` awaits the async methods directly;
:class:`SyncApi` calls the *sync* methods, each in a thread of its own, so
that concurrent contenders of the sync variant are real threads calling the
sync API at the same time. Every call has a deadline: a backend that hangs
fails the check that hung instead of hanging the test run.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import suppress
from typing import Any, TypeVar

import multilock
from multilock.backend import Duration

__all__ = [
    "OP_TIMEOUT",
    "TRY_LIMIT",
    "Api",
    "AsyncApi",
    "BaseCancel",
    "SyncApi",
    "in_thread",
    "make_api",
]

T = TypeVar("T")

OP_TIMEOUT = 10.0
"""Seconds any single call may take before the check fails as hung."""
TRY_LIMIT = 3.0
"""Seconds any ``try_acquire`` may take, in every check: it must never wait for a
holder, so a backend that queues fails fast instead of stalling each check."""


class BaseCancel(BaseException):
    """Raised inside a sync ``with lease:`` to unwind it the way a cancellation would
    (like ``KeyboardInterrupt``: not an ``Exception``)."""


def in_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """Run ``fn`` in a new daemon thread; the future resolves with its outcome.

    A daemon thread per call (not a pool): a backend call that never returns
    must not keep the interpreter, and the test run, from exiting.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting check, whatever it is
            error = exc
            with suppress(RuntimeError):  # the loop is gone: the check gave up already
                loop.call_soon_threadsafe(settle, lambda: future.set_exception(error))
        else:
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, lambda: future.set_result(result))

    threading.Thread(target=work, name="multilock-conformance", daemon=True).start()
    return future


async def _bounded(what: str, work: Awaitable[T], limit: float = OP_TIMEOUT) -> T:
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise  # the call's own (LockTimeout is a TimeoutError)
        raise AssertionError(f"{what} did not return within {limit:g} s (hung?)") from None


class Api:
    """The calls a check makes; one subclass per API. Lockers opened through
    :meth:`connect` are closed by :meth:`close_all` at the end of the check."""

    kind = ""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lockers: list[Any] = []

    async def connect(self) -> Any:
        """A new, independent locker (its own connection) on the URL."""
        raise NotImplementedError

    async def close(self, locker: Any) -> None:
        """Close ``locker``, which releases its leases."""
        raise NotImplementedError

    async def try_acquire(self, locker: Any, name: str, ttl: Duration | None = None) -> Any:
        """``locker.try_acquire(name, ttl=ttl)``."""
        raise NotImplementedError

    async def try_acquire_many(
        self, locker: Any, names: Iterable[str], ttl: Duration | None = None
    ) -> Mapping[str, Any]:
        """``locker.try_acquire_many(names, ttl=ttl)``."""
        raise NotImplementedError

    async def acquire(
        self,
        locker: Any,
        name: str,
        timeout: Duration | None = None,
        ttl: Duration | None = None,
        limit: float = OP_TIMEOUT,
    ) -> Any:
        """``locker.acquire(name, timeout=timeout, ttl=ttl)``, failing as hung after
        ``limit`` seconds."""
        raise NotImplementedError

    async def release(self, lease: Any) -> bool:
        """``lease.release()``."""
        raise NotImplementedError

    async def extend(self, lease: Any, ttl: Duration | None = None) -> None:
        """``lease.extend(ttl)``."""
        raise NotImplementedError

    async def unwind(self, lease: Any, exc: BaseException) -> None:
        """Enter ``lease`` as a context manager and raise ``exc`` inside it."""
        raise NotImplementedError

    async def locks(self, locker: Any) -> list[Any]:
        """``locker.locks()`` (INTROSPECTION backends)."""
        raise NotImplementedError

    async def claim_ticks(self, locker: Any, ticks: Mapping[str, Any]) -> Mapping[str, bool]:
        """``locker.claim_ticks(ticks)`` (TICK_CLAIM backends)."""
        raise NotImplementedError

    async def close_all(self) -> None:
        """Close every locker this API opened (errors ignored: the check has its verdict)."""
        for locker in reversed(self._lockers):
            with suppress(Exception):
                await self.close(locker)
        self._lockers.clear()


class SyncApi(Api):
    """Drives ``multilock.connect`` lockers through their sync methods, in threads."""

    kind = "sync"

    async def _call(self, what: str, fn: Callable[[], T], limit: float = OP_TIMEOUT) -> T:
        return await _bounded(what, asyncio.shield(in_thread(fn)), limit)

    async def connect(self) -> Any:
        """A new sync locker, connected in a thread."""
        locker = await self._call("connect()", lambda: multilock.connect(self.url))
        self._lockers.append(locker)
        return locker

    async def close(self, locker: Any) -> None:
        """``locker.close()`` in a thread."""
        await self._call("close()", locker.close)

    async def try_acquire(self, locker: Any, name: str, ttl: Duration | None = None) -> Any:
        """``locker.try_acquire`` in a thread."""
        return await self._call(
            "try_acquire()", lambda: locker.try_acquire(name, ttl=ttl), TRY_LIMIT
        )

    async def try_acquire_many(
        self, locker: Any, names: Iterable[str], ttl: Duration | None = None
    ) -> Mapping[str, Any]:
        """``locker.try_acquire_many`` in a thread."""
        names = list(names)
        result: Mapping[str, Any] = await self._call(
            "try_acquire_many()", lambda: locker.try_acquire_many(names, ttl=ttl), TRY_LIMIT
        )
        return result

    async def acquire(
        self,
        locker: Any,
        name: str,
        timeout: Duration | None = None,
        ttl: Duration | None = None,
        limit: float = OP_TIMEOUT,
    ) -> Any:
        """``locker.acquire`` in a thread."""
        return await self._call(
            "acquire()", lambda: locker.acquire(name, timeout=timeout, ttl=ttl), limit
        )

    async def release(self, lease: Any) -> bool:
        """``lease.release()`` in a thread."""
        released: bool = await self._call("release()", lease.release)
        return released

    async def extend(self, lease: Any, ttl: Duration | None = None) -> None:
        """``lease.extend(ttl)`` in a thread."""
        await self._call("extend()", lambda: lease.extend(ttl))

    async def unwind(self, lease: Any, exc: BaseException) -> None:
        """``with lease: raise exc`` in a thread."""

        def body() -> None:
            with lease:
                raise exc

        await self._call("with lease:", body)

    async def locks(self, locker: Any) -> list[Any]:
        """``locker.locks()`` in a thread."""
        found: list[Any] = await self._call("locks()", locker.locks)
        return found

    async def claim_ticks(self, locker: Any, ticks: Mapping[str, Any]) -> Mapping[str, bool]:
        """``locker.claim_ticks(ticks)`` in a thread."""
        ticks = dict(ticks)
        won: Mapping[str, bool] = await self._call(
            "claim_ticks()", lambda: locker.claim_ticks(ticks), TRY_LIMIT
        )
        return won


class AsyncApi(Api):
    """Drives ``multilock.connect_async`` lockers by awaiting their methods."""

    kind = "async"

    async def connect(self) -> Any:
        """A new async locker, entered (connected)."""
        locker: Any = multilock.connect_async(self.url)
        self._lockers.append(locker)
        await _bounded("async with locker", locker.__aenter__())
        return locker

    async def close(self, locker: Any) -> None:
        """``await locker.aclose()``."""
        await _bounded("aclose()", locker.aclose())

    async def try_acquire(self, locker: Any, name: str, ttl: Duration | None = None) -> Any:
        """``await locker.try_acquire(...)``."""
        return await _bounded("try_acquire()", locker.try_acquire(name, ttl=ttl), TRY_LIMIT)

    async def try_acquire_many(
        self, locker: Any, names: Iterable[str], ttl: Duration | None = None
    ) -> Mapping[str, Any]:
        """``await locker.try_acquire_many(...)``."""
        result: Mapping[str, Any] = await _bounded(
            "try_acquire_many()", locker.try_acquire_many(list(names), ttl=ttl), TRY_LIMIT
        )
        return result

    async def acquire(
        self,
        locker: Any,
        name: str,
        timeout: Duration | None = None,
        ttl: Duration | None = None,
        limit: float = OP_TIMEOUT,
    ) -> Any:
        """``await locker.acquire(...)``."""
        return await _bounded("acquire()", locker.acquire(name, timeout=timeout, ttl=ttl), limit)

    async def release(self, lease: Any) -> bool:
        """``await lease.release()``."""
        released: bool = await _bounded("release()", lease.release())
        return released

    async def extend(self, lease: Any, ttl: Duration | None = None) -> None:
        """``await lease.extend(ttl)``."""
        await _bounded("extend()", lease.extend(ttl))

    async def unwind(self, lease: Any, exc: BaseException) -> None:
        """``async with lease: raise exc``."""

        async def body() -> None:
            async with lease:
                raise exc

        await _bounded("async with lease:", body())

    async def locks(self, locker: Any) -> list[Any]:
        """``locker.locks()``, awaited where the async locker makes it a coroutine."""
        found = locker.locks()
        if inspect.isawaitable(found):
            found = await _bounded("locks()", found)
        return list(found)

    async def claim_ticks(self, locker: Any, ticks: Mapping[str, Any]) -> Mapping[str, bool]:
        """``await locker.claim_ticks(ticks)``."""
        won: Mapping[str, bool] = await _bounded(
            "claim_ticks()", locker.claim_ticks(dict(ticks)), TRY_LIMIT
        )
        return won


def make_api(kind: str, url: str) -> Api:
    """The adapter for ``kind`` (``"sync"`` or ``"async"``)."""
    if kind == "sync":
        return SyncApi(url)
    if kind == "async":
        return AsyncApi(url)
    raise ValueError(f"unknown API kind {kind!r}: expected 'sync' or 'async'")
