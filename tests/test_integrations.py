"""The integrations with other schedulers, each run as the real library in several
processes whose clocks disagree (libfaketime: the conftest's ``faketime``), with the
fleet test's record check: every (job, tick) ran exactly once, none missed.

APScheduler 3: three ``BackgroundScheduler`` processes on
``LockedThreadPoolExecutor``. Celery beat: three ``celery beat`` processes on
``multilock.integrations.celery.Scheduler`` and one worker running what they send.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from multilock.testing import poll

HERE = Path(__file__).parent
FakeTime = Callable[[float], dict[str, str]]  # the conftest's faketime: offset -> environment
OFFSETS = (-0.3, 0.0, 0.3)  # each replica's clock from true time
SKEW_TOLERANCE = 0.35
EVERY = 3  # seconds between ticks
HOLD = 2.2  # + 2 x the tolerance within the interval; a tick may start 1.5 s late
TICKS = 6
READY_TIMEOUT = 60.0


class Replicas:
    """Processes started with skewed clocks, each printing ``ready`` once scheduling."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[Path] = []

    def start(self, argv: list[str], env: dict[str, str], ready: str | None = "ready") -> None:
        log = self.workdir / f"process-{len(self.procs)}.stderr"
        self.logs.append(log)
        with log.open("w") as stderr:  # a file, not a pipe nobody drains
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE if ready else subprocess.DEVNULL,
                stderr=stderr,
                text=True,
                env={**os.environ, **env},
                cwd=HERE,
            )
        self.procs.append(proc)
        if ready is not None:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            proc.stdout.close()
            if line != ready:
                self.stop()
                pytest.fail(f"{argv[:4]} did not start: {line!r} {self.tail(len(self.procs) - 1)}")

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=20))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes

    def tail(self, i: int) -> str:
        return self.logs[i].read_text()[-3000:] if self.logs[i].exists() else ""


def check_records(records: Iterable[str], expected: set[tuple[str, int]], logs: str = "") -> None:
    """Lines ``<job> <fire ms> <replica>``: within the expected window, every (job, tick)
    exactly once."""
    runs = Counter((job, int(fire)) for job, fire, _ in (line.split() for line in records))
    window = {key: n for key, n in runs.items() if key in expected}
    duplicated = sorted(key for key, n in window.items() if n > 1)
    missed = sorted(expected - set(window))
    assert not duplicated, f"{len(duplicated)} ran more than once: {duplicated[:10]} {logs}"
    assert not missed, f"{len(missed)} of {len(expected)} never ran: {missed[:10]} {logs}"


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.5))


# --- APScheduler 3 ------------------------------------------------------------------------

APSCHEDULER_JOBS = 5


def _apscheduler_fleet(url: str, tmp_path: Path, faketime: FakeTime) -> None:
    pytest.importorskip("apscheduler")
    prefix, record = f"aps-{uuid.uuid4().hex[:8]}", tmp_path / "runs"
    replicas = Replicas(tmp_path)
    try:
        for i, offset in enumerate(OFFSETS):
            argv = [sys.executable, str(HERE / "apscheduler_replica.py"), url, prefix]
            argv += [str(APSCHEDULER_JOBS), str(EVERY), str(HOLD), str(SKEW_TOLERANCE)]
            replicas.start([*argv, str(record), f"r{i}"], faketime(offset))
        first = math.ceil((time.time() + 1.5) / EVERY) * EVERY  # every replica schedules
        last = first + TICKS * EVERY
        _sleep_until(last + 2)  # the last tick's latest replica has fired
    finally:
        codes = replicas.stop()
    assert codes == [0, 0, 0], [replicas.tail(i) for i in range(3)]
    expected = {
        (f"{prefix}-{j}", tick * 1000)
        for j in range(APSCHEDULER_JOBS)
        for tick in range(first, last, EVERY)
    }
    logs = "\n".join(replicas.tail(i) for i in range(3))
    check_records(record.read_text().splitlines(), expected, logs)


# --- Celery beat ---------------------------------------------------------------------------

CELERY_ENTRIES = 4
CELERY_START = 12.0  # seconds for three beats and a worker to start on a loaded machine
DRAIN_TIMEOUT = 30.0


