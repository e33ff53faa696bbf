"""What a simulated scenario is made of, and hypothesis strategies that generate them.

A :class:`Scenario` is plain data whose ``repr`` is the Python that builds it again,
so that a failing one, shrunk by hypothesis, is printed as a test to paste. Times are
seconds after ``T0`` (true time), drawn on a 1 ms grid, so that ticks, holds and
offsets fall off the scheduler's 50 ms hold grid and off whole seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from hypothesis import strategies as st

import multilock

__all__ = [
    "LEADER",
    "T0",
    "Fault",
    "JobSpec",
    "ReplicaSpec",
    "Scenario",
    "scenarios",
]

T0 = 1_800_000_000.0  # true time at the start of every scenario
Backend = Literal["session", "ttl", "ttl-renewed"]


@dataclass(frozen=True)
class JobSpec:
    """A distributed job: ``every(interval, start=T0 + start, jitter=jitter)``; the
    body of its tick ``n`` lasts ``durations[n % len(durations)]`` seconds."""

    name: str
    interval: float
    start: float = 0.0
    jitter: float = 0.0
    durations: tuple[float, ...] = (0.0,)
    overlap: Literal["reschedule", "wait"] = "reschedule"
    misfire_grace: float | None = None
    timeout: float | None = None

    def trigger(self) -> multilock.Trigger:
        """The job's trigger."""
        return multilock.every(
            self.interval,
            start=datetime.fromtimestamp(T0 + self.start, UTC),
            jitter=self.jitter or None,
        )

    def duration(self, fire: datetime) -> float:
        """How long the body of the tick at ``fire`` runs."""
        n = math.floor(round(fire.timestamp() - T0 - self.start, 6) / self.interval)
        return self.durations[n % len(self.durations)]


@dataclass(frozen=True)
class ReplicaSpec:
    """A replica: its clock's offset from true time, when it starts, and whether (and
    when) it stops gracefully or crashes."""

    offset: float
    start: float = 0.0
    stop: float | None = None
    crash: float | None = None

    @property
    def end(self) -> float | None:
        """When it stops or crashes, if it does."""
        ends = [t for t in (self.stop, self.crash) if t is not None]
        return min(ends) if ends else None


@dataclass(frozen=True)
class Fault:
    """Something the world does at ``at``: ``revoke`` the holder of ``name`` (its
    lease is lost), or an outside locker takes ``name`` (``hold``) or lets it go
    (``free``)."""

    at: float
    kind: Literal["revoke", "hold", "free"]
    name: str


@dataclass(frozen=True)
class Scenario:
    """A fleet of replicas of one scheduler configuration, and what happens to them."""

    replicas: tuple[ReplicaSpec, ...]
    jobs: tuple[JobSpec, ...]
    length: float
    coordination: Literal["lock", "leader"] = "lock"
    skew_tolerance: float = 0.25
    misfire_grace: float = 0.25
    lease_ttl: float = 1.0
    leader_poll: float = 0.5
    backend: Backend = "session"
    fast: bool = True
    latency: float = 0.0
    faults: tuple[Fault, ...] = ()
    claims: bool = False  # the backend claims ticks (TICK_CLAIM), and the scheduler does

    @property
    def within_tolerance(self) -> bool:
        """Whether every clock is within ``skew_tolerance`` of true time."""
        return all(abs(r.offset) < self.skew_tolerance for r in self.replicas)

    def grace(self, job: JobSpec) -> float:
        """The job's misfire grace."""
        return self.misfire_grace if job.misfire_grace is None else job.misfire_grace


LEADER = "sim-leader"  # the leader lease's name in leader mode


# Fixed strategies, drawn from many times: building strategies afresh in every draw
# cost hypothesis more time than running the scenarios.
_UNIT = st.integers(0, 1_000_000)
_COIN = st.booleans()
_DIE = st.integers(0, 5)
_OVERLAP: st.SearchStrategy[Literal["reschedule", "wait"]] = st.sampled_from(["reschedule", "wait"])
_COORDINATION: st.SearchStrategy[Literal["lock", "leader"]] = st.sampled_from(["lock", "leader"])
_BACKEND: st.SearchStrategy[Backend] = st.sampled_from(["session", "ttl", "ttl-renewed"])
_FAULT: st.SearchStrategy[Literal["revoke", "hold", "free"]] = st.sampled_from(
    ["revoke", "hold", "free"]
)


