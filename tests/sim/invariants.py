"""The invariants of docs/scheduler.md ("The guarantee, precisely"), checked against the
history of one simulated scenario: the bodies' own records, every replica's events and
the lock server's log of grants, tries and releases.

:func:`violations` returns one line per broken invariant (empty when all hold).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from multilock import EventKind, JobEvent

from .driver import OUTSIDER, History, RunRecord, Seen
from .scenario import LEADER, T0, JobSpec
from .world import Grant

__all__ = ["violations"]

EPS = 1e-5  # seconds: float noise of times around 1.8e9 s
GRID = 0.05  # the hold's end is rounded up to the next 50 ms (documented)
_DECISIONS = {
    EventKind.STARTED,
    EventKind.SKIPPED_HELD,
    EventKind.SKIPPED_OVERLAP,
    EventKind.MISSED,
}
_ENDS = {EventKind.SUCCEEDED, EventKind.FAILED, EventKind.TIMED_OUT, EventKind.LEASE_LOST}
_LOST = ("revoked", "expired", "crashed")
Key = tuple[int, str, datetime]  # replica, job, tick
_UTC = ZoneInfo("UTC")


def violations(history: History, *, assume_within: bool = False) -> list[str]:
    """Every invariant the history breaks, one line each. ``assume_within``: check
    "at most once" even if a clock was beyond the tolerance (to see it fail)."""
    return list(_Checker(history, assume_within).run())


class _Checker:
    def __init__(self, history: History, assume_within: bool) -> None:
        self.h = history
        self.sc = history.scenario
        # With tick claims, at most once holds whatever the clocks say.
        self.within = assume_within or self.sc.within_tolerance or self.sc.claims
        self.world = history.world
        self.jobs = {job.name: job for job in self.sc.jobs}
        self.triggers = {job.name: job.trigger() for job in self.sc.jobs}
        self.offsets = [r.offset for r in self.sc.replicas]
        self.lock_mode = self.sc.coordination == "lock"
        self.round_trip = 2 * self.sc.latency
        # Releases due together go out one after the other (the model has no batch release).
        self.slack = self.round_trip * (len(self.jobs) + 1)
        self.decisions: dict[Key, list[Seen]] = defaultdict(list)
        self.ends: dict[Key, list[Seen]] = defaultdict(list)
        for seen in history.seen:
            event = seen.event
            key = (seen.replica, event.job, event.fire_time)
            if _is_decision(event):
                self.decisions[key].append(seen)
            else:
                self.ends[key].append(seen)
        self.records: dict[Key, list[RunRecord]] = defaultdict(list)
        for record in history.records:
            self.records[(record.replica, record.job, record.fire)].append(record)

    def run(self) -> Iterator[str]:
        yield from self.fire_times()
        yield from self.one_decision_each()
        yield from self.outcomes()
        yield from self.leases_cover_runs()
        yield from self.no_overlap()
        yield from self.holds()
        yield from self.renewed_and_released()
        yield from self.at_most_once()
        yield from self.skips_justified()

    # --- fire_time is the trigger's time, never a clock reading ---------------------------

    def fire_times(self) -> Iterator[str]:
        fires = [(r.job, r.fire, f"run on r{r.replica}") for r in self.h.records]
        fires += [
            (s.event.job, s.event.fire_time, f"{s.event.kind} on r{s.replica}") for s in self.h.seen
        ]
        for job, fire, what in fires:
            if not self.is_tick(job, fire):
                yield f"{what}: fire_time {fire.isoformat()} is not a tick of {job}'s trigger"
        for seen in self.h.seen:
            event = seen.event
            if event.kind is not EventKind.STARTED:
                continue
            spec = self.jobs[event.job]
            late = self.clock(seen.replica, seen.at) - event.fire_time.timestamp()
            limit = max(self.grace(spec, event.fire_time), self.sc.skew_tolerance)
            # A claimed tick starts after its claim, its lock and however late the grant.
            limit += self.round_trip * (3 if self.sc.claims else 1)
            if self.sc.claims:
                limit = math.inf  # a claimed tick runs however late its lock is granted
            if event.delay is None or abs(event.delay - late) > EPS:
                yield f"{_show(seen)}: delay {event.delay} is not the clock's {late:.6f}"
            if not -EPS <= late <= limit + EPS:
                yield f"{_show(seen)}: started {late:.6f}s after the tick (limit {limit:g})"

    def grace(self, job: JobSpec, fire: datetime) -> float:
        """How late a tick may be tried: the misfire grace, plus an interval with claims
        (``multilock._scheduling.claims.claim_grace``)."""
        following = self.next_fire(job.name, fire)
        if not self.sc.claims or following is None:
            return self.sc.grace(job)
        return self.sc.grace(job) + (following - fire).total_seconds()

    def is_tick(self, job: str, fire: datetime) -> bool:
        spec = self.jobs[job]
        if self.next_fire(job, fire - timedelta(microseconds=1)) != fire:
            return False
        # Independently of the trigger's code: on the lattice start + n x interval, plus
        # a jitter below the bound.
        start = datetime.fromtimestamp(T0 + spec.start, UTC)
        step = timedelta(seconds=spec.interval)
        past = (fire - start) % step
        return past == timedelta(0) or past < timedelta(seconds=spec.jitter)

    # --- every skip and loss reported as what it is ---------------------------------------

    def one_decision_each(self) -> Iterator[str]:
        for key, seen in self.decisions.items():
            if len(seen) > 1:
                shown = [_show(s) for s in seen]
                yield f"r{key[0]} decided {_tick(key)} {len(seen)} times: {shown}"

    def outcomes(self) -> Iterator[str]:
        for key, decided in self.decisions.items():
            started = [s for s in decided if s.event.kind is EventKind.STARTED]
            ends = self.ends.get(key, [])
            crashed = self.h.lives[key[0]].crashed is not None
            if len(ends) > len(started) or (len(ends) < len(started) and not crashed):
                yield f"{_tick(key)} on r{key[0]}: {len(started)} started, {len(ends)} ended"
            for end in ends:
                yield from self.outcome_fits(key, end)
        for key, records in self.records.items():
            if not any(s.event.kind is EventKind.STARTED for s in self.decisions.get(key, [])):
                yield f"{_tick(key)} ran on r{key[0]} with no started event"
            if len(records) > 1:
                yield f"{_tick(key)} ran {len(records)} times on r{key[0]}"

    def outcome_fits(self, key: Key, end: Seen) -> Iterator[str]:
        """The outcome reported is what happened to the body and its lease."""
        kind, records = end.event.kind, self.records.get(key, [])
        record = records[0] if records else None
        lost = self.loss_of(key, end.at)
        if record is not None and record.how == "returned":
            if kind is not EventKind.SUCCEEDED:
                yield f"{_show(end)}: the body returned"
            return
        if kind is EventKind.LEASE_LOST:
            if lost is None:
                yield f"{_show(end)}: its lease was never lost"
            return
        if kind is EventKind.TIMED_OUT:
            timeout = self.jobs[key[1]].timeout
            if record is None or timeout is None or record.end is None:
                yield f"{_show(end)}: no body ran to time out"
            elif abs(record.end - record.start - timeout) > EPS:
                yield f"{_show(end)}: cancelled {record.end - record.start:.6f}s in, not {timeout}"
            return
        yield f"{_show(end)}: reported {kind} (body {record.how if record else 'never ran'})"

    def loss_of(self, key: Key, at: float) -> Grant | None:
        """The lease of a run of ``key`` lost by ``at``: its job's, or the leader's."""
        replica, job, _ = key
        name = job if self.lock_mode else LEADER
        tokens = {r.token for r in self.records.get(key, [])}
        for grant in self.world.grants.values():
            if grant.owner != f"r{replica}" or grant.name != name or grant.end not in _LOST:
                continue
            ended = grant.ended_at
            if ended is not None and ended <= at + EPS and (not tokens or grant.token in tokens):
                return grant
        return None

    # --- a run holds its lock until it returns --------------------------------------------

    def leases_cover_runs(self) -> Iterator[str]:
        for record in self.h.records:
            what = f"{_tick((record.replica, record.job, record.fire))} on r{record.replica}"
            grant = self.world.grants.get(record.token) if record.token is not None else None
            name = record.job if self.lock_mode else LEADER
            if grant is None or grant.name != name or grant.owner != f"r{record.replica}":
                held = f"{grant.name!r} of {grant.owner}" if grant else "nothing"
                yield f"{what} ran under token {record.token}: {held}, not {name!r} of its own"
                continue
            if grant.granted_at > record.start + EPS:
                yield f"{what} started before its lease was granted"
            if record.end is None:
                yield f"{what} never ended"
            elif grant.ended_at is not None and grant.ended_at < record.end - EPS:
                # A lost lease cancels the body at that very instant (async bodies).
                yield (
                    f"{what}: its lease ended ({grant.end}) at {_t(grant.ended_at)},"
                    f" before the body at {_t(record.end)}"
                )

    def no_overlap(self) -> Iterator[str]:
        by_job: dict[str, list[RunRecord]] = defaultdict(list)
        for record in self.h.records:
            by_job[record.job].append(record)
        for job, records in by_job.items():
            records.sort(key=lambda r: r.start)
            latest: RunRecord | None = None
            for record in records:
                if latest is not None and record.start < _end(latest) - EPS:
                    yield (f"two runs of {job} overlap: {_run(latest)} and {_run(record)}")
                if latest is None or _end(record) > _end(latest):
                    latest = record

    def holds(self) -> Iterator[str]:
        """Each job lease is kept until ``min(F + 2s + g, next F)`` after its last tick F
        by its holder's clock, and released then (within the 50 ms grid); a lease no
        body ran under (granted while stopping, lost before the run began) is let go at
        once: held, it would only keep the tick from every other replica."""
        if not self.lock_mode:
            return
        if self.sc.claims:
            yield from self.released_after_runs()
            return
        by_token: dict[int, list[RunRecord]] = defaultdict(list)
        for record in self.h.records:
            if record.token is not None:
                by_token[record.token].append(record)
        for unused in self.world.grants.values():
            if unused.token in by_token or unused.owner == OUTSIDER or unused.name not in self.jobs:
                continue
            ended = unused.ended_at or math.inf
            crashed = self.crashed(unused.owner)
            if crashed is not None and crashed <= ended:
                continue  # it ends with its holder (session) or expires after it (TTL)
            if ended - unused.granted_at > self.slack + EPS:
                yield (
                    f"{unused.owner} kept a lease on {unused.name!r} that no run used"
                    f" from {_t(unused.granted_at)} to {_t(ended)}"
                )
        for token, records in by_token.items():
            grant = self.world.grants.get(token)
            if grant is None or grant.name not in self.jobs or grant.ended_at is None:
                continue
            crashed = self.crashed(grant.owner)
            if crashed is not None and crashed <= grant.ended_at:
                continue  # it ended with its holder, or expired after it (the TTL)
            last = max(records, key=lambda r: r.fire)
            job = self.jobs[last.job]
            span = 2 * self.sc.skew_tolerance + self.sc.grace(job)
            following = self.next_fire(job.name, last.fire)
            cap = math.inf if following is None else following.timestamp()
            offset = self.offsets[last.replica]
            body = max(_end(r) for r in records)
            low = max(body, min(last.fire.timestamp() + span, cap) - offset)
            high = max(body, min(last.fire.timestamp() + span + GRID, cap) - offset)
            what = f"the lease of {_tick((last.replica, last.job, last.fire))} on r{last.replica}"
            ended = grant.ended_at
            if grant.end == "released" and ended < low - EPS:
                yield f"{what} was released at {_t(ended)}, before its hold's end {_t(low)}"
            if ended > high + self.slack + EPS:
                yield f"{what} was kept until {_t(ended)}, past its hold's end {_t(high)}"

    def released_after_runs(self) -> Iterator[str]:
        """With claims there is no hold: each job lease a run used is released once its
        body ends (a lease no run used, at once)."""
        bodies: dict[int, float] = {}
        for record in self.h.records:
            if record.token is not None:
                bodies[record.token] = max(bodies.get(record.token, -math.inf), _end(record))
        for grant in self.world.grants.values():
            if grant.owner == OUTSIDER or grant.name not in self.jobs:
                continue
            ended = grant.ended_at or math.inf
            crashed = self.crashed(grant.owner)
            if crashed is not None and crashed <= ended:
                continue
            done = bodies.get(grant.token, grant.granted_at)
            if ended > done + self.slack + EPS:
                yield (
                    f"{grant.owner} kept the lease {grant.token} on {grant.name!r} until"
                    f" {_t(ended)}, past its run's end {_t(done)} (claims: no hold)"
                )

    def renewed_and_released(self) -> Iterator[str]:
        for grant in self.world.grants.values():
            if grant.owner == OUTSIDER:
                continue
            crashed = self.crashed(grant.owner)
            alive = crashed is None or (grant.ended_at is not None and grant.ended_at < crashed)
            if grant.end == "expired" and alive:
                yield f"{grant.owner}'s lease on {grant.name!r} expired while it lived: not renewed"
            if grant.ended_at is None and crashed is None:
                yield f"{grant.owner}'s lease on {grant.name!r} was never released"
        for i, life in enumerate(self.h.lives):
            if life.left_held:
                yield f"r{i} stopped still holding tokens {life.left_held}"

    # --- each tick at most once -------------------------------------------------------------

    def at_most_once(self) -> Iterator[str]:
        """A second run of a tick is a duplicate, but for the documented limits: an
        earlier run's lease was lost (revoked, expired, its holder crashed) before the
        second began, or the hold was cut at the next fire time (2s + g >= I) and the
        second replica tried after it ended (``Δ + λ`` beyond ``I``: a very late try)."""
        if not self.within:
            return
        by_tick: dict[tuple[str, datetime], list[RunRecord]] = defaultdict(list)
        for record in self.h.records:
            by_tick[(record.job, record.fire)].append(record)
        for (job, fire), records in by_tick.items():
            records.sort(key=lambda r: r.start)
            if self.sc.claims:  # a claimed tick is never run again, not even after a loss
                if len(records) > 1:
                    yield f"{_tick((records[1].replica, job, fire))} ran twice: " + str(
                        [_run(r) for r in records]
                    )
                continue
            spec = self.jobs[job]
            following = self.next_fire(job, fire)
            cut = following is not None and (
                2 * self.sc.skew_tolerance + self.sc.grace(spec)
                >= (following - fire).total_seconds()
            )
            for i, later in enumerate(records[1:], 1):
                if not any(self.excused(earlier, later, cut) for earlier in records[:i]):
                    runs = [_run(r) for r in records]
                    yield f"{_tick((later.replica, job, fire))} ran twice: {runs}"

    def excused(self, earlier: RunRecord, later: RunRecord, cut: bool) -> bool:
        grant = self.world.grants.get(earlier.token) if earlier.token is not None else None
        if grant is None or grant.ended_at is None or grant.ended_at > later.start + EPS:
            return False
        return grant.end in _LOST or cut

    # --- exactly once while a replica is alive to try it ------------------------------------

    def skips_justified(self) -> Iterator[str]:
        """Every replica alive through a tick decides it once, and a tick it does not run
        is skipped for a reason that was true at that moment."""
        for job in self.sc.jobs:
            for fire in self.ticks(job):
                for replica, life in enumerate(self.h.lives):
                    key = (replica, job.name, fire)
                    decided = self.decisions.get(key, [])
                    when = fire.timestamp() - self.offsets[replica]
                    window = self.sc.grace(job) + max(job.durations) + 4 * self.round_trip + 0.01
                    if not decided:
                        if life.up(when, when + window):
                            yield f"r{replica} was up but never decided {_tick(key)}"
                        continue
                    for seen in decided:
                        reason = self.unjustified(seen, when)
                        if reason is not None:
                            yield f"{_show(seen)}: {reason}"

    def ticks(self, job: JobSpec) -> Iterator[datetime]:
        fire = self.next_fire(job.name, datetime.fromtimestamp(T0 - 10, UTC))
        end = T0 + self.sc.length
        while fire is not None and fire.timestamp() <= end:
            yield fire
            fire = self.next_fire(job.name, fire)

    def next_fire(self, job: str, after: datetime) -> datetime | None:
        return self.triggers[job].next_fire(after, _UTC, job)

    def unjustified(self, seen: Seen, when: float) -> str | None:
        """Why ``seen`` (a replica's decision on a tick due at true time ``when``) was
        not true when it was made; ``None`` if it was."""
        event, owner = seen.event, f"r{seen.replica}"
        kind, reason = event.kind, event.reason or ""
        if kind is EventKind.STARTED:
            return None
        if kind is EventKind.SKIPPED_OVERLAP:
            if self.running(seen.replica, event.job, seen.at) or self.trying(
                seen.replica, event.job, seen.at
            ):
                return None
            return "no run of the job was going on this replica"
        if kind is EventKind.MISSED:
            late = self.clock(seen.replica, seen.at) - event.fire_time.timestamp()
            job = self.jobs[event.job]
            if late < self.grace(job, event.fire_time) - EPS:
                return f"only {late:.6f}s late"
            if "waited" in reason and not (
                self.running(seen.replica, event.job, when)
                or self.trying(seen.replica, event.job, when)
                or self.releasing(seen.replica, event.job, when)
            ):
                return "waited, but nothing of the job was going on at the tick"
            return None
        if kind is not EventKind.SKIPPED_HELD:
            return f"{kind} ({reason})"
        if reason == "another replica claimed it":
            fire = round(event.fire_time.timestamp() * 1_000_000)
            claims = [
                c
                for c in self.world.claim_log
                if c.owner == owner and c.name == event.job and c.fire == fire and c.at <= seen.at
            ]
            if not claims or claims[-1].won:
                return "no lost claim behind it"
            return None
        if reason == "another replica holds it":
            tries = [
                t
                for t in self.world.tries
                if t.owner == owner and t.name == event.job and when - EPS <= t.at <= seen.at + EPS
            ]
            if not tries or tries[-1].token is not None:
                return "no refused try of the lock behind it"
            if tries[-1].holder == owner:
                return "the lock was held by this same replica"
            return None
        # The leader grants of this replica around the decision (one that ends at that
        # very instant may have ended just before it or just after).
        leads = [
            g
            for g in self.world.grants.values()
            if g.name == LEADER
            and g.owner == owner
            and g.granted_at <= seen.at + EPS
            and (g.ended_at is None or g.ended_at >= seen.at - EPS)
        ]
        if reason == "not the leader":
            for g in leads:
                ended = math.inf if g.ended_at is None else g.ended_at
                if g.granted_at < seen.at - self.round_trip - EPS and ended > seen.at + EPS:
                    return "it held the leader lease"
            return None
        if reason.startswith("leadership too recent"):
            since = [g.granted_at + self.offsets[seen.replica] + self.round_trip for g in leads]
            limit = max(since, default=-math.inf) + 2 * self.sc.skew_tolerance
            if event.fire_time.timestamp() < limit + EPS:
                return None
            return "its leadership began more than 2 x skew_tolerance before the tick"
        return f"unknown reason {reason!r}"

    def running(self, replica: int, job: str, at: float) -> bool:
        return any(
            r.replica == replica and r.job == job and r.start - EPS <= at <= _end(r) + EPS
            for r in self.h.records
        )

    def trying(self, replica: int, job: str, at: float) -> bool:
        """Whether a try of the replica for the job's lock, or a claim of one of its
        ticks, was in flight at ``at`` (its run is under way from the moment the first
        is sent: with claims, the claim)."""
        latency, owner = self.sc.latency, f"r{replica}"
        sent = [(t.owner, t.name, t.at) for t in self.world.tries]
        sent += [(c.owner, c.name, c.at) for c in self.world.claim_log]
        return any(o == owner and n == job and abs(at - t) <= latency + EPS for o, n, t in sent)

    def releasing(self, replica: int, job: str, at: float) -> bool:
        """Whether the replica held the job's lease at ``at``, or had not yet heard that
        its release went through: a backend without a batch release frees the leases
        whose holds end together one after the other, and the scheduler hears of them
        all once the last is answered."""
        owner = f"r{replica}"
        done: dict[int, float] = {}  # token -> when its batch of releases was answered
        batch: list[int] = []
        last = -math.inf
        for release in self.world.releases:
            if self.world.grants[release.token].owner != owner:
                continue
            if release.sent > last + EPS:
                batch = []
            batch.append(release.token)
            last = release.done
            for token in batch:
                done[token] = last
        return any(
            g.owner == owner
            and g.name == job
            and g.granted_at - EPS <= at
            and (g.ended_at is None or at <= done.get(g.token, g.ended_at) + EPS)
            for g in self.world.grants.values()
        )

    def crashed(self, owner: str) -> float | None:
        """When the replica named ``owner`` (``r<i>``) crashed, if it did."""
        return self.h.lives[int(owner[1:])].crashed

    def clock(self, replica: int, at: float) -> float:
        return at + self.offsets[replica]


def _is_decision(event: JobEvent) -> bool:
    return event.kind in _DECISIONS or (
        event.kind is EventKind.FAILED and event.reason == "lock unavailable"
    )


def _end(record: RunRecord) -> float:
    return math.inf if record.end is None else record.end


def _t(at: float) -> str:
    return f"T0{at - T0:+.6f}"


def _tick(key: Key) -> str:
    return f"{key[1]}@T0{key[2].timestamp() - T0:+.6f}"


def _show(seen: Seen) -> str:
    event = seen.event
    reason = f" ({event.reason})" if event.reason else ""
    tick = _tick((seen.replica, event.job, event.fire_time))
    return f"r{seen.replica} {event.kind} {tick} at {_t(seen.at)}{reason}"


def _run(record: RunRecord) -> str:
    end = "..." if record.end is None else _t(record.end)
    return f"r{record.replica} [{_t(record.start)}, {end}] {record.how} token {record.token}"


assert _ENDS.isdisjoint(_DECISIONS)
