"""``multilock run`` as an operator runs it: refused at start with one line (exit 1), or
waiting for the backend; the metrics and health endpoints, on loopback unless told."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from multilock.testing import poll
from multilock.testing._servers.process import free_port

APP = """
import multilock

scheduler = multilock.Scheduler("memory://run-ops", stop_timeout=5)


@scheduler.job(multilock.every(seconds=1), name="app-tick")
def tick() -> None:
    pass
"""
SECRET = "s3cretPW-77"


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """A directory holding ``app.py``, a module defining ``scheduler``."""
    (tmp_path / "opsapp.py").write_text(APP)
    return tmp_path


def run(
    cwd: Path, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``multilock run opsapp:scheduler ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "multilock", "run", "opsapp:scheduler", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def test_the_lock_url_may_come_from_the_environment_out_of_the_process_list(app: Path) -> None:
    pytest.importorskip("multilock_redis")
    done = run(app, env={"MULTILOCK_LOCK_URL": f"redis://:{SECRET}@127.0.0.1:1/0"})
    assert done.returncode == 1, done.stderr
    assert "the scheduler cannot start: redis at redis://:***@127.0.0.1:1/0" in done.stderr
    assert SECRET not in done.stderr


def test_an_unreachable_backend_is_one_error_line_and_exit_1(app: Path) -> None:
    pytest.importorskip("multilock_postgres")
    url = f"postgresql://app:{SECRET}@127.0.0.1:1/app?connect_timeout=2"
    done = run(app, "--lock", url)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # libpq's two-line message is one line here
    assert " ERROR   multilock.scheduler: the scheduler cannot start: PostgreSQL at" in lines[0]
    assert "postgresql://app:***@127.0.0.1:1/app" in lines[0]
    assert SECRET not in done.stderr + done.stdout
    done = run(app, "--lock", url, "--log-format", "json")
    assert done.returncode == 1
    (record,) = [json.loads(line) for line in done.stderr.splitlines()]
    assert record["level"] == "ERROR"
    assert record["message"].startswith("the scheduler cannot start: PostgreSQL at")


def test_wait_for_backend_logs_each_attempt_then_gives_up(app: Path) -> None:
    pytest.importorskip("multilock_redis")
    done = run(
        app, "--lock", "redis://127.0.0.1:1/0", "--wait-for-backend", "1s", "--log-format", "json"
    )
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    *attempts, last = records
    assert len(attempts) >= 2
    for number, record in enumerate(attempts, 1):
        assert record["level"] == "WARNING"
        assert record["message"].startswith(f"backend unreachable at start (attempt {number},")
    assert last["level"] == "ERROR"
    assert last["message"].startswith(
        f"the scheduler cannot start after {len(attempts) + 1} attempts"
    )


def test_a_bad_wait_is_bad_input(app: Path) -> None:
    done = run(app, "--wait-for-backend", "forever")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: invalid --wait-for-backend")


def _listening(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at ``port`` (from /proc/net/tcp)."""
    found = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = row.split()[1], row.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@contextmanager