def _ms(draw: st.DrawFn, low: float, high: float) -> float:
    """Seconds in [low, high] on a 1 ms grid (shrinking towards ``low``)."""
    span = round((high - low) * 1000)
    return (round(low * 1000) + span * draw(_UNIT) // 1_000_000) / 1000


def _count(draw: st.DrawFn, low: int, high: int) -> int:
    return low + draw(_DIE) % (high - low + 1)


def _job(draw: st.DrawFn, index: int, skew: float) -> JobSpec:
    interval = round(2 * skew + _ms(draw, 0.01, 2.0), 3)
    room = interval - 2 * skew - 0.005  # every gap between ticks stays above 2 x skew
    jitter = _ms(draw, 0.001, room) if room >= 0.001 and draw(_COIN) else 0.0
    hold = 2 * skew + 0.25

    def length() -> float:
        kind = draw(_DIE) % 4
        if kind == 0:
            return 0.0
        if kind == 1:
            return _ms(draw, 0.001, 0.3)
        if kind == 2:  # about the hold: ends just before or after it
            return _ms(draw, max(0.0, hold - 0.1), hold + 0.2)
        return _ms(draw, interval, 3 * interval)  # outlives the next ticks

    return JobSpec(
        name=f"job-{index}",
        interval=interval,
        start=_ms(draw, -interval, interval) if draw(_COIN) else 0.0,
        jitter=jitter,
        durations=tuple(length() for _ in range(_count(draw, 1, 4))),
        overlap=draw(_OVERLAP),
        misfire_grace=_ms(draw, 0.001, 2 * interval) if draw(_COIN) else None,
        timeout=_ms(draw, 0.05, 2 * interval) if draw(_DIE) == 0 else None,
    )


def _moment(draw: st.DrawFn, job: JobSpec, offset: float, low: float, high: float) -> float:
    """A true time in [low, high]: half the time, just after one of ``job``'s ticks by a
    clock ``offset`` ahead (where a stop, a crash or a loss hurts: a leader hand-over
    just after a tick, a hold just begun)."""
    first = math.ceil((low + offset - job.start) / job.interval)
    last = math.floor((high + offset - job.start) / job.interval)
    if last < first or draw(_COIN):
        return _ms(draw, low, high)
    tick = job.start + (first + draw(_UNIT) % (last - first + 1)) * job.interval
    return round(min(high, max(low, tick - offset + _ms(draw, 0.0, 0.1))), 3)


def _replica(
    draw: st.DrawFn, skew: float, beyond: bool, length: float, job: JobSpec
) -> ReplicaSpec:
    bound = round(3 * skew if beyond else skew - 0.001, 3)
    # Half the time at the edge of the range, where a missing margin shows.
    edge = draw(_DIE)
    offset = -bound if edge == 0 else bound if edge == 1 else _ms(draw, -bound, bound)
    start = _ms(draw, 0.0, length / 2) if draw(_COIN) else 0.0
    end = draw(_DIE)
    when = _moment(draw, job, offset, start + 0.001, length) if end < 2 else None
    return ReplicaSpec(
        offset=offset,
        start=start,
        stop=when if end == 0 else None,
        crash=when if end == 1 else None,
    )


@st.composite
def scenarios(
    draw: st.DrawFn, *, beyond: bool = False, handover: bool = False, claims: bool = False
) -> Scenario:
    """Scenarios whose clocks are all within ``skew_tolerance`` (``beyond``: some not).
    ``claims``: the backend claims ticks (lock mode).

    ``handover``: leader mode, where the first replica (the leader) stops, crashes or
    loses its lease just after a tick, and the others, steady, take over.
    """
    skew = _ms(draw, 0.03, 0.5)
    coordination = "leader" if handover else "lock" if claims else draw(_COORDINATION)
    jobs = [_job(draw, i, skew) for i in range(_count(draw, 1, 3))]
    # Half the time a job ticks with the first one: their locks are taken in one batch,
    # where some names may be free and others held.
    jobs[1:] = [
        replace(job, interval=jobs[0].interval, start=jobs[0].start, jitter=0.0)
        if draw(_COIN)
        else job
        for job in jobs[1:]
    ]
    # 2 to 10 s, but at most 25 ticks of the fastest job: the cost is in the ticks.
    length = min(_ms(draw, 2.0, 10.0), max(2.0, round(25 * min(j.interval for j in jobs), 3)))
    count = _count(draw, 2 if handover else 1, 4)
    replicas = [_replica(draw, skew, beyond, length, jobs[0]) for _ in range(count)]
    names = [job.name for job in jobs] + ([LEADER] if coordination == "leader" else [])
    faults = [
        Fault(
            _moment(draw, jobs[0], 0.0, 0.0, length),
            draw(_FAULT),
            names[_count(draw, 0, len(names) - 1)],
        )
        for _ in range(draw(_DIE) % 4)
    ]
    if handover:
        if draw(_COIN):  # the worst case, half the time: the leader ahead, the others behind
            ahead, *behind = (abs(r.offset) for r in replicas)
            replicas = [ReplicaSpec(ahead), *(ReplicaSpec(-offset) for offset in behind)]
        leader, replicas = replicas[0], [ReplicaSpec(offset=r.offset) for r in replicas]
        when = _moment(draw, jobs[0], leader.offset, 0.001, length)
        how = draw(_DIE) % 3
        replicas[0] = ReplicaSpec(
            leader.offset, stop=when if how == 0 else None, crash=when if how == 1 else None
        )
        faults = [Fault(when, "revoke", LEADER)] if how == 2 else []
    else:
        # One replica lives throughout: someone is always there to try every tick.
        steady = _count(draw, 0, count - 1)
        replicas[steady] = ReplicaSpec(offset=replicas[steady].offset)
    poll = _ms(draw, 0.01, skew) if handover or draw(_COIN) else _ms(draw, 0.05, 1.0)
    return Scenario(
        replicas=tuple(replicas),
        jobs=tuple(jobs),
        length=length,
        coordination=coordination,
        skew_tolerance=skew,
        misfire_grace=_ms(draw, 0.001, 1.0),
        lease_ttl=_ms(draw, 0.15, 3.0),
        leader_poll=poll,
        backend=draw(_BACKEND),
        fast=draw(_COIN),
        latency=_ms(draw, 0.001, 0.02) if draw(_COIN) else 0.0,
        faults=tuple(sorted(faults, key=lambda f: f.at)),
        claims=claims,
    )
