"""Tick claims (``TICK_CLAIM``): one winner per tick, marks that only rise, across
lockers and processes, independent per name, and kept past the claimer's session."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from multilock.abc import Capability

from ._checks_ttl import SHORT_TTL, SLACK
from ._harness import Harness
from ._process import Child

__all__ = [
    "CLAIMERS",
    "CLAIM_ROUNDS",
    "MIN_CLAIM_RETENTION",
    "claims_across_processes",
    "claims_names_independent",
    "claims_never_go_back",
    "claims_one_winner",
    "claims_survive",
]

CLAIMERS = 8
CLAIM_ROUNDS = 30
CLAIM_PROCESSES = 4
MIN_CLAIM_RETENTION = 86400.0
"""The shortest ``claim_retention`` a backend may declare: a day, far longer than any
replica may come late to a tick (a replica more than an interval off computes other
ticks anyway)."""

_BASE = datetime(2026, 1, 1, tzinfo=UTC)


def _fire(i: float) -> datetime:
    """The ``i``-th fire time of a check: one second apart."""
    return _BASE + timedelta(seconds=i)


async def claims_one_winner(h: Harness) -> None:
    """8 independent lockers claim the same ticks at once, 30 rounds, each claiming three
    names in one batch: exactly one winner per (name, tick)."""
    h.requires(Capability.TICK_CLAIM)
    names = [h.name(f"claim-{i}") for i in range(3)]
    lockers = [await h.api.connect() for _ in range(CLAIMERS)]
    barrier = asyncio.Barrier(CLAIMERS)
    wins: Counter[tuple[str, int]] = Counter()

    async def claimer(locker: Any) -> None:
        for round_ in range(CLAIM_ROUNDS):
            await barrier.wait()
            won = await h.api.claim_ticks(locker, dict.fromkeys(names, _fire(round_)))
            assert list(won) == names, f"claim_ticks answered for {list(won)}, not {names}"
            for name, ok in won.items():
                if ok:
                    wins[name, round_] += 1

    await asyncio.gather(*(claimer(locker) for locker in lockers))
    bad = {
        (name[-7:], round_): wins[name, round_]
        for name in names
        for round_ in range(CLAIM_ROUNDS)
        if wins[name, round_] != 1
    }
    assert not bad, f"ticks without exactly one winner among {CLAIMERS} claimers: {bad}"


async def claims_never_go_back(h: Harness) -> None:
    """A fire time at or below the mark never wins, from any locker or in any batch; a
    later one does."""
    h.requires(Capability.TICK_CLAIM)
    first, second = await h.api.connect(), await h.api.connect()
    name = h.name("monotonic")
    assert await h.api.claim_ticks(first, {name: _fire(10)}) == {name: True}, (
        "the first claim of a tick was not won"
    )
    for locker in (first, second):
        for i in (10, 9, 0, -5):
            got = await h.api.claim_ticks(locker, {name: _fire(i)})
            assert got == {name: False}, (
                f"a claim of tick {i} after tick 10 was claimed was won: the mark went back"
            )
    assert await h.api.claim_ticks(second, {name: _fire(11)}) == {name: True}
    assert await h.api.claim_ticks(first, {name: _fire(10.5)}) == {name: False}
    # Epoch seconds and an aware datetime of the same instant are the same tick.
    assert await h.api.claim_ticks(first, {name: _fire(11).timestamp()}) == {name: False}
    later = _fire(11) + timedelta(microseconds=1)
    assert await h.api.claim_ticks(first, {name: later}) == {name: True}, (
        "a fire time one microsecond later than the mark was not won"
    )


async def claims_names_independent(h: Harness) -> None:
    """The marks of different names, however alike, are independent, and independent of
    the names' locks: a held lock does not stop a claim, a claim takes no lock."""
    h.requires(Capability.TICK_CLAIM)
    locker = await h.api.connect()
    base = h.name("independent")
    names = [base, base.upper(), base + " ", base + "/x", base + "\u00e9", "e\u0301" + base]
    high = await h.api.claim_ticks(locker, {names[0]: _fire(100)})
    assert high == {names[0]: True}
    got = await h.api.claim_ticks(locker, dict.fromkeys(names[1:], _fire(1)))
    lost = [name for name, won in got.items() if not won]
    assert not lost, f"a mark of {names[0]!r} stopped claims of other names: {lost}"
    lease = await h.api.try_acquire(locker, base + "-locked")
    assert lease is not None
    assert await h.api.claim_ticks(locker, {base + "-locked": _fire(1)}) == {
        base + "-locked": True
    }, "a held lock stopped a claim of its name: claims and locks must be apart"
    assert lease.held
    await h.api.release(lease)
    await h.assert_free(names[0], "after its tick was claimed: a claim must take no lock")


async def claims_across_processes(h: Harness) -> None:
    """4 processes claim one tick of the same 30 names, racing: one winner per name."""
    h.requires(Capability.TICK_CLAIM, Capability.CROSS_PROCESS)
    name = h.name("processes")
    children = [
        Child(h.kind, h.url, "claim", name, str(_fire(0).timestamp()), str(CLAIM_ROUNDS))
        for _ in range(CLAIM_PROCESSES)
    ]
    for child in children:
        await child.__aenter__()
    try:
        await asyncio.gather(*(child.expect("ready") for child in children))
        for child in children:
            await child.send("go")
        answers = await asyncio.gather(*(child.expect("won", within=60.0) for child in children))
    finally:
        for child in children:
            await child.__aexit__(None, None, None)
    wins = Counter(int(i) for answer in answers for i in answer.split())
    bad = {i: wins[i] for i in range(CLAIM_ROUNDS) if wins[i] != 1}
    assert not bad, f"names without exactly one winner among {CLAIM_PROCESSES} processes: {bad}"


async def claims_survive(h: Harness) -> None:
    """A mark outlives its claimer's locker (closed: its session ended) and, on a TTL
    backend, the lease ttl: a new locker's claim of that tick or an older one loses. The
    declared ``claim_retention`` is ``None`` (kept) or at least a day."""
    h.requires(Capability.TICK_CLAIM)
    claimer = await h.api.connect()
    retention = claimer.claim_retention
    assert retention is None or retention >= MIN_CLAIM_RETENTION, (
        f"claim_retention is {retention!r} s: a mark must last at least"
        f" {MIN_CLAIM_RETENTION:g} s (None: as long as the backend keeps its data)"
    )
    name = h.name("survive")
    assert await h.api.claim_ticks(claimer, {name: _fire(5)}) == {name: True}
    await h.api.close(claimer)
    if h.has(Capability.TTL):
        await asyncio.sleep(SHORT_TTL + SLACK)  # past any lease ttl a mark might wrongly share
    fresh = await h.api.connect()
    got = await h.api.claim_ticks(fresh, {name: _fire(5)})
    assert got == {name: False}, "a claimed tick was won again once its claimer had closed"
    assert await h.api.claim_ticks(fresh, {name: _fire(4)}) == {name: False}
    assert await h.api.claim_ticks(fresh, {name: _fire(6)}) == {name: True}
