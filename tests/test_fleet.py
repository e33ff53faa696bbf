"""The fleet test: three replica processes with skewed clocks, every backend.

3 replicas (clock offsets -300 ms, 0, +300 ms from true time, within the
schedulers' 350 ms skew_tolerance), 20 jobs every second with
~1 ms bodies, for 20+ ticks: every (job, tick) must run exactly once, as
recorded by the runs themselves. A second variant SIGKILLs one replica
mid-way: still no duplicates, and the survivors run every later tick. The first
variant also runs what unit tests cannot fake (``extras`` of fleet_replica.py): a
body of 1.3 s, longer than the hold and the interval, whose runs must never overlap;
a job ticking at .437 of each second, exactly once per tick; and a job held by an
outside locker (this process) while its batch-mates are free, which runs no tick
until the name is let go, then every tick once.

The tick claims variants (issue 20) run on the backends that claim ticks, with clocks
-0.45 I, 0 and +0.45 I off true time (I the interval: 1 s and 2 s), far past the 250 ms
skew tolerance, and the middle replica's clock jumping 2 I forward mid-run, then back:
every (job, tick) once. The control runs the same fleet on a backend without claims
(etcd), where ticks run twice, as documented.

The burst variants run 60 jobs due on each whole second, more than the scheduler
prepares ahead from (claimed and locked before the instant, bodies started at it): on
the claim path and on the hold path, every (job, tick) once. Every fleet of three
replicas checks that no body started before its tick by its own replica's clock.

The selected fleets run side by side, ``FLEETS_AT_ONCE`` at a time (the ``fleets``
fixture), each test then waits for its own: the fleets spend their ticks of real time
mostly waiting.
"""

from __future__ import annotations

import errno
import itertools
import math
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

import pytest

import multilock
import multilock._scheduling.scheduler as scheduling
from multilock._locks.registry import backend_for
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
SPAWN_ATTEMPTS = 3  # starts of a replica whose exec the host fails with EFAULT
# Fleets started side by side at most: 17 at once (51 processes, 60 runs a second each)
# stalled a 2-core host past the 0.25 s grace and every fleet missed the same tick.
FLEETS_AT_ONCE = 6
# A ZooKeeper lease ends with its session: a short one, so that a killed replica's
# leases go within seconds (4 s is the server's usual minimum, 2 x tickTime).
ZOOKEEPER_SESSION = "session_timeout=4s"
# The TTL of a NATS bucket the fleet creates: a killed replica's keys go that long after
# their last renewal. (A bucket that exists keeps its own; the recovery bound asks it.)
NATS_BUCKET_TTL = "bucket_ttl=2s"
HELD_TICKS = 6  # the outside locker holds PREFIX-held until mid-way after this many ticks
OFF_GRID_MS = 437  # PREFIX-offset's ticks, in ms after each whole second


class Fleet:
    """Three replica processes and their run records."""

    def __init__(
        self,
        url: str,
        workdir: Path,
        coordination: str,
        offsets: tuple[float, ...] = OFFSETS,
        timing: tuple[float, ...] = (SKEW_TOLERANCE, MISFIRE_GRACE, LEASE_TTL, LEADER_POLL),
        extras: bool = False,
        options: tuple[tuple[str, ...], ...] = (),
        jobs: int = JOBS,
    ) -> None:
        self.url = url
        self.jobs = jobs
        self.options = options  # per replica: fleet_replica.py's key=value arguments
        self.extras = extras
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
            argv = [self.url, self.prefix, str(self.jobs), str(offset), str(self.records[i])]
            argv += [f"r{i}", self.coordination, *(str(value) for value in timing)]
            argv += ["extras"] if self.extras else []
            argv += self.options[i] if i < len(self.options) else ()
            with self.logs[i].open("w") as log:  # a file, not a pipe nobody drains
                self.procs.append(_spawn([sys.executable, str(HELPER), *argv], log))
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

    def recorded(self) -> Iterator[tuple[str, int, str, int, int]]:
        """Every run the replicas recorded: (job, fire ms, replica, start ms, end ms)."""
        for record in self.records:
            yield from _read_record(record)

    def runs(self) -> Counter[tuple[str, int]]:
        return Counter((job, fire_ms) for job, fire_ms, *_ in self.recorded())

    def bodies(self, job: str) -> list[tuple[int, int, int, str]]:
        """The runs of ``job``: (start ms, end ms, fire ms, replica), by start."""
        return sorted(
            (start, end, fire_ms, replica)
            for name, fire_ms, replica, start, end in self.recorded()
            if name == job
        )

    def missed(self, keys: list[tuple[str, int]]) -> list[str]:
        """What the replicas said of these (job, tick in ms): their ``missed`` lines."""
        wanted = {f"{job} {tick}" for job, tick in keys}
        said = []
        for i in range(len(self.logs)):
            if self.logs[i].exists():
                for line in self.logs[i].read_text().splitlines():
                    parts = line.split(" ", 3)
                    if parts[0] == "missed" and " ".join(parts[1:3]) in wanted:
                        said.append(f"r{i}: {line}")
        return said

    def ticks_by_replica(self) -> list[list[int]]:
        """The fire times (ms) each replica ran, from its record."""
        return [[fire_ms for _, fire_ms, *_ in _read_record(record)] for record in self.records]

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
        jobs = range(self.jobs)
        return {(f"{self.prefix}-{j}", t * 1000) for j in jobs for t in range(first, last)}

    def early(self) -> list[tuple[str, int, str, int]]:
        """The runs whose body started before their fire time by their replica's own
        clock (its offset off the host's): (job, fire ms, replica, start ms by it)."""
        offsets = {f"r{i}": round(offset * 1000) for i, offset in enumerate(self.offsets)}
        return [
            (job, fire_ms, replica, start + offsets[replica])
            for job, fire_ms, replica, start, _ in self.recorded()
            if start + offsets[replica] < fire_ms - 1  # both rounded to the ms
        ]


