"""Run a :class:`~tests.sim.scenario.Scenario`: real :class:`multilock.Scheduler` replicas
in one event loop, on the simulated world, with every run and event recorded.

The driver moves true time from one instant where something is due to the next (a
sleeper on any replica's clock, a lease's expiry, a scenario action), and between
two instants lets the event loop run until nothing is ready: so every replica
reacts to each instant fully before time moves on, as if it took no time at all.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import multilock
from multilock import JobEvent, Scheduler

from .scenario import LEADER, T0, JobSpec, ReplicaSpec, Scenario
from .world import ReplicaClock, SimLocker, SimTime, World

__all__ = ["History", "Life", "RunRecord", "Seen", "simulate"]

OUTSIDER = "outsider"
_MAX_STEPS = 200_000  # instants in one scenario: far above any generated one
_MAX_TURNS = 100_000  # loop turns within one instant before calling it a livelock
_DRAIN = 120.0  # seconds of simulated time the final stops may take


@dataclass
class RunRecord:
    """One body that ran, as the body itself saw it (true times)."""

    replica: int
    job: str
    fire: datetime
    token: int | None
    start: float
    end: float | None = None
    how: str | None = None  # returned, cancelled, crashed


@dataclass(frozen=True)
class Seen:
    """An event a replica emitted, and the true time it did."""

    at: float
    replica: int
    event: JobEvent


@dataclass
class Life:
    """A replica's life in true time."""

    started: float | None = None
    stop_requested: float | None = None
    stopped: float | None = None
    crashed: float | None = None
    left_held: list[int] = field(default_factory=list)  # tokens still held once stopped

    def up(self, start: float, end: float) -> bool:
        """Whether the replica ran, neither stopping nor crashed, all through [start, end]."""
        if self.started is None or self.started >= start:
            return False
        ends = [t for t in (self.stop_requested, self.crashed) if t is not None]
        return not ends or min(ends) > end


@dataclass
class History:
    """Everything that happened in one scenario."""

    scenario: Scenario
    world: World
    records: list[RunRecord] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lives: list[Life] = field(default_factory=list)


class _Replica:
    """One replica: a Scheduler with its own clock and its own connection."""

    def __init__(self, index: int, spec: ReplicaSpec, history: History) -> None:
        scenario, world = history.scenario, history.world
        self.index = index
        self.history = history
        self.time = world.time
        self.life = history.lives[index]
        self.locker = SimLocker(world, f"r{index}", fast=scenario.fast)
        self.scheduler = Scheduler(
            self.locker,
            clock=ReplicaClock(world.time, spec.offset),
            skew_tolerance=scenario.skew_tolerance,
            misfire_grace=scenario.misfire_grace,
            coordination=scenario.coordination,
            leader_name=LEADER,
            leader_poll=scenario.leader_poll,
            lease_ttl=scenario.lease_ttl,
            stop_timeout=3600,  # real seconds: a graceful stop ends on simulated time
            replica_id=f"r{index}",
            metrics=False,
        )
        for job in scenario.jobs:
            self.scheduler.add_job(
                self.body,
                job.trigger(),
                name=job.name,
                overlap=job.overlap,
                misfire_grace=job.misfire_grace,
                timeout=job.timeout,
                args=(job,),
            )
        self.scheduler.add_listener(self.listen)
        self.stopping: asyncio.Task[None] | None = None
        self.requested = False  # start() called (it may still be probing the backend)

    async def body(self, job: JobSpec) -> None:
        """The job: it runs for the scenario's duration of its tick, and says so."""
        if self.life.crashed is not None:
            return  # a dead process runs nothing (a callback queued at its last instant)
        run = multilock.current_run()
        record = RunRecord(self.index, run.job, run.fire_time, run.fencing_token, self.time.now)
        self.history.records.append(record)
        try:
            length = job.duration(run.fire_time)
            if length:
                await self.time.sleep_until(self.time.now + length)
        except asyncio.CancelledError:
            _end(record, self.time.now, "cancelled")
            raise
        _end(record, self.time.now, "returned")

    def listen(self, event: JobEvent) -> None:
        if self.life.crashed is None:
            self.history.seen.append(Seen(self.time.now, self.index, event))

    async def start(self) -> None:
        self.requested = True
        await self.scheduler.start()
        # Up (alive to try ticks) once started: a start first probes the backend.
        if self.stopping is None:
            self.life.started = self.time.now

    def stop(self) -> None:
        if self.stopping is not None:
            return
        self.life.stop_requested = self.time.now
        self.stopping = asyncio.ensure_future(self.scheduler.stop())
        self.stopping.add_done_callback(self._stopped)

    def _stopped(self, _: asyncio.Future[None]) -> None:
        if self.life.crashed is None:
            self.life.stopped = self.time.now
            self.life.left_held = [g.token for g in self.history.world.held_by(self.locker.owner)]

    def crash(self) -> None:
        """The process dies now: its connection, its bodies, its scheduler."""
        if self.life.crashed is not None or self.life.stopped is not None:
            return
        self.life.crashed = self.time.now
        self.history.world.crash(self.locker.owner)
        for record in self.history.records:
            if record.replica == self.index:
                _end(record, self.time.now, "crashed")
        # Tear the object down (unless a graceful stop is under way already): its
        # connection is dead, so it no longer touches the world, and nothing it does
        # from now on is seen.
        self.scheduler.stop_timeout = 0
        self.stop()


