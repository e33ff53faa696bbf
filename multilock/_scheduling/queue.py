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
        # A bucket holds keys only (an insertion-ordered set): a dict of strings is not
        # tracked by the garbage collector, and jobs spread over the second make a new
        # bucket per run; the items are in ``_items``, which lives as long as the queue.
        self._buckets: dict[float, dict[str, None]] = {}
        self._when: dict[str, float] = {}
        self._items: dict[str, T] = {}

    def put(self, key: str, when: float, item: T) -> None:
        """Make ``item`` (known as ``key``) due at ``when``, replacing its previous time."""
        self.discard(key)
        self._when[key] = when
        self._items[key] = item
        bucket = self._buckets.get(when)
        if bucket is None:
            bucket = self._buckets[when] = {}
            heapq.heappush(self._times, when)
        bucket[key] = None

    def discard(self, key: str) -> None:
        """Forget ``key``'s item, if queued."""
        when = self._when.pop(key, None)
        if when is not None:
            self._buckets[when].pop(key, None)
            del self._items[key]

    def clear(self) -> None:
        """Forget every item."""
        self._times.clear()
        self._buckets.clear()
        self._when.clear()
        self._items.clear()

    def earliest(self) -> float | None:
        """When the next item is due, or ``None`` if none is queued."""
        times = self._times
        while times:
            if self._buckets[times[0]]:
                return times[0]
            del self._buckets[heapq.heappop(times)]  # every item moved away or dropped
        return None

    def count_at(self, when: float) -> int:
        """How many items are due at ``when`` exactly."""
        bucket = self._buckets.get(when)
        return 0 if bucket is None else len(bucket)

    def pop_due(self, now: float) -> list[T]:
        """The items due at ``now`` or before, earliest first, taken out of the queue."""
        times, when, items = self._times, self._when, self._items
        due: list[T] = []
        while times and times[0] <= now:
            for key in self._buckets.pop(heapq.heappop(times)):
                del when[key]
                due.append(items.pop(key))
        return due

    def __len__(self) -> int:
        return len(self._when)
