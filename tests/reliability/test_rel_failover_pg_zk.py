"""Failover under a running fleet, PostgreSQL and ZooKeeper: the server side fails while
leases are held and three scheduler replicas run their jobs.

* **ZooKeeper**: the leader of a 3-node ensemble is SIGKILLed. Two fleets run on the
  ensemble at once, one with ``suspended=lost`` (the default: the holder gives its
  lease up at once) and one with ``suspended=keep`` (the lease rides the election).
* **PostgreSQL**: the primary of a pair with a synchronous streaming standby is
  SIGKILLed (every process at once) and the standby promoted at once, as a failover
  manager would; the replicas' URL names both hosts.

Measured per fleet: the time from the fault until the holder of a running job learns
(``lease_lost``), the time until another client can take that job's name (a prober
in this process), whether any (job, tick) started twice, and whether a job's fencing
token ever went backwards from one tick to the next. Every tick from a few seconds
after the server side is whole again (the killed member back in the ensemble, the
standby promoted) on must run exactly once.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import multilock
from multilock.errors import BackendUnavailable
from multilock.testing._servers.postgres import ReplicatedPair, programs
from multilock.testing._servers.process import script
from multilock.testing._servers.zookeeper import ZooKeeperEnsemble
from tests.reliability.conftest import Measured

pytestmark = [pytest.mark.topology, pytest.mark.faults, pytest.mark.slow]

REPLICA = Path(__file__).with_name("_failover_replica.py")
REPLICAS = 3
JOBS = 10
BEFORE = 3  # ticks the fleet runs before the fault
AFTER = 7  # seconds it runs after the recovery
SETTLE = 2.0  # seconds after the recovery from which every tick must run exactly once
READY = 60.0
BOUND = 30.0
LOST_BOUND = 1.0  # a fault that closes connections: the holder is told at once


class Fleet:
    """:data:`REPLICAS` replica processes of :data:`REPLICA` and their records."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.prefix = f"failover-{uuid.uuid4().hex[:8]}"
        self.record = workdir / f"{self.prefix}.log"
        self.logs = [workdir / f"{self.prefix}-{i}.stderr" for i in range(REPLICAS)]
        self.procs: list[subprocess.Popen[str]] = []

    @property
    def long_job(self) -> str:
        """The name of the job that runs 1.5 s of every 2."""
        return f"{self.prefix}-long"

    def start(self) -> None:
        for i, log in enumerate(self.logs):
            argv = [self.url, self.prefix, str(JOBS), str(self.record), f"r{i}"]
            with log.open("w") as stderr:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(REPLICA), *argv],
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        text=True,
                    )
                )
        for i, proc in enumerate(self.procs):
            assert proc.stdout is not None
            ready = _readline(proc, READY)
            proc.stdout.close()
            if ready != "ready":
                self.stop()
                pytest.fail(f"replica r{i} did not start: {ready!r} {self.stderr(i)}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for i, proc in enumerate(self.procs):
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
            assert code == 0, f"replica r{i} exited with {code}: {self.stderr(i)}"

    def stderr(self, i: int) -> str:
        return self.logs[i].read_text()[-3000:] if self.logs[i].exists() else ""

    def lines(self, kind: str) -> list[list[str]]:
        """The record's lines of ``kind`` (``start``, ``lost`` or ``missed``), split (the
        reason of ``missed`` in one piece)."""
        if not self.record.exists():
            return []
        split = (line.split(" ", 5) for line in self.record.read_text().splitlines())
        return [words[1:] for words in split if words[0] == kind]


def _readline(proc: subprocess.Popen[str], within: float) -> str:
    """The process's first stdout line, or "" after ``within`` seconds."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(within)
    return got[0].strip() if got else ""


@dataclass
class Outcome:
    """One fleet's failover, read from its record."""

    fault_at: float
    recovered_after: float
    lost_after: float | None
    taken_after: float | None
    twice: int
    backwards: list[str]
    missing: list[tuple[str, int]]
    missed: list[str]
    """Why the replicas missed the ticks in ``missing``."""
    ticks: int
    notes: dict[str, float] = field(default_factory=dict)

    def row(self) -> str:
        if self.lost_after is None:
            lost = "no lease_lost (the lease rode it)"
            taken = "the name free once the holder's run ended"
        else:
            lost = f"lease_lost after {self.lost_after:.3f} s"
            taken = "the name taken by another client"
        when = "never" if self.taken_after is None else f"after {self.taken_after:.2f} s"
        notes = "".join(f"; {what} {value:.2f} s" for what, value in self.notes.items())
        return (
            f"{lost}; {taken} {when}{notes}; {self.ticks} (job, tick) started:"
            f" {self.twice} twice; fencing tokens went backwards {len(self.backwards)} times;"
            f" {len(self.missing)} ticks missed from {SETTLE:g} s after the recovery"
        )


def _analyse(
    fleet: Fleet, fault_at: float, recovered_at: float, taken_at: float | None, last: float
) -> Outcome:
    starts = fleet.lines("start")
    counted = Counter((job, int(fire)) for job, fire, *_ in starts)
    tokens: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for job, fire, _, token, _ in starts:
        tokens[job].append((int(fire), int(token)))
    backwards = []
    for job, seen in tokens.items():
        ordered = [token for _, token in sorted(seen)]
        backwards += [f"{job}: {a} then {b}" for a, b in itertools.pairwise(ordered) if b <= a]
    held = [
        float(at) - fault_at
        for job, _, _, at in fleet.lines("lost")
        if job == fleet.long_job and float(at) >= fault_at
    ]
    first = math.ceil(recovered_at + SETTLE)
    wanted = {
        (f"{fleet.prefix}-{j}", t * 1000) for j in range(JOBS) for t in range(first, int(last))
    }
    wanted |= {(fleet.long_job, t * 1000) for t in range(first + first % 2, int(last), 2)}
    missing = sorted(wanted - set(counted))
    missed = [
        f"{job} {fire} {replica}: {reason}"
        for job, fire, replica, _, reason in fleet.lines("missed")
        if (job, int(fire)) in missing
    ]
    return Outcome(
        fault_at=fault_at,
        recovered_after=recovered_at - fault_at,
        lost_after=min(held) if held else None,
        taken_after=None if taken_at is None else taken_at - fault_at,
        twice=sum(1 for n in counted.values() if n > 1),
        backwards=backwards,
        missing=missing,
        missed=missed,
        ticks=len(counted),
    )


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.2))


