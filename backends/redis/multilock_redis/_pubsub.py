"""Closing a waiting acquire's pub/sub connection: both APIs' forms, written by hand.

The ``_async`` locker calls ``async_close_pubsub``; ``scripts/async_to_sync.py`` turns
it into ``sync_close_pubsub`` in the generated ``_sync`` locker.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from multilock.backend import finish_shielded

from ._errors import REDIS_ERRORS

__all__ = ["async_close_pubsub", "sync_close_pubsub"]


async def async_close_pubsub(pubsub: Any) -> None:
    """Close ``pubsub`` (its connection, and the subscription with it), to the end even
    when the caller is cancelled meanwhile: a subscription must not outlive its wait."""
    with suppress(*REDIS_ERRORS):
        await finish_shielded(pubsub.aclose())


def sync_close_pubsub(pubsub: Any) -> None:
    """Close ``pubsub`` (its connection, and the subscription with it)."""
    with suppress(*REDIS_ERRORS):
        pubsub.close()