def _read_record(record: Path) -> Iterator[tuple[str, int, str, int, int]]:
    """One replica's record (none yet: no runs): (job, fire ms, replica, start ms, end ms)."""
    if record.exists():
        for line in record.read_text().splitlines():
            job, fire_ms, replica, start, end = line.split(" ")
            yield job, int(fire_ms), replica, int(start), int(end)


def _spawn(argv: list[str], log: IO[str]) -> subprocess.Popen[str]:
    """Start a replica; try again, a few times, when the host fails the exec itself.

    A CI host once failed ``execve`` of the venv's own interpreter with EFAULT (Bad
    address), a path that had started hundreds of replicas before: the replica never
    ran, so the fleet had judged nothing of the scheduler. Any other error is raised.
    """
    attempts = 0
    while True:
        attempts += 1
        try:
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        except OSError as exc:
            if exc.errno != errno.EFAULT or attempts == SPAWN_ATTEMPTS:
                raise


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
    url: str,
    workdir: Path,
    ticks: int,
    kill_after: int | None,
    coordination: str = "lock",
    extras: bool = False,
    jobs: int = JOBS,
    options: tuple[str, ...] = (),
) -> None:
    fleet = Fleet(url, workdir, coordination, extras=extras, jobs=jobs, options=(options,) * 3)
    outsider = None
    if extras:  # the name is held before any replica starts
        outsider = multilock.connect(url)
        held = outsider.try_acquire(f"{fleet.prefix}-held", ttl=60)
        assert held is not None, "the outside locker could not take PREFIX-held"
    fleet.start()
    victim = None
    try:
        first = math.ceil(time.time() + 1.5)  # every replica is scheduling by then
        last = first + ticks
        killed_at = None
        if outsider is not None:
            _sleep_until(first + HELD_TICKS + 0.5)  # mid-way between two ticks
            outsider.close()  # lets the name go
        if kill_after is not None:
            _sleep_until(first + kill_after + 0.45)  # mid-way between ticks
            victim = fleet.latest_runner() if coordination == "leader" else 1
            fleet.procs[victim].send_signal(signal.SIGKILL)
            killed_at = time.time()
        _sleep_until(last + 1.5)  # the last tick's latest replica has fired
    finally:
        codes = fleet.stop()
        if outsider is not None:
            outsider.close()
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
    if extras:
        must_run |= _check_extras(fleet, first, last)
    missing = sorted(must_run - set(runs))
    assert not missing, (
        f"{len(missing)} of {len(must_run)} (job, tick) never ran: {missing[:10]};"
        f" the replicas said: {fleet.missed(missing[:10])[:10]}"
    )
    early = fleet.early()
    assert not early, f"{len(early)} bodies started before their tick: {early[:10]}"


def _check_extras(fleet: Fleet, first: int, last: int) -> set[tuple[str, int]]:
    """Check the extra jobs' runs; return the (job, tick) that must have run."""
    released = first + HELD_TICKS + 1  # the first tick after the outside locker let go
    early = [b for b in fleet.bodies(f"{fleet.prefix}-held") if b[2] < released * 1000]
    assert not early, f"PREFIX-held ran while an outside locker held it: {early}"
    long = fleet.bodies(f"{fleet.prefix}-long")
    # A run holds its lock until it returns, past its hold: the next starts after it ends.
    overlaps = [(a, b) for a, b in itertools.pairwise(long) if b[0] < a[1]]
    assert not overlaps, f"two runs of PREFIX-long overlap: {overlaps}"
    in_window = [b for b in long if first * 1000 <= b[2] < last * 1000]
    # Each run outlives the next tick (skipped), so at best every other tick runs.
    assert len(in_window) >= (last - first) // 2 - 1, f"PREFIX-long ran too little: {long}"
    offset = {(f"{fleet.prefix}-offset", t * 1000 + OFF_GRID_MS) for t in range(first, last)}
    held = {(f"{fleet.prefix}-held", t * 1000) for t in range(released, last)}
    return offset | held


