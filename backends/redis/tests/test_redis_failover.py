"""A primary killed under held leases and under a running scheduler fleet, on a Redis
Cluster and behind Sentinel (each test starts its own: see
:mod:`multilock.testing._servers.redis`).

Measured, and printed as ``measured:`` lines (``pytest -s``; docs/operations.md
quotes them): how long the promotion took, when a holder learnt its lease was
``lost``, when another replica could take the name, whether a tick ran twice and
whether a fencing token ever went backwards.
"""

from __future__ import annotations

import itertools
import math
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import multilock
from multilock.testing import poll
from multilock.testing._servers.redis import Cluster, RedisServer, Sentinels
from multilock_redis import RedisLease, lock_key

pytestmark = [pytest.mark.topology, pytest.mark.slow]

PROMOTION_WITHIN = 30.0  # seconds: a failover takes a few on loopback
SHORT, LONG = 1.0, 10.0  # lease ttls: one shorter, one longer than a failover
SLACK = 0.5  # scheduling on a loaded 2-core machine
REPLICA = Path(__file__).with_name("failover_replica.py")


def report(what: str, **values: object) -> None:
    """One ``measured:`` line (shown by ``pytest -s``)."""
    shown = ", ".join(
        f"{key}={value:.2f}" if isinstance(value, float) else f"{key}={value}"
        for key, value in values.items()
    )
    print(f"measured: {what}: {shown}")


@dataclass
class Failover:
    """A topology to break: its URL, how to kill the primary of a key, how to know a
    replica took over."""

    url: str
    primary_for: Callable[[str], RedisServer]
    promoted: Callable[[RedisServer, str], RedisServer]


@pytest.fixture(params=["cluster", "sentinel"])
def failover(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Failover]:
    """A fresh Redis Cluster or Sentinel set-up of the test's own, to kill a primary of."""
    if request.param == "cluster":
        cluster = Cluster(tmp_path)
        try:
            cluster.start(request.config)
            yield Failover(
                cluster.url,
                lambda key: cluster.primary_for(key),
                lambda old, key: cluster.wait_promoted(old, key, PROMOTION_WITHIN),
            )
        finally:
            cluster.remove()
    else:
        sentinels = Sentinels(tmp_path)
        try:
            sentinels.start(request.config)

            def primary_for(key: str) -> RedisServer:
                port = sentinels.primary_port()
                assert port is not None, "no Sentinel answers"
                return sentinels.server(port)

            yield Failover(
                sentinels.url,
                primary_for,
                lambda old, key: sentinels.wait_promoted(old, PROMOTION_WITHIN),
            )
        finally:
            sentinels.remove()


def _names_on(failover: Failover, victim: RedisServer, prefix: str, count: int) -> list[str]:
    """``count`` lock names whose keys the ``victim`` primary serves."""
    names: list[str] = []
    i = 0
    while len(names) < count:
        name = f"{prefix}-{i}"
        if failover.primary_for(lock_key(name)) is victim:
            names.append(name)
        i += 1
    return names


