"""``multilock once``: a distributed flock(1) for crontabs, run as real processes.

The skewed-clock fleet gives each "host" its own clock through libfaketime (Debian's
``faketime`` package, which scripts/test installs; the conftest's ``faketime``
fixture): the product reads the real system clock, as it does in production, and no
test-only option exists in the CLI.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

import multilock
from multilock.testing import poll

ONCE = [sys.executable, "-m", "multilock", "once"]
SKIPPED, OWN_FAILURE = 75, 125
START_TIMEOUT = 30.0


def name() -> str:
    return f"once-{uuid.uuid4().hex[:10]}"


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def now(hold: float = 3.0) -> list[str]:
    """A tick of now, held ``hold`` s: one host may start up to ``hold`` - 0.1 s late
    (a loaded machine starts Python slowly)."""
    return ["--tick", iso(time.time()), "--hold", f"{hold}s", "--skew-tolerance", "50ms"]


def once(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``multilock once`` with the lock URL in its environment, never on its command line."""
    environment = {**os.environ, "MULTILOCK_LOCK_URL": url, **(env or {})}
    return subprocess.Popen(
        [*ONCE, *args], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], within: float = START_TIMEOUT) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=within)
    return proc.returncode, out, err


@pytest.fixture(params=["file", "postgres", "redis"])
def url(request: pytest.FixtureRequest) -> str:
    value: str = request.getfixturevalue(f"{request.param}_url")
    return value


# --- one host ------------------------------------------------------------------------------


def test_the_command_s_exit_code_is_passed_through(file_url: str) -> None:
    command = ["sh", "-c", "echo ran at $MULTILOCK_TICK; exit 7"]
    code, out, _ = finish(once(file_url, "--name", name(), *now(), "--", *command))
    assert code == 7
    assert out.startswith("ran at ")


def test_the_tick_is_the_minute_the_command_was_started_in(file_url: str) -> None:
    """No --tick: the minute of the process's start (away from a minute's last seconds,
    where the start could fall in the next one)."""
    if time.time() % 60 > 55:
        poll("a fresh minute", lambda: time.time() % 60 < 5, 10)
    before = time.time()
    args = ["--name", name(), "--hold", "59s", "--skew-tolerance", "50ms", "--", "sh", "-c"]
    # The SIGTERM that cuts the hold short is forwarded to the command too: ignored
    # here, or a shell still running when it lands would exit 143 instead of 0.
    script = 'trap "" TERM; echo "$MULTILOCK_TICK"; kill -TERM $PPID'
    proc = once(file_url, *args, script)  # no hold to wait
    code, out, err = finish(proc)
    assert code == 0, err
    assert out.strip() == iso(before - before % 60)


@pytest.mark.parametrize("into_the_second", [0.0001, 0.004, 0.0099, 0.5])
def test_a_start_just_after_the_tick_is_for_that_tick(into_the_second: float) -> None:
    """The kernel gives a process's start in whole clock ticks, rounded down: a command
    cron starts a few milliseconds into 03:00:00 is still for 03:00:00, never for the
    second (or minute) before, which a replica would then hold for the wrong tick."""
    from multilock._cli._once import started_at
    from multilock._scheduling.ticks import tick_of

    boot, per_second = 1_800_000_000.0, 100  # the wall-clock time of the boot
    start = 1_800_003_600.0 + into_the_second  # a whole minute, and a little
    ticks = math.floor((start - boot) * per_second)  # what /proc/self/stat says
    for age in (0.0, 0.002, 1.5):  # how long after its start the process reads it
        now = start + age
        seen = started_at(ticks, per_second, now - boot, now)
        assert start <= seen <= start + 1 / per_second
        assert tick_of(seen, "second") == tick_of(start, "second")
        assert tick_of(seen, "minute") == tick_of(start, "minute")


def test_a_command_ended_by_a_signal_exits_128_plus_it(file_url: str) -> None:
    proc = once(file_url, "--name", name(), *now(), "--", "sh", "-c", "kill -KILL $$")
    assert finish(proc)[0] == 128 + signal.SIGKILL


