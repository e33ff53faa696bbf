"""The async round-trip deadline: one timer per session, a grace for a late loop, once."""

from __future__ import annotations

import asyncio
import time

from multilock_mysql._runtime import AsyncGuard


def _expired(guard: AsyncGuard) -> bool:
    return guard.expired  # read afresh: the loop changes it between two looks


def test_a_late_loop_gets_one_grace_then_the_round_trip_is_cut() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        cuts: list[float] = []
        guard = AsyncGuard(lambda: cuts.append(loop.time()))
        async with guard.until(0.05, None):
            time.sleep(0.3)  # noqa: ASYNC251 -- blocking code holds the loop past the due time
            await asyncio.sleep(0)  # the timer fires late: the round trip gets a grace
            assert not cuts
            assert not _expired(guard)
            await asyncio.sleep(AsyncGuard.GRACE + 0.2)  # still in flight: cut, late or not
            assert len(cuts) == 1
            assert _expired(guard)
        async with guard.until(0.05, None):  # a new round trip starts afresh
            assert not _expired(guard)
        await asyncio.sleep(0.1)
        assert len(cuts) == 1  # an idle session is never cut

    asyncio.run(main())


def test_a_shorter_round_trip_rearms_the_timer() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        cuts: list[float] = []
        guard = AsyncGuard(lambda: cuts.append(loop.time()))
        async with guard.until(5.0, None):
            pass
        start = loop.time()
        async with guard.until(0.05, None):
            await asyncio.sleep(0.5)
        assert len(cuts) == 1
        assert cuts[0] - start < 0.4  # the 5 s timer of the first did not hold it up

    asyncio.run(main())