def _end(record: RunRecord, at: float, how: str) -> None:
    if record.end is None:
        record.end, record.how = at, how


async def quiesce() -> None:
    """Let the event loop run until no callback is ready: every replica has reacted."""
    loop = asyncio.get_running_loop()
    ready = loop._ready  # type: ignore[attr-defined]  # CPython's queue of ready callbacks
    for _ in range(_MAX_TURNS):
        await asyncio.sleep(0)
        if not ready:
            return
    raise AssertionError(f"the replicas did not settle within {_MAX_TURNS} loop turns")


async def simulate(scenario: Scenario) -> History:
    """Run ``scenario`` to its end, stop every replica gracefully, return what happened."""
    time = SimTime(T0)
    world = World(
        time,
        ttl=scenario.backend != "session",
        renewal=scenario.backend == "ttl-renewed",
        latency=scenario.latency,
        claims=scenario.claims,
    )
    history = History(scenario, world, lives=[Life() for _ in scenario.replicas])
    replicas = [_Replica(i, spec, history) for i, spec in enumerate(scenario.replicas)]
    actions: list[tuple[float, int, Callable[[], object]]] = []

    def at(when: float, action: Callable[[], object]) -> None:
        actions.append((T0 + when, len(actions), action))

    for replica, spec in zip(replicas, scenario.replicas, strict=True):
        at(spec.start, replica.start)
        if spec.stop is not None:
            at(spec.stop, replica.stop)
        if spec.crash is not None:
            at(spec.crash, replica.crash)
    for fault in scenario.faults:
        at(fault.at, _fault(world, fault.kind, fault.name))
    actions.sort(key=lambda action: action[:2])
    end = T0 + scenario.length
    ended = False
    starting: list[asyncio.Future[None]] = []
    for _ in range(_MAX_STEPS):
        await quiesce()
        if not ended and time.now >= end:
            ended = True
            for replica in replicas:
                if replica.requested:
                    replica.stop()
            continue
        if ended and all(r.stopping is None or r.stopping.done() for r in replicas):
            for task in starting:
                task.result()  # a start that failed fails the scenario
            return history
        due = [time.next_deadline(), world.next_expiry()]
        due += [actions[0][0] if actions else None, None if ended else end]
        when = min((t for t in due if t is not None), default=math.inf)
        if when > end + _DRAIN:
            raise AssertionError("the replicas did not stop: nothing left to wait for")
        time.advance_to(when)
        world.expire_due()
        while actions and actions[0][0] <= time.now:
            result = actions.pop(0)[2]()
            if asyncio.iscoroutine(result):
                # In a task of its own: a start waits for its probe of the backend, which
                # answers only as simulated time goes on.
                starting.append(asyncio.ensure_future(result))
    raise AssertionError(f"the scenario did not end within {_MAX_STEPS} instants")


def _fault(world: World, kind: str, name: str) -> Callable[[], object]:
    def act() -> None:
        if kind == "revoke":
            world.revoke(name, "revoked by the simulation")
        elif kind == "hold":
            if world.holders.get(name) is None:
                world.acquire(OUTSIDER, name, 1e9)
        else:
            grant = world.holders.get(name)
            if grant is not None and grant.owner == OUTSIDER:
                world.release(grant)

    return act
