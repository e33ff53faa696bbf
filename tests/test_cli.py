"""The command line, run as a new user runs it: real subprocesses, real exit codes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import multilock
from multilock.testing import poll
from multilock.testing._servers.process import free_port


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


@pytest.mark.parametrize("command", ["run", "demo", "conformance", "locks", "key", "next", "once"])
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
    # One row per tick it counts: the replicas run no tick past --seconds.
    rows = re.findall(r"^\d\d:\d\d:\d\d +\S+ +r\d", done.stdout, re.MULTILINE)
    assert len(rows) == 8, done.stdout


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


def test_run_serves_a_users_scheduler_until_sigterm(tmp_path: Path) -> None:
    import signal
    import urllib.request

    (tmp_path / "myapp.py").write_text(APP)
    port = free_port()
    lock_dir = tmp_path / "locks"
    process = subprocess.Popen(
        [sys.executable, "-m", "multilock", "run", "myapp:scheduler", "--lock",
         f"file://{lock_dir}", "--log-format", "json", "--metrics-port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def succeeded() -> str | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                metrics = r.read().decode()
            return metrics if 'outcome="succeeded"' in metrics else None

        metrics = poll("a run succeeded, in /metrics", succeeded, 30, 0.2, not_yet=(OSError,))
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


# --- the core alone: no test-only package behind the CLI, import multilock or Scheduler ---

_TEST_ONLY = ("pytest", "_pytest", "pluggy", "hypothesis", "pytest_docker", "pytest_timeout")
_WITHOUT_TEST_PACKAGES = f"""
import importlib.abc
import sys


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {_TEST_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
"""


def without_test_packages(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where pytest and its kin cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_TEST_PACKAGES + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        stdin=subprocess.DEVNULL,
        check=False,
    )


def ml_without_test_packages(*args: str) -> subprocess.CompletedProcess[str]:
    """``multilock ARGS`` where pytest and its kin cannot be imported."""
    return without_test_packages(
        f"sys.argv = ['multilock', *{list(args)!r}]\nfrom multilock._cli import main\nmain()\n"
    )


def test_nothing_but_the_testing_plugin_imports_a_test_package() -> None:
    done = without_test_packages(
        f"""
        import pkgutil, importlib, asyncio
        import multilock
        for info in pkgutil.walk_packages(multilock.__path__, "multilock."):
            if not info.name.startswith(("multilock.testing", "multilock.__main__")):
                importlib.import_module(info.name)
        ran = []
        scheduler = multilock.Scheduler("memory://core-alone", metrics=False)
        scheduler.add_job(lambda: ran.append(1), multilock.every(milliseconds=600), name="j")
        async def main():
            async with scheduler:
                while not ran:
                    await asyncio.sleep(0.05)
        asyncio.run(asyncio.wait_for(main(), 30))
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {_TEST_ONLY!r})
        assert not loaded, loaded
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["key", "nightly-reindex"],
        ["next", "@daily", "-n", "1"],
        *(
            [command, "--help"]
            for command in ("run", "demo", "conformance", "locks", "next", "once")
        ),
    ],
)
def test_the_cli_runs_without_test_packages(args: list[str]) -> None:
    done = ml_without_test_packages(*args)
    assert done.returncode == 0, done.stderr
    assert done.stdout


def test_conformance_without_pytest_says_what_to_install() -> None:
    line = one_line_error(ml_without_test_packages("conformance", "memory://"), 2)
    assert "needs pytest: pip install 'multilock[conformance]'" in line


