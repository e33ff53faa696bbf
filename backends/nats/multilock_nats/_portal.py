"""An event loop in a thread of its own: where nats-py runs for the sync API and renewal.

nats-py is asyncio only. A sync locker runs its client in a portal and waits for each
call there; a locker's renewal runs in one too (the sync locker's own, or one beside an
async locker), so that an application's blocked event loop cannot starve it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

__all__ = ["Portal"]

T = TypeVar("T")
_STOP_WAIT = 5.0


class Portal:
    """A running event loop and its thread (a daemon: it never keeps a process alive)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``work`` in the portal's loop."""
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def call(self, work: Coroutine[Any, Any, T], limit: float) -> T:
        """Run ``work`` in the portal's loop and wait for its outcome, at most ``limit``
        seconds (then ``TimeoutError``, with the work cancelled)."""
        future = self.submit(work)
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no outcome within {limit:g}s") from None

    def call_started(
        self,
        start: Callable[[], asyncio.Future[T] | None],
        work: Callable[[], Coroutine[Any, Any, T]],
        limit: float,
    ) -> T:
        """:meth:`call`, with no task where it can: ``start()``, in the portal's loop,
        sends the request and returns a future of its outcome, or ``None`` with nothing
        sent -- then ``work()`` runs as :meth:`call` runs it."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        running: list[asyncio.Future[T]] = []

        def begin() -> None:
            if not done.set_running_or_notify_cancel():
                return  # timed out before it began
            try:
                future = start() or asyncio.ensure_future(work())
            except BaseException as exc:
                done.set_exception(exc)
                return
            running.append(future)
            future.add_done_callback(partial(_copy, done))

        self.loop.call_soon_threadsafe(begin)
        try:
            return done.result(limit)
        except concurrent.futures.TimeoutError:
            # A started request ends by its own timeout; a task is cancelled, as by call.
            done.cancel()
            self.loop.call_soon_threadsafe(lambda: [f.cancel() for f in running])
            raise TimeoutError(f"no outcome within {limit:g}s") from None

    def stop(self, last: Coroutine[Any, Any, object] | None = None) -> None:
        """Run ``last`` (a cleanup), then stop the loop and wait for the thread."""
        if not self._thread.is_alive():
            if last is not None:
                last.close()
            return
        if last is not None:
            try:
                self.call(last, _STOP_WAIT)
            except Exception:  # a cleanup's failure must not keep the thread
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(_STOP_WAIT)


def _copy(into: concurrent.futures.Future[T], future: asyncio.Future[T]) -> None:
    """Settle ``into`` as ``future`` was (unless it was given up on)."""
    if into.done():
        return
    if future.cancelled():
        into.cancel()
    elif (error := future.exception()) is not None:
        into.set_exception(error)
    else:
        into.set_result(future.result())
