"""Polling with a deadline: how tests wait for something to become true, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from multilock.errors import BackendUnavailable

__all__ = ["apoll", "poll"]

T = TypeVar("T")
_NOT_YET: tuple[type[BaseException], ...] = (BackendUnavailable,)


def poll(
    what: str,
    probe: Callable[[], T | None],
    within: float,
    every: float = 0.02,
    *,
    not_yet: tuple[type[BaseException], ...] = _NOT_YET,
) -> T:
    """Call ``probe()`` until it returns something truthy and return that.

    An exception in ``not_yet`` (by default ``BackendUnavailable``: a server
    coming back) counts as "not yet". After ``within`` seconds, fail with an
    ``AssertionError`` that names ``what``.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            result = probe()
        except not_yet:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not so after {within:g} s")
        time.sleep(every)


async def apoll(
    what: str,
    probe: Callable[[], Awaitable[T | None]],
    within: float,
    every: float = 0.02,
    *,
    not_yet: tuple[type[BaseException], ...] = _NOT_YET,
) -> T:
    """The async :func:`poll`: awaits ``probe()`` and sleeps without blocking the loop."""
    deadline = time.monotonic() + within
    while True:
        try:
            result = await probe()
        except not_yet:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not so after {within:g} s")
        await asyncio.sleep(every)