def test_a_command_that_cannot_run_releases_at_once(file_url: str, tmp_path: Path) -> None:
    """127 not found, 126 not executable; the tick is not kept (nothing ran)."""
    plain = tmp_path / "script.sh"
    plain.write_text("#!/bin/sh\necho no\n")
    with multilock.connect(file_url) as locker:
        for command, expected in (("no-such-command-here", 127), (str(plain), 126)):
            lock = name()
            code, _, err = finish(once(file_url, "--name", lock, *now(20), "--", command))
            assert code == expected, err
            assert err.startswith("error: ")
            lease = locker.try_acquire(lock)
            assert lease is not None, "a command that never ran must not keep the tick"
            lease.release()


def test_the_lock_is_kept_until_the_hold_has_passed_since_the_tick(url: str) -> None:
    """A 5 ms command: the lock stays held until tick + hold, the process lives that long
    and exits with the command's code, and the lock is free after."""
    lock, tick, hold = name(), time.time(), 3.0
    proc = once(url, "--name", lock, *now(hold), "--", "echo", "started")
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"
    with multilock.connect(url) as locker:
        assert locker.try_acquire(lock) is None
        assert proc.poll() is None
        code, _, err = finish(proc)
        assert code == 0, err
        assert time.time() >= tick + hold
        lease = locker.try_acquire(lock)
        assert lease is not None, "released when the process ended"
        lease.release()


def test_held_elsewhere_skips_with_the_documented_code(url: str, tmp_path: Path) -> None:
    lock, marker = name(), tmp_path / "ran"
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(lock)
        assert lease is not None
        args = ["--name", lock, *now(), "--", "touch", str(marker)]
        assert finish(once(url, *args)) == (SKIPPED, "", "")  # quiet: skipping is normal
        code, _, err = finish(once(url, "-v", "--skipped-exit-code", "0", *args))
        assert code == 0
        assert "held by another host" in err
        assert not marker.exists()
        lease.release()


def test_too_late_for_the_tick_does_not_run(file_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    args = ["--name", name(), "--hold", "2s", "--tick", iso(time.time() - 1.8), "--"]
    code, _, err = finish(once(file_url, *args, "touch", str(marker)))
    assert code == OWN_FAILURE
    assert "too late for tick" in err
    assert not marker.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "x", "--hold", "soon", "--", "true"], "invalid hold"),
        (["--name", "x", "--tick", "yesterday", "--", "true"], "invalid tick 'yesterday'"),
        (["--name", "x", "--hold", "0.4s", "--", "true"], "must be longer than twice"),
        (["--name", "x"], "Missing argument 'COMMAND"),
        (["--nmae", "x", "--", "true"], "No such option"),
    ],
)
def test_bad_input_is_one_line_and_125(file_url: str, args: list[str], message: str) -> None:
    code, out, err = finish(once(file_url, *args))
    assert code == OWN_FAILURE
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: ")
    assert message in err


def test_no_url_and_an_unreachable_backend_are_125() -> None:
    args = ["--name", "x", *now(), "--", "true"]
    environment = {k: v for k, v in os.environ.items() if k != "MULTILOCK_LOCK_URL"}
    proc = subprocess.Popen([*ONCE, *args], env=environment, stderr=subprocess.PIPE, text=True)
    code, _, err = finish(proc)
    assert code == OWN_FAILURE
    assert err == "error: no lock URL: give --lock URL or set $MULTILOCK_LOCK_URL\n"
    code, _, err = finish(once("redis://:pw@127.0.0.1:1/0", *args))
    assert code == OWN_FAILURE
    assert err.startswith("error: backend unavailable")
    assert "pw" not in err


# --- signals -------------------------------------------------------------------------------

TRAPS = """
trap 'echo USR1 >> "$0.log"' USR1
trap 'echo TERM >> "$0.log"; exit 3' TERM
echo ready
while :; do sleep 0.05; done
"""


