"""The fleet test: three replica processes with skewed clocks, every backend.

3 replicas (clock offsets -300 ms, 0, +300 ms from true time, within the
schedulers' 350 ms skew_tolerance), 20 jobs every second with
~1 ms bodies, for 20+ ticks: every (job, tick) must run exactly once, as
recorded by the runs themselves. A second variant SIGKILLs one replica
mid-way: still no duplicates, and the survivors run every later tick.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from multilock._registry import backend_for
from multilock.backend import LockURL

pytestmark = pytest.mark.slow

HELPER = Path(__file__).with_name("fleet_replica.py")
OFFSETS = (-0.3, 0.0, 0.3)
JOBS = 20
TICKS = 22
SKEW_TOLERANCE = 0.35  # every clock within 350 ms of true time: 50 ms to spare each
MISFIRE_GRACE = 0.25  # the hold, 2 x 0.35 + 0.25 = 0.95 s, stays below the 1 s interval
HOLD = 2 * SKEW_TOLERANCE + MISFIRE_GRACE  # how long a tick's winner keeps its lease
LEASE_TTL = 1.0  # on TTL backends, a killed replica's leases end soon after their hold
LEADER_POLL = 0.25  # leader mode: how often followers try to take the lead
KILL_AFTER = 5  # ticks into the window
TICKS_AFTER_RECOVERY = 5
READY_TIMEOUT = 30.0
# A ZooKeeper lease ends with its session: a short one, so that a killed replica's
# leases go within seconds (4 s is the server's usual minimum, 2 x tickTime).
ZOOKEEPER_SESSION = "session_timeout=4s"


class Fleet:
    """Three replica processes and their run records."""

    def __init__(
        self,
        url: str,
        workdir: Path,
        coordination: str,
        offsets: tuple[float, ...] = OFFSETS,
        timing: tuple[float, ...] = (SKEW_TOLERANCE, MISFIRE_GRACE, LEASE_TTL, LEADER_POLL),
    ) -> None:
        self.url = url
        self.coordination = coordination
        self.offsets = offsets
        self.timing = timing  # skew_tolerance, misfire_grace, lease_ttl, leader_poll
        self.prefix = f"fleet-{uuid.uuid4().hex[:8]}"
        self.records = [workdir / f"replica-{i}.log" for i in range(len(offsets))]
        self.logs = [workdir / f"replica-{i}.stderr" for i in range(len(offsets))]
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        for i, offset in enumerate(self.offsets):
            timing = self.timing
            argv = [self.url, self.prefix, str(JOBS), str(offset), str(self.records[i]), f"r{i}"]
            argv += [self.coordination, *(str(value) for value in timing)]
            with self.logs[i].open("w") as log:  # a file, not a pipe nobody drains
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(HELPER), *argv],
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                    )
                )
        deadline = time.monotonic() + READY_TIMEOUT
        for i, proc in enumerate(self.procs):
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            proc.stdout.close()
            if line != "ready" or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"a replica did not start: {line!r} {self.stderr(i)}")

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=15))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes

    def stderr(self, i: int) -> str:
        """The tail of replica ``i``'s log."""
        return self.logs[i].read_text()[-3000:] if self.logs[i].exists() else ""

    def runs(self) -> Counter[tuple[str, int]]:
        counted: Counter[tuple[str, int]] = Counter()
        for record in self.records:
            if not record.exists():
                continue
            for line in record.read_text().splitlines():
                job, fire_ms, _ = line.split(" ")
                counted[(job, int(fire_ms))] += 1
        return counted

    def ticks_by_replica(self) -> list[list[int]]:
        """The fire times (ms) each replica ran, from its record."""
        return [
            [int(line.split(" ")[1]) for line in record.read_text().splitlines()]
            if record.exists()
            else []
            for record in self.records
        ]

    def latest_runner(self) -> int:
        """The replica that ran the latest tick so far (in leader mode: the leader)."""
        ran = self.ticks_by_replica()
        return max(range(len(ran)), key=lambda i: max(ran[i], default=-1))

    def runners(self, first: int, last: int) -> set[int]:
        """The replicas that ran a tick in [first, last) (seconds)."""
        ran = self.ticks_by_replica()
        return {
            i for i, ticks in enumerate(ran) if any(first * 1000 <= t < last * 1000 for t in ticks)
        }

    def expected(self, first: int, last: int) -> set[tuple[str, int]]:
        """Every (job, tick in ms) with first <= tick (s) < last."""
        return {(f"{self.prefix}-{j}", t * 1000) for j in range(JOBS) for t in range(first, last)}


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _recovery(url: str) -> float:
    """Seconds after a SIGKILL by which the killed replica's leases are surely gone:
    the backend's own bound (its conformance hook), after the longest hold."""
    parsed = LockURL.parse(url)
    hooks = backend_for(parsed.scheme).conformance
    assert hooks is not None, f"{parsed.scheme}:// ships no conformance hooks"
    longest_ttl = HOLD + LEASE_TTL  # a lease's ttl: the hold, then the margin
    # Leader mode adds the followers' poll, and a new leader skips the ticks within
    # 2 x skew_tolerance of taking over.
    return hooks.crash_release_bound(parsed, longest_ttl) + HOLD + LEADER_POLL + 1.0


