"""The command line, run as a new user runs it: real subprocesses, real exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import multilock


def ml(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m multilock ARGS`` and return what it did."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "multilock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("command", ["run", "demo", "conformance", "locks", "key", "next"])
def test_every_command_has_help(command: str) -> None:
    done = ml(command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout


def test_key_prints_the_go_compatible_key_and_its_pg_locks_halves() -> None:
    done = ml("key", "nightly-reindex", "a")
    assert done.returncode == 0, done.stderr
    assert "nightly-reindex\t2151323058446577676\tpg_locks: classid=500893932" in done.stdout
    assert "a\t-5808556873153909620\tpg_locks: classid=2942557260 objid=2248273036" in done.stdout
    plain = ml("key", "--plain", "")
    assert plain.stdout.split() == ["-3750763034362895579"]


def test_key_halves_match_the_servers_pg_locks(postgres_url: str) -> None:
    import psycopg

    dsn = postgres_url.split("?")[0]  # multilock's own options mean nothing to libpq
    for name in ("nightly-reindex", "a"):
        key = multilock.advisory_key(name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            row = conn.execute(
                "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks"
                " WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            ).fetchone()
        assert row is not None
        printed = ml("key", name).stdout
        assert f"classid={row[0]} objid={row[1]} objsubid={row[2]}" in printed


def test_next_prints_fire_times_in_the_timezone() -> None:
    done = ml("next", "30 3 * * *", "--tz", "Europe/Kyiv", "-n", "2", "--after", "2026-03-28T12:00")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    # 03:30 does not exist on 2026-03-29 in Kyiv: it fires at the end of the gap.
    assert lines[0].startswith("2026-03-29T04:00:00+03:00")
    assert lines[1].startswith("2026-03-30T03:30:00+03:00")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["next", "not a cron"], "invalid cron expression"),
        (["next", "0 3 * * *", "--tz", "Mars/Olympus"], "unknown timezone"),
        (["next", "0 0 30 2 *"], "never fires"),
        (["locks", "nope://x"], "no multilock backend for nope://"),
        (["locks", "memory://?bogus=1"], "unknown option 'bogus'"),
        (["conformance", "memory://?ttl=soon"], "invalid value for option 'ttl'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    assert fragment in one_line_error(ml(*args), 2)


def test_unreachable_backend_is_one_line_and_exit_1() -> None:
    done = ml("conformance", "file:///proc/multilock-nowhere")
    assert "backend unavailable" in one_line_error(done, 1)


def test_passwords_never_reach_the_output() -> None:
    for args in (
        ["locks", "redis://user:hunter2secret@127.0.0.1:1/0?bogus=1"],
        ["conformance", "postgresql://u:hunter2secret@127.0.0.1:1/db?bogus=1"],
        ["demo", "--lock", "memory://u:hunter2secret@x?bogus=1", "--seconds", "1"],
    ):
        done = ml(*args)
        assert done.returncode != 0
        assert "hunter2secret" not in done.stdout + done.stderr


def test_locks_lists_holders_where_the_backend_can_tell(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with multilock.connect(url) as locker:
        lease = locker.try_acquire("nightly-reindex")
        assert lease is not None
        done = ml("locks", url)
    assert done.returncode == 0, done.stderr
    assert "nightly-reindex" in done.stdout
    assert f"pid {os.getpid()}" in done.stdout
    assert "no locks held" in ml("locks", url).stdout


def test_conformance_runs_the_suite_with_a_summary() -> None:
    done = ml("conformance", "memory://", "-k", "idempotent or exception")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "release is idempotent" in done.stdout
    assert re.search(r"release on exception\s*│\s*pass\s*│\s*pass", done.stdout)


def test_demo_runs_every_tick_exactly_once_across_skewed_replicas() -> None:
    done = ml("demo", "--seconds", "4", "--replicas", "3", "--skew", "250")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 ticks, 8 runs, 0 duplicates, 0 missed" in done.stdout


def test_demo_naive_shows_the_duplicates_of_a_late_replica() -> None:
    done = ml("demo", "--naive", "--seconds", "4", "--replicas", "2", "--skew", "400")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = re.search(r"(\d+) ticks, (\d+) runs, (\d+) duplicates", done.stdout)
    assert summary is not None, done.stdout
    assert int(summary[3]) > 0, done.stdout


APP = """
import time
import multilock

scheduler = multilock.Scheduler("memory://", timezone="UTC", skew_tolerance=0.3, stop_timeout=10)


@scheduler.job(multilock.every(seconds=1), name="app-tick")
def tick() -> None:
    time.sleep(0.3)  # a run is likely in flight when SIGTERM lands: it must finish
    print("ran", multilock.current_run().fire_time.isoformat(), flush=True)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_run_serves_a_users_scheduler_until_sigterm(tmp_path: Path) -> None:
    import json
    import signal
    import time
    import urllib.request

    (tmp_path / "myapp.py").write_text(APP)
    port = _free_port()
    lock_dir = tmp_path / "locks"
    process = subprocess.Popen(
        [sys.executable, "-m", "multilock", "run", "myapp:scheduler", "--lock",
         f"file://{lock_dir}", "--log-format", "json", "--metrics-port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        metrics = ""
        while time.monotonic() < deadline and 'outcome="succeeded"' not in metrics:
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    metrics = r.read().decode()
            except OSError:
                continue
        assert 'multilock_job_runs_total{job="app-tick",outcome="succeeded"}' in metrics
        assert "multilock_job_last_success_timestamp_seconds" in metrics
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "ran " in out
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(r.get("job") == "app-tick" and r.get("outcome") == "succeeded" for r in records)
    assert records[-1]["message"] == "scheduler stopped"
    # Every lease was released on the way out: the lock is free at once.
    with multilock.connect(f"file://{lock_dir}") as locker:
        assert locker.try_acquire("app-tick") is not None


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("nocolon", "expected MODULE:ATTR"),
        ("no_such_module_xyz:scheduler", "cannot import module"),
        ("json:dumps", "not a multilock.Scheduler"),
        ("json:nothing_here", "has no attribute"),
    ],
)
def test_run_rejects_bad_targets(target: str, fragment: str) -> None:
    assert fragment in one_line_error(ml("run", target), 2)


def test_run_rejects_a_bad_lock_url(tmp_path: Path) -> None:
    (tmp_path / "myapp2.py").write_text(APP)
    done = subprocess.run(
        [sys.executable, "-m", "multilock", "run", "myapp2:scheduler", "--lock",
         "redis://:hunter2secret@127.0.0.1:6379/0?bogus=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip
    line = one_line_error(done, 2)
    assert "bogus" in line
    assert "hunter2secret" not in done.stdout + done.stderr
