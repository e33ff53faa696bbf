"""Ways to run a service that has async ``start()``/``stop()``: blocking with signal
handling, inside an asyncio application, or on a background thread."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self

__all__ = ["Service"]


class Service:
    """Base class: subclasses implement :meth:`start` and :meth:`stop`."""

    stop_timeout: float = 30.0
    _serving: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
    _thread: threading.Thread | None = None

    async def start(self) -> None:
        """Start on the running event loop and return."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop gracefully."""
        raise NotImplementedError

    def request_stop(self) -> None:
        """Ask :meth:`serve` (and so :meth:`run` or the background thread) to stop.

        Safe from any thread and from signal handlers; a no-op when not serving.
        """
        serving = self._serving
        if serving is not None:
            loop, event = serving
            loop.call_soon_threadsafe(event.set)

    async def serve(self, started: Callable[[], object] | None = None) -> None:
        """Start, call ``started()``, run until :meth:`request_stop`, then stop."""
        event = asyncio.Event()
        self._serving = (asyncio.get_running_loop(), event)
        try:
            await self.start()
            try:
                if started is not None:
                    started()
                await event.wait()
            finally:
                await self.stop()
        finally:
            self._serving = None

    def run(self) -> None:
        """Run in the calling thread until SIGTERM or SIGINT, then stop gracefully."""
        asyncio.run(self._serve_with_signals())

    async def _serve_with_signals(self) -> None:
        loop = asyncio.get_running_loop()
        installed = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, self.request_stop)
                installed.append(signum)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signals here: request_stop() still works
        try:
            await self.serve()
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    def start_in_background(self) -> None:
        """Run on an event loop in a daemon thread (for sync applications); returns
        once started, or raises what starting raised."""
        if self._thread is not None:
            raise RuntimeError(f"{self!r} is already running in the background")
        started = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            try:
                await self.serve(started=started.set)
            except BaseException as exc:
                failure.append(exc)
            finally:
                started.set()

        self._thread = threading.Thread(
            target=asyncio.run, args=(main(),), name="multilock-scheduler", daemon=True
        )
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the background thread and wait for it (default: ``stop_timeout`` + 5 s)."""
        thread = self._thread
        if thread is None:
            return
        self.request_stop()
        thread.join(self.stop_timeout + 5 if timeout is None else timeout)
        if thread.is_alive():
            raise TimeoutError(f"{self!r} did not stop in time")
        self._thread = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