def _celery_fleet(url: str, redis_url: str, tmp_path: Path, faketime: FakeTime) -> None:
    pytest.importorskip("celery")
    prefix, record = f"beat-{uuid.uuid4().hex[:8]}", tmp_path / "runs"
    env = {
        "CELERY_TEST_BROKER": redis_url,
        "CELERY_TEST_PREFIX": prefix,
        "CELERY_TEST_ENTRIES": str(CELERY_ENTRIES),
        "CELERY_TEST_EVERY": str(EVERY),
        "CELERY_TEST_HOLD": str(HOLD),
        "CELERY_TEST_SKEW": str(SKEW_TOLERANCE),
        "CELERY_TEST_RECORD": str(record),
        "MULTILOCK_LOCK_URL": url,
    }
    celery = [sys.executable, "-m", "celery", "-A", "celery_app"]
    replicas = Replicas(tmp_path)
    first = math.ceil((time.time() + CELERY_START) / EVERY) * EVERY
    last = first + TICKS * EVERY
    expected = {
        (f"{prefix}-{j}", tick * 1000)
        for j in range(CELERY_ENTRIES)
        for tick in range(first, last, EVERY)
    }
    try:
        worker = [*celery, "worker", "--pool", "solo", "--loglevel", "WARNING", "-Q", prefix]
        replicas.start([*worker, "--without-heartbeat", "--without-gossip", "--without-mingle"],
                       env, ready=None)  # fmt: skip
        for i, offset in enumerate(OFFSETS):
            schedule = tmp_path / f"beat-{i}.schedule"
            beat = [*celery, "beat", "-S", "multilock.integrations.celery:Scheduler"]
            replicas.start([*beat, "-s", str(schedule), "--loglevel", "WARNING"],
                           {**env, **faketime(offset)}, ready=None)  # fmt: skip
        _sleep_until(last + 2)  # the last tick's latest beat has sent it

        def drained() -> bool:
            lines = record.read_text().splitlines() if record.exists() else []
            ran = {(job, int(fire)) for job, fire, _ in (line.split() for line in lines)}
            return expected <= ran

        poll("the worker ran every tick sent", drained, DRAIN_TIMEOUT, every=0.2)
    except AssertionError:
        pass  # the record check below says what is missing
    finally:
        codes = replicas.stop()
    logs = "\n".join(replicas.tail(i) for i in range(len(replicas.procs)))
    assert codes == [0] * 4, logs
    lines = record.read_text().splitlines() if record.exists() else []
    check_records(lines, expected, logs)


FLEETS_AT_ONCE = 2  # all four at once: eight celery processes starting on two cores


@pytest.fixture(scope="module")
def fleets(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, faketime: FakeTime
) -> Iterator[dict[tuple[str, str], Future[None]]]:
    """The four multi-process runs (APScheduler and Celery beat, on PostgreSQL and
    Redis), two at a time: each mostly waits for its ticks."""
    runs: dict[tuple[str, str], Future[None]] = {}
    with ThreadPoolExecutor(FLEETS_AT_ONCE) as pool:
        for backend in ("postgres", "redis"):
            for kind in ("apscheduler", "celery"):
                try:  # the URL fixtures skip (or, when servers are required, fail) here
                    url: str = request.getfixturevalue(f"{backend}_url")
                    broker: str = request.getfixturevalue("redis_url")
                except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                    failed: Future[None] = Future()
                    failed.set_exception(exc)
                    runs[(kind, backend)] = failed
                    continue
                workdir = tmp_path_factory.mktemp(f"{kind}-{backend}")
                if kind == "apscheduler":
                    runs[(kind, backend)] = pool.submit(_apscheduler_fleet, url, workdir, faketime)
                else:
                    runs[(kind, backend)] = pool.submit(
                        _celery_fleet, url, broker, workdir, faketime
                    )
        yield runs


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_apscheduler_replicas_run_each_fire_time_once(
    backend: str, fleets: dict[tuple[str, str], Future[None]]
) -> None:
    """Three APScheduler processes, clocks -0.3, 0, +0.3 s off, five cron jobs every 3 s,
    for 6 fire times: each (job, fire time) ran on exactly one replica."""
    fleets[("apscheduler", backend)].result()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_celery_beat_replicas_send_each_tick_once(
    backend: str, fleets: dict[tuple[str, str], Future[None]]
) -> None:
    """Three ``celery beat`` processes, clocks -0.3, 0, +0.3 s off, on
    ``multilock.integrations.celery:Scheduler``, four entries every 3 s, and one worker:
    each (entry, tick) ran exactly once over 6 ticks, as the tasks record it."""
    fleets[("celery", backend)].result()


def test_apscheduler_refuses_a_job_with_a_generated_id(memory_url: str) -> None:
    """APScheduler's default id differs on each replica: such a job is refused, not run
    everywhere. (Checked through the executor: APScheduler logs what submit raises.)"""
    pytest.importorskip("apscheduler")
    from apscheduler.schedulers.background import BackgroundScheduler

    from multilock.errors import ConfigurationError
    from multilock.integrations.apscheduler import LockedThreadPoolExecutor

    executor = LockedThreadPoolExecutor(memory_url, hold="30s")
    job = BackgroundScheduler().add_job(print, "interval", seconds=60)  # not started
    with pytest.raises(ConfigurationError, match="generated id"):
        executor._do_submit_job(job, [])
    executor.shutdown()


