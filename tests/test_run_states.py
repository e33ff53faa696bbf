"""A run's life as a state machine: every legal transition, every illegal one refused, and
the paths real runs take through it (the scheduler on memory:// with a manual clock)."""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import multilock
from multilock import EventKind, Scheduler, every
from multilock._locks.memory import AsyncMemoryLocker
from multilock._scheduling.jobs import Job
from multilock._scheduling.run_states import (
    BODY_STATES,
    TRANSITIONS,
    IllegalTransition,
    RunLifecycle,
    RunState,
    Transition,
    record_transitions,
)
from multilock.backend import LockURL
from tests.test_scheduler import (
    T0,
    Events,
    at,
    blocked,
    manual,
    namespace,
    nothing,
    scheduler,
    settle,
)
from tests.test_scheduler_late_grant import GatedLocker

S = RunState

# The method that moves a run to each state: the lifecycle's whole vocabulary.
MOVES: dict[RunState, Callable[[RunLifecycle[Any]], None]] = {
    S.ACQUIRING: RunLifecycle.acquire,
    S.RUNNING: RunLifecycle.start,
    S.SKIPPED: RunLifecycle.skip,
    S.MISSED: RunLifecycle.miss,
    S.FAILED: RunLifecycle.fail,
    S.ABANDONED: RunLifecycle.abandon,
    S.LOST: RunLifecycle.lose,
    S.TIMED_OUT: RunLifecycle.time_out,
    S.HOLDING: RunLifecycle.hold,
    S.RELEASING: RunLifecycle.release,
    S.DONE: RunLifecycle.finish,
}
TERMINAL = {S.DONE, S.SKIPPED, S.MISSED, S.FAILED, S.ABANDONED}


def a_job() -> Job:
    return Scheduler(namespace(), clock=manual(), metrics=False).add_job(
        nothing, every(seconds=10), name="j"
    )


def paths_from_due() -> dict[RunState, list[RunState]]:
    """The shortest path from ``due`` to each state the table reaches."""
    paths: dict[RunState, list[RunState]] = {S.DUE: []}
    queue = deque([S.DUE])
    while queue:
        state = queue.popleft()
        for after in sorted(TRANSITIONS[state], key=lambda s: s.value):
            if after not in paths:
                paths[after] = [*paths[state], after]
                queue.append(after)
    return paths


def life_at(job: Job, state: RunState) -> RunLifecycle[Any]:
    """A lifecycle driven from ``due`` to ``state`` through its methods."""
    life: RunLifecycle[Any] = RunLifecycle(job, at(10), object())
    for step in paths_from_due()[state]:
        MOVES[step](life)
    assert life.state is state
    return life


# --- the table ------------------------------------------------------------------------


def test_the_table_is_the_whole_life() -> None:
    assert set(TRANSITIONS) == set(RunState)
    assert set(MOVES) == set(RunState) - {S.DUE}  # nothing moves a run back to due
    assert set(paths_from_due()) == set(RunState)  # every state is reachable
    assert {s for s, nexts in TRANSITIONS.items() if not nexts} == TERMINAL
    for state in RunState:  # and every life can end
        assert any(end in paths_from(state) for end in TERMINAL), state


def test_a_body_once_over_does_not_come_back() -> None:
    """The job's ``running`` is read off its tick's state (``BODY_STATES``): it turns
    false once, as the body ends, and never true again in the same life."""
    assert {S.DUE, S.ACQUIRING, S.RUNNING, S.LOST, S.TIMED_OUT} == BODY_STATES
    for state in RunState:
        if state not in BODY_STATES:
            assert not (paths_from(state) & BODY_STATES), state
    # Every body state can still reach the end of its body (or the end of the life).
    for state in BODY_STATES:
        assert paths_from(state) - BODY_STATES, state


def paths_from(state: RunState) -> set[RunState]:
    seen, queue = {state}, deque([state])
    while queue:
        for after in TRANSITIONS[queue.popleft()]:
            if after not in seen:
                seen.add(after)
                queue.append(after)
    return seen


def test_the_docs_show_the_table() -> None:
    """docs/scheduler.md ("A run's life") lists the same transitions as the code."""
    text = (Path(__file__).parents[1] / "docs" / "scheduler.md").read_text()
    section = text.split("### A run's life", 1)[1].split("\n### ", 1)[0]
    shown: dict[RunState, frozenset[RunState]] = {}
    for before, after in re.findall(r"^\| `(\w+)` +\| (.+?) +\|$", section, re.MULTILINE):
        targets = re.findall(r"`(\w+)`", after)
        shown[RunState(before)] = frozenset(RunState(target) for target in targets)
    assert shown == {state: nexts for state, nexts in TRANSITIONS.items() if nexts}


LEGAL = [(before, after) for before, nexts in TRANSITIONS.items() for after in nexts]
ILLEGAL = [(b, a) for b in RunState for a in RunState if a is not S.DUE and a not in TRANSITIONS[b]]


@pytest.mark.parametrize(("before", "after"), LEGAL, ids=lambda s: s.value)
def test_every_legal_transition(before: RunState, after: RunState) -> None:
    life = life_at(a_job(), before)
    with record_transitions() as seen, record_transitions(refused_only=True) as refused:
        MOVES[after](life)
    assert life.state is after
    assert seen == [Transition("j", life.fire, before, after)]
    assert refused == []
    assert life.over is (after in TERMINAL)


