"""The scheduler's fire queue: earliest first, moves and drops honoured."""

from __future__ import annotations

import gc

from multilock._scheduling.queue import FireQueue


def test_items_come_out_by_time_then_in_the_order_put() -> None:
    queue: FireQueue[str] = FireQueue()
    queue.put("c", 3.0, "C")
    queue.put("a", 1.0, "A")
    queue.put("b1", 2.0, "B1")
    queue.put("b2", 2.0, "B2")
    assert queue.earliest() == 1.0
    assert queue.pop_due(0.5) == []
    assert queue.pop_due(2.0) == ["A", "B1", "B2"]
    assert queue.earliest() == 3.0
    assert len(queue) == 1


def test_a_moved_item_is_due_only_at_its_new_time() -> None:
    queue: FireQueue[str] = FireQueue()
    queue.put("a", 1.0, "A")
    queue.put("a", 5.0, "A'")
    assert queue.earliest() == 5.0  # the emptied time 1.0 no longer counts
    assert queue.pop_due(4.0) == []
    assert queue.pop_due(5.0) == ["A'"]
    assert queue.earliest() is None


def test_a_dropped_item_never_comes_out() -> None:
    queue: FireQueue[str] = FireQueue()
    queue.put("a", 1.0, "A")
    queue.put("b", 1.0, "B")
    queue.discard("a")
    queue.discard("missing")
    assert queue.pop_due(10.0) == ["B"]
    queue.put("c", 2.0, "C")
    queue.clear()
    assert queue.earliest() is None
    assert len(queue) == 0


def test_a_queued_item_makes_no_object_for_the_garbage_collector() -> None:
    # Jobs spread over the second put a new due time per run: its bucket must not be one
    # more object for every collection to trace (docs/decisions.md, "GC-tracked objects").
    queue: FireQueue[object] = FireQueue()
    for index in range(3):
        queue.put(f"job-{index}", 1.0 + index, object())
    assert queue._buckets
    for bucket in queue._buckets.values():
        assert not gc.is_tracked(bucket)
    assert len(queue.pop_due(2.0)) == 2