def _prober(url: str, name: str, since: float) -> Callable[[], float | None]:
    """Try ``name`` every 10 ms from now on, in a thread, until it is taken (then let it
    go at once) or ``BOUND`` passes; the returned call waits and says when it was taken."""
    result: list[float | None] = [None]

    def probe() -> None:
        with multilock.connect(url) as locker:
            while time.time() < since + BOUND:
                try:
                    lease = locker.try_acquire(name)
                except BackendUnavailable:
                    lease = None
                if lease is not None:
                    result[0] = time.time()
                    lease.release()
                    return
                time.sleep(0.01)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()

    def taken() -> float | None:
        thread.join(BOUND + 5)
        return result[0]

    return taken


def run_failover(
    fleets: list[Fleet], probe_urls: list[str], fault: Callable[[], dict[str, float]]
) -> list[Outcome]:
    """Start ``fleets``, inject ``fault`` in the middle of a run of their long job, let
    them run on, stop them; each one's :class:`Outcome` (with ``fault``'s timings)."""
    for fleet in fleets:
        fleet.start()
    try:
        start = math.ceil(time.time()) + BEFORE
        fault_at = start + start % 2 + 0.7  # the long job fires at even seconds, runs 1.5 s
        _sleep_until(fault_at)
        fault_at = time.time()
        probes = [
            _prober(url, fleet.long_job, fault_at)
            for url, fleet in zip(probe_urls, fleets, strict=True)
        ]
        notes = fault()
        recovered_at = time.time()
        taken = [probe() for probe in probes]
        last = recovered_at + AFTER
        _sleep_until(last + 1.0)  # the last tick has fired everywhere
    finally:
        for fleet in fleets:
            fleet.stop()
    outcomes = [
        _analyse(fleet, fault_at, recovered_at, at, last)
        for fleet, at in zip(fleets, taken, strict=True)
    ]
    for outcome in outcomes:
        outcome.notes = notes
    return outcomes


