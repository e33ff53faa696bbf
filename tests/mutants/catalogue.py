"""A catalogue of single-idea bugs in the scheduler's exactly-once machinery.

Each mutant is a plausible slip of someone refactoring the hold, the batch, the
renewal, the leader hand-over or the fire-time computation, written as exact text
replacements in ``multilock/``. ``run.py`` applies each to a copy of the tree and
proves that the fast tests (the scheduler's unit tests, the triggers', the
simulation) fail on it; ``test_catalogue.py`` checks on every test run that each
target text is still there exactly once, so that a refactoring that moves one
fails loudly (update the mutant to the new code: same idea, new text).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CATALOGUE", "Drift", "Mutant", "apply"]


class Drift(Exception):
    """A mutant's target text is not in the code (any more): update the catalogue."""


@dataclass(frozen=True)
class Mutant:
    """One bug: ``edits`` replace text in ``path`` (under the repository root); each
    ``old`` must occur there exactly once."""

    name: str
    idea: str
    path: str
    edits: tuple[tuple[str, str], ...]


_SCHEDULER = "multilock/_scheduling/scheduler.py"
_RUNS = "multilock/_scheduling/runs.py"

CATALOGUE: tuple[Mutant, ...] = (
    # --- the hold -------------------------------------------------------------------------
    Mutant(
        "hold-one-skew",
        "the hold counts the skew once: two clocks differ by up to twice the tolerance",
        "multilock/_scheduling/jobs.py",
        (
            (
                "return 2 * skew_tolerance + job.misfire_grace",
                "return skew_tolerance + job.misfire_grace",
            ),
        ),
    ),
    Mutant(
        "hold-without-grace",
        "the hold forgets that a replica may try up to misfire_grace late",
        "multilock/_scheduling/jobs.py",
        (("return 2 * skew_tolerance + job.misfire_grace", "return 2 * skew_tolerance"),),
    ),
    Mutant(
        "hold-grid-rounds-down",
        "the hold's end is rounded down to the 50 ms grid instead of up",
        _SCHEDULER,
        (
            (
                "until = math.ceil(until * _HOLD_GRID) / _HOLD_GRID",
                "until = math.floor(until * _HOLD_GRID) / _HOLD_GRID",
            ),
        ),
    ),
    Mutant(
        "hold-past-next-fire",
        "the hold is not cut at the next fire time",
        _SCHEDULER,
        (
            (
                "return until if following is None else min(until, following.timestamp())",
                "return until",
            ),
        ),
    ),
    Mutant(
        "hold-cut-at-own-fire",
        "the cached successor is read as the fire itself: the hold ends at its own tick",
        _SCHEDULER,
        (("following = state.next_fire", "following = state.successor"),),
    ),
    Mutant(
        "release-at-body-end",
        "a run releases its lease when its body ends, as a plain lock would (no hold)",
        _RUNS,
        (
            (
                "if self.lease is not None and kind is not _LEASE_LOST:",
                "if self.lease is not None and kind is _LEASE_LOST:",
            ),
        ),
    ),
    Mutant(
        "hold-timed-from-the-tick",
        "the hold's timer is armed when the run starts: a run that outlives its hold"
        " loses its lock while it still runs",
        _RUNS,
        (
            (
                "        self._keepalive = keepalive\n",
                "        self._keepalive = keepalive\n"
                "        self._hold_end = self._host.hold_until(self.job, self.fire)\n"
                "        self._host.hold_timers().add(self._hold_end, self)\n",
            ),
            (
                "        if self.life.state is _HOLDING:",
                "        if self.life.state in (_HOLDING, RunState.RUNNING):",
            ),
        ),
    ),
    Mutant(
        "holding-counts-as-running",
        "a job in its hold is read as still running: its next tick is skipped as an"
        " overlap instead of taking the lease over",
        "multilock/_scheduling/run_states.py",
        (
            (
                "{_S.DUE, _S.ACQUIRING, _S.RUNNING, _S.LOST, _S.TIMED_OUT}",
                "{_S.DUE, _S.ACQUIRING, _S.RUNNING, _S.LOST, _S.TIMED_OUT, _S.HOLDING}",
            ),
        ),
    ),
    Mutant(
        "settle-frees-a-newer-tick",
        "an older tick's end frees the job while a newer tick (which took the lease"
        " over) is under way",
        _SCHEDULER,
        (("        if tick is None or self.current is tick:\n", "        if True:\n"),),
    ),
    Mutant(
        "stop-skips-holds",
        "stop() does not wait for the runs in their hold: it releases their leases early",
        _SCHEDULER,
        (("        if self._active or self._runs:\n", "        if self._runs:\n"),),
    ),
    # --- the batch ------------------------------------------------------------------------
    Mutant(
        "batch-grants-by-position",
        "the leases of a batch are handed out in order, to the jobs in order: wrong"
        " when only some names are free",
        _SCHEDULER,
        (
            (
                "        for due in shared:\n            lease = leases.get(due.job.name)\n",
                "        free = iter([lease for lease in leases.values() if lease is not None])\n"
                "        for due in shared:\n            lease = next(free, None)\n",
            ),
        ),
    ),
    Mutant(
        "no-claim-on-the-common-path",
        "the common path starts a run without marking the job as running",
        _SCHEDULER,
        (
            (
                "                if not self._continue_hold(due, held):\n"
                "                    state.claim(due)\n"
                "                    batch.append(due)\n"
                "                continue\n",
                "                if not self._continue_hold(due, held):\n"
                "                    batch.append(due)\n"
                "                continue\n",
            ),
        ),
    ),
    Mutant(
        "unavailable-reported-as-held",
        "a backend that cannot be asked is reported as another replica holding the lock",
        _SCHEDULER,
        (
            (
                "EventKind.MISSED, due.job, due.fire, error=exc, reason=reason, logged=first",
                "EventKind.SKIPPED_HELD, due.job, due.fire, error=exc, reason=reason, logged=first",
            ),
        ),
    ),
    # --- the renewal ----------------------------------------------------------------------
    Mutant(
        "renewal-inverted",
        "the scheduler renews the leases of backends that renew them, and not the others",
        "multilock/_scheduling/leadership.py",
        (
            (
                "return Capability.TTL in caps and Capability.RENEWAL not in caps",
                "return Capability.TTL in caps and Capability.RENEWAL in caps",
            ),
        ),
    ),
    Mutant(
        "runs-not-renewed",
        "the scheduler's own renewal of its runs' leases is switched off",
        _SCHEDULER,
        (("self._keep_alive = needs_keep_alive(locker)", "self._keep_alive = False"),),
    ),
    Mutant(
        "ttl-without-margin",
        "a TTL lease is taken for the hold alone, without the lease_ttl margin",
        _SCHEDULER,
        (
            (
                "max(hold, 0.0) + self.lease_ttl",
                "max(hold, 0.0)",
            ),
        ),
    ),
    # --- leases lost ----------------------------------------------------------------------
    Mutant(
        "lost-lease-not-watched",
        "a run does not watch its lease's lost signal: the body goes on without the lock",
        _RUNS,
        (("            self.lost.add_callback(self)\n", "            pass\n"),),
    ),
    Mutant(
        "leader-runs-not-cancelled",
        "runs in leader mode do not watch the leader lease",
        _SCHEDULER,
        (
            (
                "runs.append((due, None, leader.lost, leader.fencing_token))",
                "runs.append((due, None, None, leader.fencing_token))",
            ),
        ),
    ),
    # --- the leader hand-over -------------------------------------------------------------
    Mutant(
        "leader-no-handover-guard",
        "a new leader runs the ticks just before its leadership began",
        _SCHEDULER,
        (
            (
                "elif due.at < self._leadership.since + 2 * self.skew_tolerance:",
                "elif due.at < self._leadership.since:",
            ),
        ),
    ),
    # --- fire times and lateness ----------------------------------------------------------
    Mutant(
        "fire-time-from-clock",
        "a run's fire_time is the clock reading when it starts, not the tick",
        _SCHEDULER,
        (
            (
                "run = RunContext(due.job.name, due.fire, self.replica_id, token)",
                "run = RunContext(\n"
                "                due.job.name, datetime.fromtimestamp(self.clock.now(), UTC),"
                " self.replica_id, token\n            )",
            ),
        ),
    ),
    Mutant(
        "every-ignores-start",
        "every(start=...) is anchored to the epoch anyway",
        "multilock/_scheduling/triggers.py",
        (
            (
                "return IntervalTrigger(summed, start.astimezone(UTC), spread)",
                "return IntervalTrigger(summed, EPOCH, spread)",
            ),
        ),
    ),
    Mutant(
        "waiting-ignores-the-grace",
        'overlap="wait" runs a tick after the previous run however late it is',
        _SCHEDULER,
        (
            (
                "        if late > grace:\n            self._miss(",
                "        if late > grace + 3600:\n            self._miss(",
            ),
        ),
    ),
    Mutant(
        "lookback-past-the-hold",
        "a starting replica considers every tick within misfire_grace + 2 x skew_tolerance",
        _SCHEDULER,
        (
            (
                "lookback = min(state.job.misfire_grace, self.skew_tolerance)",
                "lookback = state.job.misfire_grace + 2 * self.skew_tolerance",
            ),
        ),
    ),
    Mutant(
        "coalesce-keeps-the-oldest",
        "coalescing runs the oldest of the ticks due instead of the latest",
        _SCHEDULER,
        (("fresh = fresh[-1:]", "fresh = fresh[:1]"),),
    ),
    Mutant(
        "claim-lost-still-runs",
        "a tick another replica claimed is run all the same (the lock alone decides)",
        _SCHEDULER,
        (("            elif won.get(due.job.name):\n", "            elif True:\n"),),
    ),
    Mutant(
        "claimed-ticks-coalesced",
        "claimed ticks due together are coalesced: those a jumped clock skipped are lost",
        _SCHEDULER,
        (
            (
                "if job.coalesce and len(fresh) > 1 and not self._claiming(job):",
                "if job.coalesce and len(fresh) > 1:",
            ),
        ),
    ),
    # --- bursts prepared ahead of their instant -------------------------------------------
    Mutant(
        "burst-starts-when-prepared",
        "the bodies of a burst start when it is prepared, before their fire time",
        _SCHEDULER,
        (
            (
                "            if start[0].at > now:\n                runs = self._launch_later",
                "            if False:\n                runs = self._launch_later",
            ),
        ),
    ),
    Mutant(
        "busy-job-prepared-ahead",
        "a job still running when its burst is prepared is decided then, not at its"
        " fire time: skipped as overlapping though its run ends before it",
        _SCHEDULER,
        (
            (
                "            if first_at > now and (not state.ready or state.waiting):\n",
                "            if False:\n",
            ),
        ),
    ),
    Mutant(
        "prepared-runs-start-after-stop",
        "a burst prepared before a stop still starts its bodies at its instant",
        _SCHEDULER,
        (
            (
                "        if self._stopping:\n            self._abandon(runs)\n        else:\n"
                "            self._launch(runs, made)\n",
                "        self._launch(runs, made)\n",
            ),
        ),
    ),
    Mutant(
        "timeout-from-the-tick",
        "a job's timeout counts from its tick, not from when its run started",
        _RUNS,
        (
            (
                "deadline = started + self.job.timeout",
                "deadline = self.fire.timestamp() + self.job.timeout",
            ),
        ),
    ),
)


def apply(mutant: Mutant, root: Path) -> None:
    """Make the mutant's edits in the tree at ``root``; :class:`Drift` if a target is
    not found exactly once."""
    path = root / mutant.path
    text = path.read_text()
    for old, new in mutant.edits:
        found = text.count(old)
        if found != 1:
            raise Drift(
                f"mutant {mutant.name}: its target is in {mutant.path} {found} times, not once:"
                f" {old.strip()!r} (update tests/mutants/catalogue.py to the code)"
            )
        text = text.replace(old, new)
    path.write_text(text)
