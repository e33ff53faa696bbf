"""The framework recipes under examples/, each started with its real server.

FastAPI: two uvicorn processes serving ``examples/fastapi-app`` run its scheduler in
their lifespan; each tick runs in one of them, and SIGTERM stops both cleanly. Django:
``manage.py runscheduler`` (the jobs in a process of their own) and ``runserver`` with
the scheduler started from ``AppConfig.ready()`` -- once, in the autoreloader's serving
child only -- both stopped cleanly by the signal an operator sends.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import multilock
from multilock.testing import poll
from multilock.testing._servers.process import free_port

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STOP_TIMEOUT = 30.0


def get(url: str) -> dict[str, Any] | None:
    """The JSON at ``url``, or ``None`` while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: dict[str, Any] = json.load(response)
            return body
    except OSError:
        return None


def started(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as out:  # a file, not a pipe nobody drains
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a process group of its own: signalled as a terminal would
        )


def stopped(proc: subprocess.Popen[str], signum: int, log: Path, group: bool = False) -> int:
    """Send ``signum`` (to the process group with ``group``) and wait for the exit code."""
    if group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    try:
        return proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"did not stop within {STOP_TIMEOUT} s:\n{log.read_text()[-3000:]}")


def group_alive(pgid: int) -> bool:
    """Whether a process of the process group ``pgid`` still runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def lock_is_free(url: str, name: str) -> None:
    """Nothing still holds the job's lock: its last lease was released at shutdown."""
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(name)
        assert lease is not None, f"{name} is still held after shutdown"
        lease.release()


# --- FastAPI -------------------------------------------------------------------------------


def test_fastapi_lifespan_runs_the_scheduler_in_each_server_and_stops_cleanly(
    postgres_url: str, tmp_path: Path
) -> None:
    """Two uvicorn servers of the example app: both serve, each tick of the job runs in
    one of them (none twice), and SIGTERM shuts each down through the lifespan."""
    pytest.importorskip("fastapi")
    ports = [free_port(), free_port()]
    logs = [tmp_path / f"uvicorn-{port}.log" for port in ports]
    servers = [
        started(
            [sys.executable, "-m", "uvicorn", "fastapi_jobs:app", "--port", str(port)],
            EXAMPLES / "fastapi-app",
            {"MULTILOCK_LOCK_URL": postgres_url},
            log,
        )
        for port, log in zip(ports, logs, strict=True)
    ]
    try:
        for port in ports:
            poll(f"uvicorn on {port} serving", functools.partial(get, _runs(port)), 30)

        def ticks() -> list[str]:
            answers = [get(_runs(port)) or {"ran": []} for port in ports]
            return [tick for answer in answers for tick in answer["ran"]]

        poll("five ticks run across the two servers", lambda: len(ticks()) >= 5, 30)
        statuses = [get(_runs(port)) for port in ports]
        assert all(status and status["ready"] for status in statuses), statuses
        ran = ticks()
    finally:
        codes = [
            stopped(server, signal.SIGTERM, log) for server, log in zip(servers, logs, strict=True)
        ]
    duplicated = {tick: n for tick, n in Counter(ran).items() if n > 1}
    assert not duplicated, f"ticks run by both servers: {duplicated}"
    for code, log in zip(codes, logs, strict=True):
        text = log.read_text()
        # uvicorn ends with the signal it stopped for once it has shut down.
        assert code in (0, -signal.SIGTERM), text
        assert "Application shutdown complete." in text, text
        assert "Traceback" not in text, text
    lock_is_free(postgres_url, "fastapi-example-heartbeat")


def _runs(port: int) -> str:
    return f"http://127.0.0.1:{port}/runs"


# --- Django --------------------------------------------------------------------------------

DJANGO = EXAMPLES / "django-app"
HEARTBEAT = re.compile(r"^heartbeat for tick (\S+)$", re.MULTILINE)


def heartbeats(log: Path) -> list[str]:
    return HEARTBEAT.findall(log.read_text()) if log.exists() else []


def test_django_management_command_runs_the_jobs_and_stops_on_sigterm(
    postgres_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    log = tmp_path / "runscheduler.log"
    proc = started(
        [sys.executable, "manage.py", "runscheduler"],
        DJANGO,
        {"MULTILOCK_LOCK_URL": postgres_url},
        log,
    )
    try:
        poll("three heartbeats", lambda: len(heartbeats(log)) >= 3, 30)
    finally:
        code = stopped(proc, signal.SIGTERM, log)
    text = log.read_text()
    assert code == 0, text
    assert text.count("scheduler started") == 1, text
    assert text.rstrip().endswith("scheduler stopped"), text
    assert len(set(heartbeats(log))) == len(heartbeats(log))
    lock_is_free(postgres_url, "django-example-heartbeat")


def test_django_ready_starts_one_scheduler_under_runserver_s_autoreloader(
    postgres_url: str, tmp_path: Path
) -> None:
    """runserver with its autoreloader is two processes that both run ready(): the
    scheduler starts in the serving child only, and serves /scheduler/. ``manage.py
    check`` (like migrate, shell...) starts none."""
    pytest.importorskip("django")
    env = {"MULTILOCK_LOCK_URL": postgres_url, "MULTILOCK_SCHEDULER": "in-process"}
    check = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=DJANGO,
        env={**os.environ, "MULTILOCK_LOCK_URL": postgres_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    assert "scheduler started" not in check.stdout + check.stderr

    port, log = free_port(), tmp_path / "runserver.log"
    server = started(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}"], DJANGO, env, log
    )
    try:
        status = poll("runserver serving", lambda: get(f"http://127.0.0.1:{port}/scheduler/"), 60)
        assert status == {"ready": True, "why": "ready"}
        poll("three heartbeats", lambda: len(heartbeats(log)) >= 3, 30)
    finally:
        # Ctrl-C in its terminal. The autoreloader gives its child 0.25 s to end before
        # it kills it (subprocess.run's rule): the docs say to use --noreload, or the
        # management command, where a clean stop matters.
        code = stopped(server, signal.SIGINT, log, group=True)
        poll("runserver's serving child ended too", lambda: not group_alive(server.pid), 30)
    text = log.read_text()
    assert code == 0, text
    assert text.count("scheduler started") == 1, "ready() must start it in one process only"
    lock_is_free(postgres_url, "django-example-heartbeat")  # ended with its session at worst


def test_django_ready_scheduler_stops_cleanly_with_runserver_noreload(
    postgres_url: str, tmp_path: Path
) -> None:
    """``runserver --noreload``: one process; Ctrl-C stops the server, and atexit stops
    the scheduler (jobs finished, leases released)."""
    pytest.importorskip("django")
    env = {"MULTILOCK_LOCK_URL": postgres_url, "MULTILOCK_SCHEDULER": "in-process"}
    port, log = free_port(), tmp_path / "runserver.log"
    argv = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
    server = started(argv, DJANGO, env, log)
    try:
        poll("runserver serving", lambda: get(f"http://127.0.0.1:{port}/scheduler/"), 60)
        poll("three heartbeats", lambda: len(heartbeats(log)) >= 3, 30)
    finally:
        code = stopped(server, signal.SIGINT, log, group=True)
    text = log.read_text()
    assert code == 0, text
    assert text.count("scheduler started") == 1, text
    assert text.rstrip().endswith("scheduler stopped"), text
    lock_is_free(postgres_url, "django-example-heartbeat")