def test_signals_are_forwarded_and_a_stop_ends_the_hold(url: str, tmp_path: Path) -> None:
    """USR1 and TERM reach the command (and its children: its process group); after
    TERM the command's code comes back at once and the lock is free, hold or not."""
    script = tmp_path / "traps.sh"
    script.write_text(TRAPS)
    log = Path(f"{script}.log")
    lock = name()
    proc = once(url, "--name", lock, *now(60), "--", "sh", str(script))
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGUSR1)
    poll("USR1 reached the command", lambda: log.exists() and "USR1" in log.read_text(), 10)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc, 10)
    assert code == 3, err
    assert log.read_text().split() == ["USR1", "TERM"]
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(lock)
        assert lease is not None, "a stopped `once` releases at once"
        lease.release()


# --- secrets -------------------------------------------------------------------------------


def test_the_url_is_on_no_command_line_and_not_in_the_command_s_environment(
    postgres_url: str, tmp_path: Path
) -> None:
    secret = f"pw-{uuid.uuid4().hex[:12]}"
    with_password = postgres_url.replace("postgres@", f"postgres:{secret}@", 1)
    assert secret in with_password
    seen = tmp_path / "seen"
    probe = (
        f"cat /proc/$$/environ | tr '\\0' '\\n' > {seen}.env;"
        " for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done"
        f" > {seen}.cmdlines"
    )
    command = ["sh", "-c", probe]
    code, _, err = finish(once(with_password, "--name", name(), *now(), "--", *command))
    assert code == 0, err
    assert secret not in Path(f"{seen}.cmdlines").read_text()
    environment = Path(f"{seen}.env").read_text()
    assert "MULTILOCK_LOCK_URL" not in environment
    assert secret not in environment
    assert "MULTILOCK_TICK=" in environment


# --- a lost lock ---------------------------------------------------------------------------


def test_a_lost_lock_stops_the_command(postgres_url: str, tmp_path: Path) -> None:
    """The session is killed server-side while the command runs: SIGTERM to the command,
    one error line, exit 125."""
    app = f"once-{uuid.uuid4().hex[:8]}"
    url = postgres_url + ("&" if "?" in postgres_url else "?") + f"application_name={app}"
    script = tmp_path / "traps.sh"
    script.write_text(TRAPS)
    proc = once(url, "--name", name(), *now(60), "--", "sh", str(script))
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    dsn = postgres_url.split("?")[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (app,),
        ).fetchone()
    assert killed == (1,)
    code, _, err = finish(proc, 20)
    assert code == OWN_FAILURE
    assert "the lock was lost while the command ran" in err
    assert Path(f"{script}.log").read_text().split() == ["TERM"]


# --- several hosts, skewed clocks ----------------------------------------------------------

OFFSETS = (-0.6, 0.0, 0.6)  # each host's clock, from true time
SKEW_TOLERANCE = 0.75
HOLD = 8.0  # a tick's winner keeps the lock 8 s: a host may start 6.5 s late (a loaded CI)
EVERY = 10  # the "crontab": every 10 s
TICKS = 3
LATE = 1.5  # one more host, whose cron starts the command this late (by its clock)
FLEET_BACKENDS = ("file", "postgres", "redis")
FakeTime = Callable[[float], dict[str, str]]  # the conftest's faketime: offset -> environment


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.2))