def _run_fleet(
    url: str, workdir: Path, ticks: int, kill_after: int | None, coordination: str = "lock"
) -> None:
    fleet = Fleet(url, workdir, coordination)
    fleet.start()
    victim = None
    try:
        first = math.ceil(time.time() + 1.5)  # every replica is scheduling by then
        last = first + ticks
        killed_at = None
        if kill_after is not None:
            _sleep_until(first + kill_after + 0.45)  # mid-way between ticks
            victim = fleet.latest_runner() if coordination == "leader" else 1
            fleet.procs[victim].send_signal(signal.SIGKILL)
            killed_at = time.time()
        _sleep_until(last + 1.5)  # the last tick's latest replica has fired
    finally:
        codes = fleet.stop()
    survivors = [c for i, c in enumerate(codes) if i != victim]
    assert survivors == [0] * len(survivors), [fleet.stderr(i) for i in range(3)]

    runs = fleet.runs()
    duplicates = {key: n for key, n in runs.items() if n > 1}
    sample = sorted(duplicates.items())[:10]
    assert not duplicates, f"{len(duplicates)} (job, tick) ran more than once, e.g. {sample}"
    if killed_at is None:
        must_run = fleet.expected(first, last)
    else:
        # A tick whose body the kill interrupted may be lost (at most once on a crash).
        recovered = math.ceil(killed_at + _recovery(url))
        must_run = fleet.expected(first, math.floor(killed_at)) | fleet.expected(recovered, last)
    if coordination == "leader" and killed_at is not None:
        before = fleet.runners(first, math.floor(killed_at))
        after = fleet.runners(math.ceil(killed_at + _recovery(url)), last)
        assert before == {victim}, f"only the leader r{victim} should run, not {before}"
        assert len(after) == 1, f"one new leader should run the jobs, not {after}"
        assert victim not in after
    missing = sorted(must_run - set(runs))
    assert not missing, f"{len(missing)} of {len(must_run)} (job, tick) never ran: {missing[:10]}"


@pytest.fixture(params=["file", "postgres", "redis", "zookeeper"])
def fleet_url(request: pytest.FixtureRequest) -> str:
    """The lock URL of each backend, through the root conftest's fixtures."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    if request.param == "zookeeper":
        url += ("&" if "?" in url else "?") + ZOOKEEPER_SESSION
    return url


def test_fleet_runs_each_tick_exactly_once(fleet_url: str, tmp_path: Path) -> None:
    """3 skewed replicas, 20 jobs, 22 ticks: zero duplicates, zero misses."""
    _run_fleet(fleet_url, tmp_path, TICKS, kill_after=None)


def test_fleet_survives_a_killed_replica(fleet_url: str, tmp_path: Path) -> None:
    """SIGKILL one replica mid-way: no duplicates, and the others keep every later tick."""
    ticks = KILL_AFTER + math.ceil(_recovery(fleet_url)) + TICKS_AFTER_RECOVERY
    _run_fleet(fleet_url, tmp_path, ticks, kill_after=KILL_AFTER)


@pytest.mark.parametrize("server", ["file", "postgres"])
def test_fleet_in_leader_mode_fails_over(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Leader mode, same fleet: only the leader runs; SIGKILL it and another takes over.

    Run on the session-bound backends only, to keep CI time down: the per-job lock
    variants above already cover every backend's leases.
    """
    url: str = request.getfixturevalue(f"{server}_url")
    ticks = KILL_AFTER + math.ceil(_recovery(url)) + TICKS_AFTER_RECOVERY
    _run_fleet(url, tmp_path, ticks, kill_after=KILL_AFTER, coordination="leader")