def test_held_leases_across_a_killed_primary(failover: Failover) -> None:
    """Leases shorter than the failover are lost by their expiry, before anyone else
    can take them, and the next holder's fencing token is larger; leases longer than
    it are renewed on the promoted replica and never lost."""
    prefix = f"held-{uuid.uuid4().hex[:8]}"
    victim = failover.primary_for(lock_key(prefix))
    short_names = _names_on(failover, victim, f"{prefix}-short", 5)
    long_names = _names_on(failover, victim, f"{prefix}-long", 5)
    url = f"{failover.url}?socket_timeout=1s"
    with multilock.connect(url) as holder, multilock.connect(url) as contender:
        short = [_held(holder.try_acquire(name, ttl=SHORT)) for name in short_names]
        long = [_held(holder.try_acquire(name, ttl=LONG)) for name in long_names]
        lost_at: dict[str, float] = {}
        for lease in [*short, *long]:
            lease.lost.add_callback(_when_lost(lost_at, lease.name))
        acquired = time.monotonic()
        poll(
            "a renewal of every short lease",
            lambda: all(_renewed_since(lease, acquired, SHORT) for lease in short),
            SHORT * 2,
        )
        _replicated(victim, lock_key(long_names[0]))
        killed = time.monotonic()
        victim.stop()
        promoted = failover.promoted(victim, lock_key(prefix))
        promotion = time.monotonic() - killed

        taken: dict[str, tuple[float, int]] = {}

        def take_all() -> bool:
            for name in short_names:
                if name not in taken:
                    lease = contender.try_acquire(name)
                    if lease is not None:
                        taken[name] = (time.monotonic(), lease.fencing_token or 0)
            return len(taken) == len(short_names)

        poll("another locker takes every short lease", take_all, PROMOTION_WITHIN)
        renewed = poll(
            "the long leases are renewed on the promoted replica",
            lambda: all(_renewed_since(lease, killed, LONG) for lease in long),
            LONG / 2,
        )
        assert renewed
        assert all(contender.try_acquire(name) is None for name in long_names)
        assert not any(lease.lost.is_set() for lease in long), [str(lease.lost) for lease in long]

    for lease in short:
        learnt = lost_at[lease.name] - killed
        assert learnt <= SHORT + SLACK, f"{lease.name}: lost {learnt:.2f}s after the kill"
        when, token = taken[lease.name]
        assert lost_at[lease.name] <= when, f"{lease.name} was taken before its holder knew"
        assert token > (lease.fencing_token or 0), "the fencing token went backwards"
    report(
        f"held leases, {failover.url.split(':', 1)[0]}",
        promotion=promotion,
        new_primary=promoted.port,
        short_lost_after=max(lost_at[lease.name] for lease in short) - killed,
        short_taken_after=min(when for when, _ in taken.values()) - killed,
        long_leases_lost=sum(lease.lost.is_set() for lease in long),
    )


def _when_lost(lost_at: dict[str, float], name: str) -> Callable[[str], None]:
    def record(reason: str) -> None:
        lost_at.setdefault(name, time.monotonic())

    return record


def _held(lease: object) -> RedisLease:
    assert isinstance(lease, RedisLease), f"expected a lease, got {lease!r}"
    return lease


def _renewed_since(lease: RedisLease, since: float, ttl: float) -> bool:
    """Whether ``lease`` (of ``ttl``) had its expiry pushed past what it was before
    ``since``."""
    assert lease.expires_at is not None
    left = lease.expires_at.timestamp() - time.time()
    return left > ttl - (time.monotonic() - since) + 0.1


def _replicated(primary: RedisServer, key: str) -> None:
    """Once a write made now has reached a replica: so has every earlier one (one
    ordered replication stream), the renewals included. `key` is a lock key the
    primary serves; the marker shares its hash tag, so in a cluster its slot too."""
    admin = primary.admin()
    try:
        admin.set(f"{key}:replicated", 1)
        assert admin.wait(1, 5000) >= 1, "no replica acknowledged"
    finally:
        admin.close()


# The fleet: three scheduler replicas, ten one-second jobs and a 3 s job every 4 s.
JOBS = 10
TICKS_BEFORE = 4
TICKS_AFTER = 8
RECOVERED_AFTER = 2.0  # seconds after the promotion from which every tick must run


