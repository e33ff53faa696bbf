"""Shared timers (the end of the scheduler's lease holds): one timer per deadline."""

from __future__ import annotations

import asyncio

from multilock import ManualClock
from multilock._scheduling.clock import SharedTimers


async def _turns(rounds: int = 20) -> None:
    # A manual clock does no real waiting: a bounded number of loop turns lets every
    # woken sleeper run.
    for _ in range(rounds):
        await asyncio.sleep(0)


def test_keys_fire_at_their_deadline_in_the_order_added() -> None:
    async def scenario() -> None:
        clock, fired = ManualClock(100.0), list[str]()
        timers: SharedTimers[str] = SharedTimers(clock, fired.append)
        for key, deadline in (("b1", 102.0), ("a", 101.0), ("b2", 102.0), ("gone", 101.0)):
            timers.add(deadline, key)
        timers.discard(101.0, "gone")
        timers.discard(101.0, "never added")  # no error
        await _turns()
        assert fired == []
        clock.set(101.0)
        await _turns()
        assert fired == ["a"]
        clock.set(105.0)
        await _turns()
        assert fired == ["a", "b1", "b2"]

    asyncio.run(scenario())


def test_a_key_discarded_or_added_while_its_group_fires_is_honoured() -> None:
    async def scenario() -> None:
        clock, fired = ManualClock(100.0), list[str]()
        timers: SharedTimers[str] = SharedTimers(clock, lambda key: on_fire(key))

        def on_fire(key: str) -> None:
            fired.append(key)
            if key == "first":
                timers.discard(101.0, "second")  # not called any more
                timers.add(101.0, "late")  # due now: called in this same firing

        for key in ("first", "second", "third"):
            timers.add(101.0, key)
        clock.set(101.0)
        await _turns()
        assert fired == ["first", "third", "late"]
        timers.add(101.0, "again")  # the group is gone: a new timer, due at once
        await _turns()
        assert fired == ["first", "third", "late", "again"]

    asyncio.run(scenario())
