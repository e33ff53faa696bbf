"""Waiting for kazoo's asynchronous results, from a thread or from asyncio.

kazoo has no asyncio API: every request returns an ``IAsyncResult`` that
kazoo's own threads complete. The sync side blocks on it; the async side
registers a ``rawlink`` callback, which kazoo runs on its completion thread,
and that callback wakes an asyncio future through ``call_soon_threadsafe``.
No thread is started per call. Both only *wait*: they never take a result
apart, so that what a result means is decided once, in ``_session``.

The ``_async`` locker calls ``async_settle`` and ``async_stop``;
``scripts/async_to_sync.py`` turns them into ``sync_settle`` and ``sync_stop`` in the
generated ``_sync`` locker. ``async_outcome`` serves the async API's hot path
(``_started``): the outcome of what results mean, settled on the loop, which the
core awaits with no task of its own; its requests are ``_requests.Sent``, whose
callback kazoo's connection thread runs itself (no hop through the completion thread).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from multilock.backend import Outcome

from ._requests import Sent

__all__ = ["async_outcome", "async_settle", "async_stop", "sync_settle", "sync_stop"]

T = TypeVar("T")


def sync_settle(result: Any, deadline: float) -> bool:
    """Block until ``result`` is ready or ``deadline`` (monotonic) passes; return readiness."""
    if result.ready():
        return True
    return bool(result.wait(max(0.0, deadline - time.monotonic())))


async def async_settle(result: Any, deadline: float) -> bool:
    """Await ``result`` without blocking the loop until ready or ``deadline``; return readiness."""
    if result.ready():
        return True
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake(_: Any) -> None:
        try:
            loop.call_soon_threadsafe(_resolve, woken)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
            pass

    result.rawlink(wake)
    # A bare timer, not asyncio.wait_for: this is the hot path of every async call.
    timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()), _resolve, woken)
    try:
        await woken
    finally:
        timer.cancel()
        result.unlink(wake)
    return bool(result.ready())


def async_outcome(results: list[Sent], deadline: float, interpret: Callable[[], T]) -> Outcome[T]:
    """The :class:`~multilock.backend.Outcome` of ``interpret()``, called on the loop once
    every result is ready or ``deadline`` (monotonic) passes: ``async_settle`` then
    interpreting, without a coroutine to drive it."""
    loop = asyncio.get_running_loop()
    outcome: Outcome[T] = Outcome(loop=loop)
    waiting = [result for result in results if not result.ready()]
    if not waiting:
        _settle(outcome, interpret)
        return outcome

    def settle() -> None:
        if timer.cancelled():
            return  # settled already (a wake queued before the deadline passed)
        timer.cancel()
        for result in waiting:
            result.forget()
        _settle(outcome, interpret)

    def woken() -> None:
        if all(result.ready() for result in waiting):
            settle()

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(woken)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
            pass

    timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()), settle)
    for result in waiting:
        result.when_ready(wake)
    return outcome


def _settle(outcome: Outcome[T], interpret: Callable[[], T]) -> None:
    try:
        outcome.set_result(interpret())
    except Exception as exc:
        outcome.set_exception(exc)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def sync_stop(stop: Callable[[], None]) -> None:
    """Run kazoo's blocking session close."""
    stop()


async def async_stop(stop: Callable[[], None]) -> None:
    """Run kazoo's blocking session close off the loop: it joins kazoo's threads, which
    takes a round trip when connected. Once per locker, so one short-lived thread is fine."""
    await asyncio.to_thread(stop)