def test_a_fleet_rides_a_killed_primary(failover: Failover, tmp_path: Path) -> None:
    """No tick runs twice and no job's fencing token goes backwards across the
    failover; every tick from shortly after the promotion runs exactly once."""
    prefix = f"fleet-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "runs.log"
    logs = [tmp_path / f"replica-{i}.stderr" for i in range(3)]
    jobs = [f"{prefix}-{i}" for i in range(JOBS)]
    procs = [_start(failover.url, prefix, record, f"r{i}", logs[i]) for i in range(3)]
    try:
        for i, proc in enumerate(procs):
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            proc.stdout.close()
            assert line == "ready", f"replica r{i} did not start: {line!r} {logs[i].read_text()}"
        first = math.ceil(time.time() + 1.0)
        # Kill when the long job (every 4 s, 3 s long) has run for a second: its lease
        # is held across the failover.
        kill_at = 4 * math.ceil((first + TICKS_BEFORE) / 4) + 1.0
        _sleep_until(kill_at)
        victim = failover.primary_for(lock_key(f"{prefix}-long"))
        on_victim = [job for job in jobs if failover.primary_for(lock_key(job)) is victim]
        killed = time.time()
        victim.stop()
        failover.promoted(victim, lock_key(f"{prefix}-long"))
        promoted = time.time()
        last = math.ceil(promoted + RECOVERED_AFTER) + TICKS_AFTER
        _sleep_until(last + 1.5)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=20) for proc in procs]
    assert codes == [0, 0, 0], [log.read_text()[-2000:] for log in logs]

    runs, lost, missed = _read(record)
    twice = {key: n for key, n in _count(runs).items() if n > 1}
    assert not twice, f"ticks run more than once, killed at {killed:.3f}: " + ", ".join(
        f"{job}@{fire}: {[(r[4], r[2], r[3] - fire) for r in runs if r[:2] == (job, fire)]}"
        for job, fire in sorted(twice)[:3]
    )
    for job, tokens in _tokens_by_tick(runs).items():
        increasing = all(a < b for a, b in itertools.pairwise(tokens))
        assert increasing, f"{job}: fencing tokens not increasing tick by tick: {tokens}"
    recovered = math.ceil(promoted + RECOVERED_AFTER)
    must_run = {(job, t * 1000) for job in jobs for t in range(first, math.floor(killed))}
    must_run |= {(job, t * 1000) for job in jobs for t in range(recovered, last)}
    not_run = sorted(must_run - set(_count(runs)))
    assert not not_run, f"{len(not_run)} ticks never ran, e.g. {not_run[:5]}"

    resumed = min(
        (start for job, fire, _, start, _ in runs if job in on_victim and fire / 1000 > killed),
        default=math.nan,
    )
    longs = {f"{prefix}-long"}
    long_runs = [(fire, start) for job, fire, _, start, _ in runs if job == f"{prefix}-long"]
    held_at_kill = [fire for fire, _ in long_runs if fire / 1000 < killed < fire / 1000 + 3]
    report(
        f"fleet, {failover.url.split(':', 1)[0]}",
        promotion=promoted - killed,
        first_run_after_kill=resumed / 1000 - killed,
        ticks_missed=len({key for key in missed if key[0] in jobs}),
        jobs_on_the_killed_primary=len(on_victim),
        long_job_held_at_kill=bool(held_at_kill),
        long_job_lost_after=[round(at / 1000 - killed, 2) for job, _, at in lost if job in longs],
        ticks_twice=len(twice),
    )


def _start(url: str, prefix: str, record: Path, name: str, log: Path) -> subprocess.Popen[str]:
    with log.open("w") as err:  # a file, not a pipe nobody drains
        return subprocess.Popen(
            [sys.executable, str(REPLICA), url, prefix, str(JOBS), str(record), name],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.5))


Run = tuple[str, int, int, int, str]  # job, fire (ms), fencing token, start (wall ms), replica


def _read(record: Path) -> tuple[list[Run], list[tuple[str, int, int]], set[tuple[str, int]]]:
    """The runs, the lost leases (job, fire ms, when ms) and the missed ticks (job,
    fire ms) of the fleet's record."""
    runs: list[Run] = []
    lost: list[tuple[str, int, int]] = []
    missed: set[tuple[str, int]] = set()
    for line in record.read_text().splitlines():
        kind, job, fire, replica, *rest = line.split()
        if kind == "run":
            runs.append((job, int(fire), int(rest[0]), int(rest[1]), replica))
        elif kind == "lost":
            lost.append((job, int(fire), int(rest[0])))
        else:
            missed.add((job, int(fire)))
    return runs, lost, missed


def _count(runs: list[Run]) -> dict[tuple[str, int], int]:
    counted: dict[tuple[str, int], int] = defaultdict(int)
    for job, fire, *_ in runs:
        counted[(job, fire)] += 1
    return counted


def _tokens_by_tick(runs: list[Run]) -> dict[str, list[int]]:
    """Each job's fencing tokens, in the order of its ticks."""
    tokens: dict[str, list[int]] = defaultdict(list)
    for job, _, token, *_ in sorted(runs, key=lambda run: run[1]):
        tokens[job].append(token)
    return tokens
