"""The integrations with other schedulers, each run as the real library in several
processes whose clocks disagree (libfaketime: the conftest's ``faketime``), with the
fleet test's record check: every (job, tick) ran exactly once, none missed.

APScheduler 3: three ``BackgroundScheduler`` processes on
``LockedThreadPoolExecutor``. Celery beat: three ``celery beat`` processes on
``multilock.integrations.celery.Scheduler`` and one worker running what they send.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
FakeTime = Callable[[float], dict[str, str]]
OFFSETS = (-0.3, 0.0, 0.3)  # each replica's clock from true time
SKEW_TOLERANCE = 0.35
EVERY = 3  # seconds between ticks
HOLD = 2.7  # below the interval; a replica may run a tick up to 2 s late by its clock
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
    runs = Counter((job, int(fire)) for job, fire, _ in (line.split() for line in records) if True)
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


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_apscheduler_replicas_run_each_fire_time_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, faketime: FakeTime
) -> None:
    """Three APScheduler processes, clocks -0.3, 0, +0.3 s off, five cron jobs every 3 s,
    for 6 fire times: each (job, fire time) ran on exactly one replica."""
    pytest.importorskip("apscheduler")
    url: str = request.getfixturevalue(f"{backend}_url")
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