def test_celery_beat_refuses_a_hold_that_cannot_work(tmp_path: Path, memory_url: str) -> None:
    """A hold not above twice the skew tolerance stops beat at start, naming the entry."""
    pytest.importorskip("celery")
    from datetime import timedelta

    from celery import Celery

    from multilock.errors import ConfigurationError
    from multilock.integrations.celery import Scheduler

    app = Celery("t", broker="memory://")
    app.conf.update(
        beat_multilock_url=memory_url,
        beat_multilock_hold=0.4,
        beat_schedule={"tidy": {"task": "t.tidy", "schedule": timedelta(seconds=10)}},
    )
    with pytest.raises(ConfigurationError, match=r"beat entry 'tidy': hold .* must be longer"):
        Scheduler(app, schedule_filename=str(tmp_path / "s"))


def test_celery_interval_entries_are_due_on_the_epoch_grid(tmp_path: Path, memory_url: str) -> None:
    """Two beats that started at different moments agree on an entry's ticks: due once
    per window of the interval, from the window's start."""
    pytest.importorskip("celery")
    from datetime import UTC, datetime, timedelta

    from celery import Celery

    from multilock.integrations.celery import Scheduler

    app = Celery("t", broker="memory://")
    app.conf.update(
        beat_multilock_url=memory_url,
        beat_schedule={"tidy": {"task": "t.tidy", "schedule": timedelta(seconds=60)}},
    )
    scheduler = Scheduler(app, schedule_filename=str(tmp_path / "s"))
    try:
        entry = scheduler.schedule["tidy"]
        now = time.time()
        window = now - now % 60
        entry.last_run_at = datetime.fromtimestamp(window - 1, UTC)  # ran in the last window
        due, wait = scheduler.is_due(entry)
        assert due
        assert 0 < wait <= 60
        assert abs((now + wait) - (window + 60)) < 1
        entry.last_run_at = datetime.fromtimestamp(window + 0.5, UTC)  # ran in this one
        due, wait = scheduler.is_due(entry)
        assert not due
        assert abs((now + wait) - (window + 60)) < 1
    finally:
        scheduler.close()


UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def test_apscheduler_an_unreachable_backend_misses_the_fire_time_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not the job's failure and no traceback: a WARNING, no event, the job not called."""
    pytest.importorskip("apscheduler")
    from datetime import UTC, datetime

    from apscheduler.schedulers.background import BackgroundScheduler

    from multilock.integrations.apscheduler import LockedThreadPoolExecutor

    called: list[int] = []
    executor = LockedThreadPoolExecutor(UNREACHABLE, hold="30s")
    job = BackgroundScheduler().add_job(called.append, "interval", seconds=60, id="x", args=(1,))
    with caplog.at_level(logging.WARNING, logger="multilock.once"):
        assert executor._run_once(job, [datetime.now(UTC)]) == []
    assert called == []
    assert "x: fire time" in caplog.text
    assert "missed" in caplog.text
    executor.shutdown()


def test_celery_beat_survives_an_unreachable_backend(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tick that cannot be locked is missed with a WARNING; beat goes on."""
    pytest.importorskip("celery")
    from datetime import timedelta

    from celery import Celery

    from multilock.integrations.celery import Scheduler

    app = Celery("t", broker="memory://")
    app.conf.update(
        beat_multilock_url=UNREACHABLE,
        beat_schedule={"tidy": {"task": "t.tidy", "schedule": timedelta(seconds=10)}},
    )
    scheduler = Scheduler(app, schedule_filename=str(tmp_path / "s"))
    try:
        with caplog.at_level(logging.WARNING, logger="multilock.once"):
            scheduler.apply_entry(scheduler.schedule["tidy"])
        assert "beat:tidy: tick" in caplog.text
        assert "missed" in caplog.text
    finally:
        scheduler.close()


def test_celery_beat_refuses_a_hold_the_next_tick_would_find_held(
    tmp_path: Path, memory_url: str
) -> None:
    """hold + 2 x skew tolerance past the interval: the next tick's earliest beat would
    find the lock still held and skip. Refused at start."""
    pytest.importorskip("celery")
    from datetime import timedelta

    from celery import Celery

    from multilock.errors import ConfigurationError
    from multilock.integrations.celery import Scheduler

    app = Celery("t", broker="memory://")
    app.conf.update(
        beat_multilock_url=memory_url,
        beat_multilock_hold=2.8,
        beat_schedule={"tidy": {"task": "t.tidy", "schedule": timedelta(seconds=3)}},
    )
    with pytest.raises(ConfigurationError, match=r"must not exceed the interval between ticks"):
        Scheduler(app, schedule_filename=str(tmp_path / "s"))