def _check(outcome: Outcome, *, rides: bool) -> None:
    assert outcome.twice == 0, f"{outcome.twice} (job, tick) started twice"
    assert not outcome.backwards, f"fencing tokens went backwards: {outcome.backwards[:5]}"
    assert not outcome.missing, (
        f"{len(outcome.missing)} ticks never ran after the recovery"
        f" ({outcome.recovered_after:.2f} s after the fault): {outcome.missing[:5]};"
        f" missed because: {outcome.missed[:5]}"
    )
    if rides:
        assert outcome.lost_after is None, (
            f"the lease did not ride: lost after {outcome.lost_after}"
        )
    else:
        assert outcome.lost_after is not None, "the holder of the running job was never told"
        assert outcome.lost_after < LOST_BOUND
        assert outcome.taken_after is not None
        assert outcome.lost_after < outcome.taken_after


@pytest.fixture(scope="module")
def ensemble(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ZooKeeperEnsemble]:
    """A started 3-node ZooKeeper ensemble."""
    zookeeper_sh = script(request.config, "zookeeper.sh")
    started = ZooKeeperEnsemble(zookeeper_sh, tmp_path_factory.mktemp("ensemble"))
    try:
        started.start()
        yield started
    finally:
        started.stop()


def test_zookeeper_leader_killed_under_a_fleet(
    ensemble: ZooKeeperEnsemble, tmp_path: Path, measured: Measured
) -> None:
    urls = [
        f"{ensemble.url(f'/failover-{policy}')}?suspended={policy}" for policy in ("lost", "keep")
    ]
    fleets = [Fleet(url, tmp_path) for url in urls]

    def kill_leader() -> dict[str, float]:
        killed = ensemble.members[ensemble.leader()]
        at = time.monotonic()
        os.kill(killed.pid(), signal.SIGKILL)
        others = [member for member in ensemble.members if member is not killed]
        ensemble.wait_serving(BOUND, others)
        elected = time.monotonic() - at
        killed.stop()  # forget the dead process; it rejoins on its data
        killed.start()
        ensemble.wait_serving(BOUND)
        whole = time.monotonic() - at
        return {"new leader elected after": elected, "the ensemble whole again after": whole}

    lost, kept = run_failover(fleets, urls, kill_leader)
    _check(lost, rides=False)
    _check(kept, rides=True)
    measured(
        "ZooKeeper leader killed (3-node ensemble) under a fleet, suspended=lost",
        "zookeeper",
        f"the running job's holder told within {LOST_BOUND:g} s, the name free once it is"
        " back (it deletes its node), no tick twice, fencing tokens (czxid) only increase",
        lost.row(),
    )
    measured(
        "ZooKeeper leader killed (3-node ensemble) under a fleet, suspended=keep",
        "zookeeper",
        "the lease rides the election (no lease_lost: same session, same node), the name"
        " free only when its run ends, no tick twice, fencing tokens only increase",
        kept.row(),
    )


def test_postgres_primary_killed_standby_promoted_under_a_fleet(
    request: pytest.FixtureRequest, tmp_path: Path, measured: Measured
) -> None:
    pair = ReplicatedPair(programs(request.config, "pg_basebackup"))
    try:
        standby = pair.standby
        assert standby is not None
        url = f"{pair.url}?fencing=true&health_interval=1&connect_timeout=2"
        fleet = Fleet(url, tmp_path)

        def fail_over() -> dict[str, float]:
            at = time.monotonic()
            pair.primary.kill()
            standby.promote()
            return {"the standby promoted after": time.monotonic() - at}

        (outcome,) = run_failover([fleet], [url], fail_over)
    finally:
        pair.remove()
    _check(outcome, rides=False)
    measured(
        "PostgreSQL primary killed, synchronous standby promoted, under a fleet",
        "postgres",
        f"the running job's holder told within {LOST_BOUND:g} s, the name free on the new"
        " primary once promoted, no tick twice, fencing tokens (a replicated sequence) only"
        " increase",
        outcome.row(),
    )
