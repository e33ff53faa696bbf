"""A watch's waits: each bounded by ``asyncio.timeout`` on the async side; nothing to add on
the sync side, whose every socket operation has its own timeout. (A request's deadline is
its stream's: see ``_streams``.)"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, nullcontext

__all__ = ["async_bounded", "sync_bounded"]


def async_bounded(seconds: float) -> AbstractAsyncContextManager[object]:
    """Cancel the request once ``seconds`` have passed (then ``TimeoutError``)."""
    return asyncio.timeout(seconds)


def sync_bounded(seconds: float) -> nullcontext[None]:
    """Nothing: the sync socket's own timeouts bound each phase."""
    return nullcontext()