# --- tick claims ----------------------------------------------------------------------

CLAIM_BACKENDS = ("file", "postgres", "redis", "zookeeper")
CLAIM_TIMING = (0.25, 0.25, LEASE_TTL, LEADER_POLL)  # the default skew tolerance and grace
CLAIM_INTERVALS = 12  # ticks in the window
JUMP_AT, JUMP_BACK = 3.5, 7.5  # in intervals after the first tick, mid-way between ticks


def _claims(url: str, workdir: Path, interval: int, claims: bool = True) -> None:
    """Offsets of 0.45 I, the middle clock 2 I ahead for a while: each tick once (or,
    without claims, the documented duplicates)."""
    jump = f"jump={2 * interval}"  # the middle replica's, on SIGUSR1 (back on SIGUSR2)
    common = (f"interval={interval}",) + (() if claims else ("claims=0",))
    fleet = Fleet(
        url,
        workdir,
        "lock",
        offsets=(-0.45 * interval, 0.0, 0.45 * interval),
        timing=CLAIM_TIMING,
        options=(common, (*common, jump), common),
    )
    fleet.start()
    try:
        first = math.ceil((time.time() + 1.5) / interval) * interval  # all are scheduling
        last = first + CLAIM_INTERVALS * interval
        _sleep_until(first + JUMP_AT * interval)
        fleet.procs[1].send_signal(signal.SIGUSR1)
        _sleep_until(first + JUMP_BACK * interval)
        fleet.procs[1].send_signal(signal.SIGUSR2)
        _sleep_until(last + interval)  # the last tick's latest replica has fired
    finally:
        codes = fleet.stop()
    assert codes == [0, 0, 0], [fleet.stderr(i) for i in range(3)]
    runs = fleet.runs()
    must_run = {
        (f"{fleet.prefix}-{j}", t * 1000) for j in range(JOBS) for t in range(first, last, interval)
    }
    duplicates = {key: n for key, n in runs.items() if n > 1 and key in must_run}
    if not claims:
        # The hold path cannot cover clocks 0.9 I apart: most ticks run twice.
        assert len(duplicates) >= len(must_run) // 2, f"only {len(duplicates)} duplicates"
        return
    sample = sorted(duplicates.items())[:10]
    assert not duplicates, f"{len(duplicates)} (job, tick) ran more than once, e.g. {sample}"
    missing = sorted(must_run - set(runs))
    assert not missing, (
        f"{len(missing)} of {len(must_run)} (job, tick) never ran: {missing[:10]};"
        f" ticks {sorted({t / 1000 - first for _, t in missing})} of the window;"
        f" the replicas said: {fleet.missed(missing[:10])[:10]}; each ran ticks"
        f" {[sorted({t / 1000 - first for t in ran}) for ran in fleet.ticks_by_replica()]}"
    )


BACKENDS = ("file", "postgres", "redis", "zookeeper", "mysql", "etcd", "nats")
# Bursts: more jobs due at one instant than the scheduler prepares ahead from, so every
# tick's locks are taken before it and the bodies started at it, across processes.
BURST_JOBS = scheduling._BURST + 10
BURST_TICKS = 10
# Leader mode on the session-bound backends only: the per-job lock variants already
# cover every backend's leases.
LEADER_BACKENDS = ("file", "postgres", "mysql")


def _exactly_once(url: str, workdir: Path) -> None:
    _run_fleet(url, workdir, TICKS, kill_after=None, extras=True)


def _killed(url: str, workdir: Path) -> None:
    ticks = KILL_AFTER + math.ceil(_recovery(url)) + TICKS_AFTER_RECOVERY
    _run_fleet(url, workdir, ticks, kill_after=KILL_AFTER)


def _burst(url: str, workdir: Path, claims: bool) -> None:
    options = () if claims else ("claims=0",)
    _run_fleet(url, workdir, BURST_TICKS, kill_after=None, jobs=BURST_JOBS, options=options)


def _leader(url: str, workdir: Path) -> None:
    ticks = KILL_AFTER + math.ceil(_recovery(url)) + TICKS_AFTER_RECOVERY
    _run_fleet(url, workdir, ticks, kill_after=KILL_AFTER, coordination="leader")