@pytest.mark.parametrize(("before", "after"), ILLEGAL, ids=lambda s: s.value)
def test_every_illegal_transition_raises(before: RunState, after: RunState) -> None:
    life = life_at(a_job(), before)
    with (
        record_transitions() as seen,
        record_transitions(refused_only=True) as refused,
        pytest.raises(IllegalTransition) as raised,
    ):
        MOVES[after](life)
    assert str(raised.value) == (
        f"run of job 'j' at {life.fire.isoformat()}: illegal transition"
        f" {before.value} -> {after.value}"
    )
    assert (raised.value.before, raised.value.after) == (before, after)
    assert isinstance(raised.value, RuntimeError)
    assert life.state is before  # unchanged
    assert seen == refused == [Transition("j", life.fire, before, after, legal=False)]


# --- the paths real runs take -----------------------------------------------------------


def paths(seen: Iterable[Transition], job: str = "j") -> dict[float, list[str]]:
    """Each tick's path (fire time, seconds after T0 → its states, from ``due``)."""
    out: dict[float, list[str]] = {}
    for move in seen:
        assert move.legal, move
        if move.job == job:
            path = out.setdefault(move.fire.timestamp() - T0, [move.before.value])
            assert path[-1] == move.before.value  # one life, moved step by step
            path.append(move.after.value)
    return out


def test_a_run_that_succeeds_holds_then_releases() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(nothing, every(seconds=10), name="j")
        async with sched:
            clock.set(T0 + 10)
            await settle()
            assert paths(seen) == {10: ["due", "acquiring", "running", "holding"]}
            clock.set(T0 + 10.75)  # the hold's end: 2 x skew_tolerance + misfire_grace
            await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {10: ["due", "acquiring", "running", "holding", "releasing", "done"]}
    assert events.fires(EventKind.SUCCEEDED) == [10]


def test_a_tick_held_elsewhere_is_skipped() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        async with multilock.connect_async(url) as other:
            assert await other.try_acquire("j") is not None
            sched = scheduler(url, clock, events)
            sched.add_job(nothing, every(seconds=10), name="j")
            async with sched:
                clock.set(T0 + 10)
                await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {10: ["due", "acquiring", "skipped"]}
    assert events.fires(EventKind.SKIPPED_HELD) == [10]


def test_a_late_tick_is_missed() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(nothing, every(seconds=10), name="j")
        async with sched:
            clock.set(T0 + 10.3)  # past the default grace (0.25 s)
            await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {10: ["due", "missed"]}
    assert events.fires(EventKind.MISSED) == [10]


def test_a_lock_granted_late_is_missed() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        slow = GatedLocker(url)
        sched = scheduler(slow, clock, events)
        sched.add_job(nothing, every(seconds=10), name="j")
        async with sched:
            clock.set(T0 + 10)
            await asyncio.wait_for(slow.waiting.wait(), 5)
            clock.set(T0 + 10.3)  # the answer comes back past the grace
            slow.gate.set()
            await settle()
            assert AsyncMemoryLocker(LockURL.parse(url)).locks() == []  # given back

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {10: ["due", "acquiring", "missed"]}
    assert [e.reason for e in events.of(EventKind.MISSED)] == ["0.300s late (granted)"]


def test_a_run_whose_lease_is_lost_releases_without_a_hold() -> None:
    url, clock, events = namespace(), manual(), Events()
    record: list[str] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(blocked, every(seconds=10), name="j", args=(record,))
        async with sched:
            clock.set(T0 + 10)
            await settle()
            AsyncMemoryLocker(LockURL.parse(url)).revoke("j", "connection killed")
            await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {10: ["due", "acquiring", "running", "lost", "releasing", "done"]}
    assert record == ["cancelled"]
    assert events.fires(EventKind.LEASE_LOST) == [10]


def test_a_run_that_times_out_still_holds_its_lease() -> None:
    url, clock, events = namespace(), manual(), Events()
    record: list[str] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(blocked, every(seconds=60), name="j", timeout=5, args=(record,))
        async with sched:
            clock.set(T0 + 60)
            await settle()
            clock.set(T0 + 65)
            await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {
        60: ["due", "acquiring", "running", "timed_out", "holding", "releasing", "done"]
    }
    assert events.fires(EventKind.TIMED_OUT) == [60]


def test_the_next_tick_takes_the_hold_over() -> None:
    """A run that ends after its next tick came (``overlap="wait"``) hands its lease to
    that tick, which runs under it: no release, no second acquire."""
    url, clock, events = namespace(), manual(), Events()
    go = asyncio.Event()

    async def slow() -> None:
        await go.wait()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(slow, every(seconds=10), name="j", overlap="wait")
        async with sched:
            clock.set(T0 + 10)
            await settle()
            clock.set(T0 + 20)  # the tick of 10 still runs: this one waits
            await settle()
            go.set()
            await settle()
            clock.set(T0 + 20.75)
            await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {
        10: ["due", "acquiring", "running", "holding", "done"],
        20: ["due", "running", "holding", "releasing", "done"],
    }
    assert events.fires(EventKind.SUCCEEDED) == [10, 20]


def test_a_tick_while_the_previous_run_runs_is_skipped() -> None:
    url, clock, events = namespace(), manual(), Events()
    record: list[str] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events, stop_timeout=0.1)
        sched.add_job(blocked, every(seconds=10), name="j", args=(record,))
        async with sched:
            clock.set(T0 + 10)
            await settle()
            clock.set(T0 + 20)
            await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen)[20] == ["due", "skipped"]
    assert events.fires(EventKind.SKIPPED_OVERLAP) == [20]


def test_a_local_job_runs_without_a_lock() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(nothing, every(seconds=10), name="j", distributed=False)
        async with sched:
            clock.set(T0 + 10)
            await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert paths(seen) == {10: ["due", "running", "done"]}
