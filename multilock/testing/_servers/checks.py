"""What the backends' TLS and fault tests check alike, over a lock URL: a lock that works,
a connection refused promptly in one line, no call outliving its timeout on a frozen
server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar

import pytest

import multilock
from multilock.errors import BackendUnavailable, MultilockError

__all__ = [
    "Freezable",
    "Operation",
    "call",
    "frozen_acquire_fails_promptly",
    "frozen_outcome",
    "raises_promptly",
    "refused",
    "works",
]

E = TypeVar("E", bound=MultilockError)
Operation = Literal["connect", "release", "extend", "locks"]
"""What :func:`frozen_outcome` tries on a frozen server: a first acquire (a new
connection), or a release, an extend, ``locks()`` over a connection already made."""


class Freezable(Protocol):
    """A server a test can freeze (SIGSTOP) and thaw."""

    def freeze(self) -> None:
        """Stop the server where it stands: connections stay open, nothing answers."""

    def thaw(self) -> None:
        """Let it go on."""


def works(url: str, lease_type: type[object]) -> None:
    """A lock can be taken over ``url`` (a ``lease_type``: the backend's lease class), is
    exclusive and is released."""
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("over-tls")
        assert lease is not None, "not granted"
        assert isinstance(lease, lease_type), f"expected a {lease_type.__name__}, got {lease!r}"
        assert locker.try_acquire("over-tls") is None
        assert lease.release()


def refused(
    url: str,
    api: str = "sync",
    *,
    within: float,
    error: type[E] = BackendUnavailable,  # type: ignore[assignment]
) -> E:
    """The ``error`` of an acquire over ``url`` with the ``api`` ("sync" or "async"): in
    one line, within ``within`` seconds."""
    start = time.monotonic()
    if api == "sync":
        with multilock.connect(url) as locker, pytest.raises(error) as raised:
            locker.try_acquire("over-tls")
    else:

        async def main() -> pytest.ExceptionInfo[E]:
            async with multilock.connect_async(url) as locker:
                with pytest.raises(error) as raised:
                    await locker.try_acquire("over-tls")
                return raised

        raised = asyncio.run(main())
    elapsed = time.monotonic() - start
    assert elapsed < within, f"refused after {elapsed:.2f}s"
    assert "\n" not in str(raised.value)
    return raised.value


def raises_promptly(call: Callable[[], object], within: float) -> BackendUnavailable:
    """The ``BackendUnavailable`` that ``call()`` raises within ``within`` seconds."""
    start = time.monotonic()
    with pytest.raises(BackendUnavailable) as raised:
        call()
    elapsed = time.monotonic() - start
    assert elapsed < within, f"took {elapsed:.2f}s"
    return raised.value


async def call(result: Any) -> Any:
    """The value of a sync call, or of an async one awaited: one scenario, both APIs."""
    return await result if asyncio.iscoroutine(result) else result


def frozen_acquire_fails_promptly(url: str, server: Freezable, within: float) -> None:
    """With the async API, an acquire on ``server`` frozen after a first one raises
    "no answer in time" within ``within`` seconds instead of hanging."""

    async def main() -> None:
        async with multilock.connect_async(url) as locker:
            assert await locker.try_acquire("warm-up") is not None
            server.freeze()
            try:
                start = time.monotonic()
                with pytest.raises(BackendUnavailable, match="no answer in time"):
                    await locker.try_acquire("frozen")
                assert time.monotonic() - start < within
            finally:
                server.thaw()

    asyncio.run(main())


def frozen_outcome(
    url: str, server: Freezable, api: str, operation: Operation, within: float
) -> object:
    """Try ``operation`` over ``url`` with the ``api`` ("sync" or "async") while
    ``server`` is frozen (SIGSTOP: the kernel still completes TCP handshakes and takes
    bytes; nothing answers); assert that it ended within ``within`` seconds. What it
    returned, or the type of the ``MultilockError`` it raised."""

    async def attempt(locker: Any, lease: Any) -> object:
        try:
            if operation == "connect":
                return await call(locker.try_acquire("frozen"))
            if operation == "locks":
                return await call(locker.locks())
            return await call(getattr(lease, operation)())
        except MultilockError as exc:
            return type(exc)

    async def main() -> object:
        locker: Any = (multilock.connect if api == "sync" else multilock.connect_async)(url)
        try:
            lease = None if operation == "connect" else await call(locker.try_acquire("held"))
            server.freeze()
            try:
                start = time.monotonic()
                outcome = await attempt(locker, lease)
                elapsed = time.monotonic() - start
                assert elapsed < within, f"{operation} took {elapsed:.2f}s"
            finally:
                server.thaw()
        finally:
            await call(locker.close() if api == "sync" else locker.aclose())
        return outcome

    return asyncio.run(main())