SCENARIOS: dict[str, Callable[[str, Path], None]] = {
    "test_fleet_runs_each_tick_exactly_once": _exactly_once,
    "test_fleet_survives_a_killed_replica": _killed,
    "test_fleet_in_leader_mode_fails_over": _leader,
    "test_fleet_claims_each_1s_tick_once_whatever_the_clocks": lambda u, w: _claims(u, w, 1),
    "test_fleet_claims_each_2s_tick_once_whatever_the_clocks": lambda u, w: _claims(u, w, 2),
    "test_fleet_without_claims_runs_ticks_twice": lambda u, w: _claims(u, w, 2, claims=False),
    "test_fleet_prepares_each_burst_ahead_and_runs_each_tick_once": (
        lambda u, w: _burst(u, w, claims=True)
    ),
    "test_fleet_prepares_each_burst_ahead_on_the_hold_path": lambda u, w: _burst(u, w, False),
}


class Fleets:
    """The outcome of each (test, backend) fleet, all started together."""

    def __init__(self, outcomes: dict[tuple[str, str], Future[None]]) -> None:
        self._outcomes = outcomes

    def check(self, request: pytest.FixtureRequest, backend: str) -> None:
        """Wait for this test's fleet on ``backend``; raise what it raised (a failed
        assertion, or the skip or failure of an unreachable server)."""
        self._outcomes[(request.node.originalname, backend)].result()


@pytest.fixture(scope="module")
def fleets(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleets]:
    """Every fleet this session's selected tests ask for, run in threads, a few at once.

    A fleet spends its 20-odd ticks of real time mostly waiting, three light
    processes each, so a few side by side take as long as the longest alone; all of
    them at once load a small host past the schedulers' grace.
    """
    wanted = [
        (item.originalname, str(item.callspec.params["backend"]))
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is sys.modules[__name__]
        and item.originalname in SCENARIOS
    ]
    outcomes: dict[tuple[str, str], Future[None]] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(FLEETS_AT_ONCE, len(wanted)))) as pool:
        for test, backend in wanted:
            try:  # the URL fixtures skip (or, when all servers are required, fail) here
                url: str = request.getfixturevalue(f"{backend}_url")
            except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                outcomes[(test, backend)] = _settled(exc)
                continue
            if backend == "zookeeper":
                url += ("&" if "?" in url else "?") + ZOOKEEPER_SESSION
            if backend == "nats":
                url += ("&" if "?" in url else "?") + NATS_BUCKET_TTL
            workdir = tmp_path_factory.mktemp(f"{test[10:]}-{backend}")
            outcomes[(test, backend)] = pool.submit(SCENARIOS[test], url, workdir)
        yield Fleets(outcomes)


def _settled(exc: BaseException) -> Future[None]:
    future: Future[None] = Future()
    future.set_exception(exc)
    return future


@pytest.mark.parametrize("backend", BACKENDS)
def test_fleet_runs_each_tick_exactly_once(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """3 skewed replicas, 20 jobs, 22 ticks: zero duplicates, zero misses."""
    fleets.check(request, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fleet_survives_a_killed_replica(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """SIGKILL one replica mid-way: no duplicates, and the others keep every later tick."""
    fleets.check(request, backend)


@pytest.mark.parametrize("backend", LEADER_BACKENDS)
def test_fleet_in_leader_mode_fails_over(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """Leader mode, same fleet: only the leader runs; SIGKILL it and another takes over."""
    fleets.check(request, backend)


@pytest.mark.parametrize("backend", CLAIM_BACKENDS)
def test_fleet_claims_each_1s_tick_once_whatever_the_clocks(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """Clocks -450 ms, 0, +450 ms, one jumping 2 s ahead and back, 1 s ticks: each once."""
    fleets.check(request, backend)


@pytest.mark.parametrize("backend", CLAIM_BACKENDS)
def test_fleet_claims_each_2s_tick_once_whatever_the_clocks(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """Clocks -0.9 s, 0, +0.9 s, one jumping 4 s ahead and back, 2 s ticks: each once."""
    fleets.check(request, backend)


@pytest.mark.parametrize("backend", ["etcd"])
def test_fleet_without_claims_runs_ticks_twice(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """The same fleet on a backend without claims (it holds): the documented duplicates."""
    fleets.check(request, backend)


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_fleet_prepares_each_burst_ahead_and_runs_each_tick_once(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """60 jobs due on each whole second, claimed and locked ahead by three skewed
    replicas: every (job, tick) once, no body before its tick by its replica's clock."""
    fleets.check(request, backend)


@pytest.mark.parametrize("backend", ["postgres"])
def test_fleet_prepares_each_burst_ahead_on_the_hold_path(
    backend: str, fleets: Fleets, request: pytest.FixtureRequest
) -> None:
    """The same burst fleet holding its locks (no tick claims): every tick once."""
    fleets.check(request, backend)
