"""The ``lost`` signal of a lease: checkable, awaitable, blocking-waitable, with callbacks."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Generator
from typing import Any

__all__ = ["LostSignal"]

_log = logging.getLogger("multilock")
_GUARD = threading.Lock()  # one process-wide guard: signals fire rarely, and leases stay small


class LostSignal:
    """Tells a holder that its lease is gone.

    Usable from both worlds: ``signal.is_set()`` to check, ``signal.wait(t)``
    to block a thread, ``await signal`` in asyncio, and ``add_callback(fn)``
    to be called (once, with the reason) from whichever thread notices the
    loss. A backend fires it with :meth:`set`; firing twice is harmless.
    """

    __slots__ = ("_callbacks", "_event", "_reason")

    def __init__(self) -> None:
        self._reason: str | None = None
        # One callback is kept as it is, more in a list: a lease has one watcher most
        # often (the scheduler's run), and a list each would be one more object per lease.
        self._callbacks: Callable[[str], object] | list[Callable[[str], object]] | None = None
        self._event: threading.Event | None = None  # made only when someone blocks on it

    def is_set(self) -> bool:
        """Whether the lease has been lost."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why the lease was lost (``None`` while it is held)."""
        return self._reason

    def set(self, reason: str) -> bool:
        """Fire the signal. Returns ``False`` when it had fired already. For backends."""
        with _GUARD:
            if self._reason is not None:
                return False
            self._reason = reason or "lost"
            callbacks, self._callbacks = _as_list(self._callbacks), None
            event = self._event
        if event is not None:
            event.set()
        for callback in callbacks:
            _call(callback, self._reason)
        return True

    def add_callback(self, callback: Callable[[str], object]) -> None:
        """Call ``callback(reason)`` when the lease is lost; at once if it already is."""
        with _GUARD:
            if self._reason is None:
                held = self._callbacks
                if held is None:
                    self._callbacks = callback
                elif isinstance(held, list):
                    held.append(callback)
                else:
                    self._callbacks = [held, callback]
                return
        _call(callback, self._reason)

    def remove_callback(self, callback: Callable[[str], object]) -> None:
        """Forget ``callback``; no error if it was never added."""
        with _GUARD:
            held = self._callbacks
            if isinstance(held, list):
                if callback in held:
                    held.remove(callback)
            elif held is not None and held == callback:
                self._callbacks = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost or ``timeout`` passes; return whether it was lost."""
        with _GUARD:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def __await__(self) -> Generator[Any, None, str]:
        """``await lease.lost`` returns the reason once the lease is lost."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()

        def wake(reason: str) -> None:
            def resolve() -> None:
                if not future.done():
                    future.set_result(reason)

            if loop.is_closed():
                return
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                resolve()
            else:
                loop.call_soon_threadsafe(resolve)

        self.add_callback(wake)
        try:
            return (yield from future.__await__())
        finally:
            self.remove_callback(wake)

    def __repr__(self) -> str:
        state = f"lost: {self._reason}" if self._reason is not None else "held"
        return f"<LostSignal {state}>"


def _as_list(
    callbacks: Callable[[str], object] | list[Callable[[str], object]] | None,
) -> list[Callable[[str], object]]:
    if callbacks is None:
        return []
    return callbacks if isinstance(callbacks, list) else [callbacks]


def _call(callback: Callable[[str], object], reason: str) -> None:
    try:
        callback(reason)
    except Exception:  # a listener's bug must not stop the others or the backend
        _log.exception("lost-signal callback %r raised", callback)
