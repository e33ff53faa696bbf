"""The scheduler's queue of jobs by next fire time."""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

__all__ = ["FireQueue"]

T = TypeVar("T")


class FireQueue(Generic[T]):
    """Items by the time they are next due: the earliest first.

    A heap of the distinct due times, each with the items due then (in the order
    they were put): waking up costs O(log n) per due time, not a scan of every job
    (with a thousand jobs spread over the second, the scheduler wakes a thousand
    times a second), and a thousand jobs due at one instant cost one heap entry.
    Used from the event loop only.
    """

    def __init__(self) -> None:
        self._times: list[float] = []  # a heap; a time whose bucket emptied stays until it surfaces
        self._buckets: dict[float, dict[str, T]] = {}
        self._when: dict[str, float] = {}

    def put(self, key: str, when: float, item: T) -> None:
        """Make ``item`` (known as ``key``) due at ``when``, replacing its previous time."""
        self.discard(key)
        self._when[key] = when
        bucket = self._buckets.get(when)
        if bucket is None:
            bucket = self._buckets[when] = {}
            heapq.heappush(self._times, when)
        bucket[key] = item

    def discard(self, key: str) -> None:
        """Forget ``key``'s item, if queued."""
        when = self._when.pop(key, None)
        if when is not None:
            self._buckets[when].pop(key, None)

    def clear(self) -> None:
        """Forget every item."""
        self._times.clear()
        self._buckets.clear()
        self._when.clear()

    def earliest(self) -> float | None:
        """When the next item is due, or ``None`` if none is queued."""
        times = self._times
        while times:
            if self._buckets[times[0]]:
                return times[0]
            del self._buckets[heapq.heappop(times)]  # every item moved away or dropped
        return None

    def pop_due(self, now: float) -> list[T]:
        """The items due at ``now`` or before, earliest first, taken out of the queue."""
        times, when = self._times, self._when
        due: list[T] = []
        while times and times[0] <= now:
            bucket = self._buckets.pop(heapq.heappop(times))
            for key in bucket:
                del when[key]
            due += bucket.values()
        return due

    def __len__(self) -> int:
        return len(self._when)