class Crontab:
    """Four hosts running ``multilock once --tick second`` every EVERY s on one backend:
    three with skewed clocks, one whose cron starts the command LATE s late."""

    hosts = [(offset, 0.0) for offset in OFFSETS] + [(0.0, LATE)]

    def __init__(self, url: str, workdir: Path, first: int, faketime: FakeTime) -> None:
        self.faketime = faketime
        self.url, self.lock, self.record = url, name(), workdir / f"runs-{uuid.uuid4().hex[:6]}"
        self.ticks = range(first, first + TICKS * EVERY, EVERY)
        self.outcomes: list[tuple[int, str]] = []  # (exit code, stderr) of each start

    def launches(self) -> list[tuple[float, Crontab, int]]:
        """(true time, crontab, host): a host's cron fires when its own clock says."""
        return [
            (tick - offset + delay + random.uniform(0, 0.2), self, host)
            for tick in self.ticks
            for host, (offset, delay) in enumerate(self.hosts)
        ]

    def start(self, host: int) -> tuple[int, str]:
        command = ["sh", "-c", f'echo "$MULTILOCK_TICK $HOST" >> {self.record}']
        environment = {**self.faketime(self.hosts[host][0]), "HOST": f"h{host}"}
        args = ["--tick", "second", "--hold", f"{HOLD}s", "--skew-tolerance", f"{SKEW_TOLERANCE}s"]
        code, _, err = finish(once(self.url, "--name", self.lock, *args, "--", *command,
                                   env=environment), 60)  # fmt: skip
        return code, err

    def check(self, outcomes: list[tuple[int, str]]) -> None:
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        runs = Counter(line.split()[0] for line in lines)
        expected = {iso(tick) for tick in self.ticks}
        errors = [err for code, err in outcomes if code not in (0, SKIPPED)]
        assert not errors, f"{self.url}: {errors}"
        assert {key: n for key, n in runs.items() if n > 1} == {}, f"{self.url}: a tick ran twice"
        assert set(runs) == expected, f"{self.url}: ticks missed: {sorted(expected - set(runs))}"
        codes = Counter(code for code, _ in outcomes)
        assert codes == {0: TICKS, SKIPPED: TICKS * (len(self.hosts) - 1)}, self.url
        assert [line for line in lines if line.endswith(" h3")] == [], "the late host skips"


@pytest.fixture(scope="module")
def crontabs(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    faketime: FakeTime,
) -> dict[str, Crontab | BaseException]:
    """Every backend's crontab run side by side (each mostly waits for its ticks): the
    crontab with its hosts' outcomes checked by its test, or why it could not run."""
    first = math.ceil((time.time() + 4) / EVERY) * EVERY  # every host is started for it
    made: dict[str, Crontab | BaseException] = {}
    for backend in FLEET_BACKENDS:
        try:  # the URL fixtures skip (or, when all servers are required, fail) here
            url: str = request.getfixturevalue(f"{backend}_url")
        except (pytest.skip.Exception, pytest.fail.Exception) as exc:
            made[backend] = exc
            continue
        made[backend] = Crontab(url, tmp_path_factory.mktemp(f"once-{backend}"), first, faketime)
    crontabs = [crontab for crontab in made.values() if isinstance(crontab, Crontab)]
    launches = sorted(
        (launch for crontab in crontabs for launch in crontab.launches()),
        key=lambda launch: launch[0],
    )

    def launch(when: float, crontab: Crontab, host: int) -> None:
        _sleep_until(when)
        crontab.outcomes.append(crontab.start(host))

    with ThreadPoolExecutor(max(1, len(launches))) as pool:
        for future in [pool.submit(launch, when, made_, host) for when, made_, host in launches]:
            future.result()
    return made


@pytest.mark.slow
@pytest.mark.parametrize("backend", FLEET_BACKENDS)
def test_hosts_with_skewed_clocks_run_each_tick_exactly_once(
    backend: str, crontabs: dict[str, Crontab | BaseException]
) -> None:
    """Three hosts whose clocks are -0.6, 0 and +0.6 s off, and a fourth whose cron is
    1.5 s late, start a 5 ms command for each of 3 ticks. Each tick runs exactly once
    (the command records the tick it ran for, from $MULTILOCK_TICK); every other start
    exits 75. Without the hold, the host 0.6 s ahead would run the command and release
    before the host 0.6 s behind started it. The backends' crontabs run side by side."""
    crontab = crontabs[backend]
    if isinstance(crontab, BaseException):
        raise crontab
    crontab.check(crontab.outcomes)