def serving(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``multilock run`` in the background until the block ends (then SIGTERM); the
    list gets what it wrote to stdout and stderr once it has ended."""
    process = subprocess.Popen(
        [sys.executable, "-m", "multilock", "run", "opsapp:scheduler", *args],
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    said: list[str] = []
    try:
        yield process, said
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            said.extend(process.communicate(timeout=30))
        finally:
            process.kill()


def _get(url: str, within: float = 30.0) -> tuple[int, str]:
    def answer() -> tuple[int, str]:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()

    return poll(f"an answer from {url}", answer, within, 0.1, not_yet=(OSError,))


def test_endpoints_listen_on_loopback_unless_told(app: Path) -> None:
    pytest.importorskip("prometheus_client")
    metrics, health = free_port(), free_port()
    with serving(app, "--metrics-port", str(metrics), "--health-port", str(health)):
        assert _get(f"http://127.0.0.1:{health}/readyz") == (200, "ready\n")
        assert _get(f"http://127.0.0.1:{health}/healthz") == (200, "alive\n")
        status, text = _get(f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200
        assert "multilock_job_runs_total" in text
        assert _listening(metrics) == {"127.0.0.1"}
        assert _listening(health) == {"127.0.0.1"}
    port = free_port()
    # Another address (still loopback: a test exposes nothing to the network).
    elsewhere = ["--metrics-addr", "127.0.0.2", "--health-addr", "127.0.0.2"]
    with serving(app, "--metrics-port", str(port), "--health-port", str(port), *elsewhere):
        # One server answers all three paths when both options name the same address.
        assert _get(f"http://127.0.0.2:{port}/readyz") == (200, "ready\n")
        assert _get(f"http://127.0.0.2:{port}/metrics")[0] == 200
        assert _listening(port) == {"127.0.0.2"}


def test_the_port_of_another_process_is_one_line(app: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run(app, "--health-port", str(port))
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == f"error: cannot serve health checks on 127.0.0.1:{port}: Address already in use"


def _family(root: int) -> list[int]:
    """``root`` and every process descending from it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def test_no_password_on_the_command_line_of_run_or_its_children(app: Path) -> None:
    health = free_port()
    env = {"MULTILOCK_LOCK_URL": f"memory://app:{SECRET}@ops-argv"}
    with serving(app, "--health-port", str(health), env=env) as (process, said):
        assert _get(f"http://127.0.0.1:{health}/readyz") == (200, "ready\n")
        for pid in _family(process.pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            assert SECRET.encode() not in argv, pid
        # The environment is the owner's alone to read (unlike the command line).
        assert (Path(f"/proc/{process.pid}/environ").stat().st_mode & 0o077) == 0
    assert SECRET not in "".join(said)


# --- multilock jobs: the jobs of a scheduler, and their last outcome as replicas saw it ---


def jobs(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``multilock jobs opsapp:scheduler ARGS`` (stdout not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "multilock", "jobs", "opsapp:scheduler", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip


def test_jobs_lists_the_jobs_with_their_next_fire_times(app: Path) -> None:
    # The listing's next fire time is after the moment the command started, not after
    # the moment it is read here: an every-second job's next fire may already be past.
    started = datetime.now(UTC)
    done = jobs(app)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    name, trigger, mode, first, last = line.split("\t")
    assert (name, mode, last) == ("app-tick", "lock+claim", "")
    assert trigger.startswith("every(0:00:01")
    assert datetime.fromisoformat(first) > started
    done = jobs(app, "--json", "-n", "4")
    (row,) = json.loads(done.stdout)
    fires = [datetime.fromisoformat(fire) for fire in row["next"]]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(fires)] == [1.0] * 3
    assert row["last"] is None


def test_jobs_shows_the_last_outcome_a_running_replica_saw(app: Path) -> None:
    port = free_port()
    with serving(app, "--health-port", str(port)):
        assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 200  # serving by now

        def last() -> dict[str, object] | None:
            done = jobs(app, "--replica", f"127.0.0.1:{port}", "--json")
            assert done.returncode == 0, done.stderr
            found: dict[str, object] | None = json.loads(done.stdout)[0]["last"]
            return found

        seen = poll("an outcome of app-tick at /jobs", last, within=30, every=0.2)
        assert seen is not None
        assert seen["outcome"] == "succeeded"
        assert isinstance(seen["replica"], str)
        done = jobs(app, "--replica", f"127.0.0.1:{port}")
        assert "\tsucceeded " in done.stdout


def test_jobs_with_an_unreachable_replica_is_one_line(app: Path) -> None:
    port = free_port()
    done = jobs(app, "--replica", f"127.0.0.1:{port}")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: cannot read http://127.0.0.1:{port}/jobs: ")