# --- every failure is one line --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["locks"], "Missing argument 'URL' (see 'multilock locks --help')"),
        (["locks", "memory://", "--bogus"], "No such option '--bogus'"),
        (["nosuch"], "No such command 'nosuch'"),
        (["demo", "--seconds", "0"], "Invalid value for '--seconds'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    assert fragment in one_line_error(ml(*args), 2)


def test_a_drivers_multi_line_message_is_one_line() -> None:
    done = ml("locks", f"postgresql://app:hunter2secret@127.0.0.1:{free_port()}/app")
    line = one_line_error(done, 1)
    assert "backend unavailable" in line
    assert "Connection refused" in line  # psycopg's first line; its hint joins it
    assert "hunter2secret" not in done.stderr


def test_kazoo_connection_logging_stays_out_of_the_error() -> None:
    url = f"zookeeper://127.0.0.1:{free_port()}/x?connect_timeout=1s"
    assert "backend unavailable" in one_line_error(ml("locks", url), 1)


@pytest.mark.parametrize(
    ("module", "fragment"),
    [
        ("x = 1\ndef broken(:\n", "myapp_syntax.py:2: SyntaxError"),
        ("raise RuntimeError('boom\\nsecond line')\n", "myapp_raises.py:1: RuntimeError: boom"),
    ],
)
def test_run_reports_a_module_that_fails_to_import_in_one_line(
    tmp_path: Path, module: str, fragment: str
) -> None:
    name = "myapp_syntax" if "SyntaxError" in fragment else "myapp_raises"
    (tmp_path / f"{name}.py").write_text(module)
    done = subprocess.run(
        [sys.executable, "-m", "multilock", "run", f"{name}:scheduler"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip
    assert fragment in one_line_error(done, 2)


def test_an_unknown_url_option_suggests_the_closest() -> None:
    line = one_line_error(ml("locks", "memory://?tll=30s"), 2)
    assert "unknown option 'tll'" in line
    assert "did you mean 'ttl'?" in line


def test_a_redis_db_the_server_lacks_is_bad_input(redis_url: str) -> None:
    base = redis_url.split("?")[0].rsplit("/", 1)[0]
    line = one_line_error(ml("locks", f"{base}/99999"), 2)
    assert "has no db 99999" in line


@pytest.mark.parametrize(("path", "why"), [("nowhere", "No such file"), ("a-file", "Not a dir")])
def test_locks_on_an_unusable_directory_fails_as_acquiring_does(
    tmp_path: Path, path: str, why: str
) -> None:
    # A directory that cannot be made (under /proc), and a path that is a file.
    (tmp_path / "a-file").write_text("")
    where = f"/proc/multilock-{path}" if path == "nowhere" else str(tmp_path / path)
    line = one_line_error(ml("locks", f"file://{where}"), 1)
    assert "backend unavailable" in line
    assert why in line
    with (
        pytest.raises(multilock.errors.BackendUnavailable, match=why),
        multilock.connect(f"file://{where}") as locker,
    ):
        locker.try_acquire("x")


def test_next_hints_at_the_seconds_option_in_the_cli_spelling() -> None:
    line = one_line_error(ml("next", "0 0 * * * *"), 2)
    assert "pass --seconds for a seconds field first" in line
    assert "seconds=True" not in line
    line = one_line_error(ml("next", "61 * * * *"), 2)
    assert "minute 61 out of 0\u201359" in line


# --- multilock locks: formats, names, and lock data that is not to be trusted ---------------

EVIL = "evil\x1b]0;pwned\x07[red]x[/red]\nfake\trow\u202e"
EVIL_SHOWN = "evil\\x1b]0;pwned\\x07[red]x[/red]\\x0afake\\x09row\\u202e"


def _on_a_terminal(*args: str) -> str:
    """Run ``multilock ARGS`` with stdout on a pseudo-terminal; what it wrote."""
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "xterm"}
    chunks = []
    with subprocess.Popen(
        [sys.executable, "-m", "multilock", *args],
        stdout=follower, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
    ) as process:  # fmt: skip
        os.close(follower)
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert process.stderr is not None
        errors = process.stderr.read()
        assert process.wait(timeout=60) == 0, errors
    return b"".join(chunks).decode()


def test_locks_escapes_control_characters_and_markup_from_lock_data(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(EVIL)
        assert lease is not None
        plain = ml("locks", url)
        table = _on_a_terminal("locks", url)
        as_json = ml("locks", url, "--json")
    assert plain.returncode == 0, plain.stderr
    (line,) = plain.stdout.splitlines()  # the newline in the name did not make a second row
    assert line.split("\t")[0] == EVIL_SHOWN
    assert "\x1b" not in plain.stdout
    assert "\u202e" not in plain.stdout
    assert EVIL_SHOWN in table  # the markup is shown as typed, not applied
    assert "\x1b]" not in table  # styles, yes; the name's escape sequence, no
    assert "\u202e" not in table
    assert "│" in table  # a table, on a terminal

    (row,) = json.loads(as_json.stdout)
    assert row["name"] == EVIL  # JSON escapes by itself: the exact name, for programs


def test_locks_names_postgres_keys_from_names_or_a_scheduler(
    postgres_url: str, tmp_path: Path
) -> None:
    (tmp_path / "jobs_for_locks.py").write_text(
        "import multilock\n"
        "scheduler = multilock.Scheduler('memory://')\n"
        "scheduler.add_job(print, multilock.every(seconds=10), name='say-hello')\n"
    )
    key = multilock.advisory_key("say-hello")
    with multilock.connect(postgres_url) as locker:
        lease = locker.try_acquire("say-hello")
        assert lease is not None

        def listed(*extra: str) -> list[str]:
            done = subprocess.run(
                [sys.executable, "-m", "multilock", "locks", postgres_url, *extra],
                cwd=tmp_path, capture_output=True, text=True, timeout=60,
                stdin=subprocess.DEVNULL, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            return [line for line in done.stdout.splitlines() if f"\t{key}\t" in line]

        unnamed, named, from_jobs = (
            listed(),
            listed("--names", "x,say-hello"),
            listed("--jobs", "jobs_for_locks:scheduler"),
        )
    assert [line.split("\t")[0] for line in unnamed] == ["?"]
    assert [line.split("\t")[0] for line in named] == ["say-hello"]
    assert [line.split("\t")[0] for line in from_jobs] == ["say-hello"]


# --- multilock demo: the lock URL stays off every replica's command line and environment ---


def _children(pid: int) -> set[int]:
    """The live descendants of ``pid``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


SECRET = "hunter2secret"


def _with_secret(postgres_url: str) -> str:
    url = re.sub(r"^postgresql://([^@:/]+)@", rf"postgresql://\1:{SECRET}@", postgres_url)
    assert SECRET in url
    return url


def _watch_children(
    argv: list[str], markers: tuple[bytes, ...], within: float
) -> tuple[subprocess.CompletedProcess[str], list[bytes]]:
    """Run ``multilock ARGV`` to its end; the command line and environment of each of
    its descendants whose command line or environment holds one of ``markers``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "multilock", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    seen: dict[int, bytes] = {}
    deadline = time.monotonic() + within
    try:
        while process.poll() is None:
            assert time.monotonic() < deadline, f"multilock {argv[0]} did not end"
            for pid in _children(process.pid):
                try:
                    text = Path(f"/proc/{pid}/cmdline").read_bytes()
                    text += b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue  # ended meanwhile
                if any(marker in text for marker in markers):
                    seen[pid] = text
            time.sleep(0.02)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert done.returncode == 0, out + err
    assert SECRET not in out + err
    return done, list(seen.values())


def test_demo_replicas_never_see_the_url_in_argv_or_environ(postgres_url: str) -> None:
    argv = ["demo", "--lock", _with_secret(postgres_url), "--seconds", "2", "--replicas", "2"]
    done, seen = _watch_children(argv, (b"multilock._cli._replica",), within=90)
    assert len(seen) == 2
    assert not [text for text in seen if SECRET.encode() in text]
    assert "4 ticks, 4 runs, 0 duplicates, 0 missed" in done.stdout


def test_conformance_children_never_see_the_url_in_argv_or_environ(postgres_url: str) -> None:
    checks = "across_processes or stale_holders_across"
    argv = ["conformance", "-k", checks, _with_secret(postgres_url)]
    markers = (b"multilock.testing._child", b"multilock.testing._serve")
    _, seen = _watch_children(argv, markers, within=120)
    assert len(seen) >= 4  # 4 processes a check, sync and async
    assert not [text for text in seen if SECRET.encode() in text]


def test_a_failing_replica_is_one_line(tmp_path: Path) -> None:
    directory = tmp_path / "locks"
    process = subprocess.Popen(
        [sys.executable, "-m", "multilock", "demo", "--naive", "--lock", f"file://{directory}",
         "--seconds", "2", "--replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        header = process.stdout.readline()  # printed once the replicas are started
        assert "2 replicas" in header, header
        # Before the first tick (3 s away): the directory becomes a file, acquiring fails.
        shutil.rmtree(directory)
        directory.write_text("not a directory")
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    line = one_line_error(done, 1)
    assert "failed: BackendUnavailable: lock directory" in line
    assert "cannot be opened: Not a directory" in line
