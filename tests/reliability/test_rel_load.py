"""Load: 200 contenders across 4 processes on one name, on each server backend. Zero
overlapping holders (checked from an external record the holders append to), no lock
leaked afterwards, no growth in server connections while it runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import multilock
from multilock.backend import LockURL
from multilock_postgres._config import parse_settings
from tests.reliability._common import poll, with_options
from tests.reliability.conftest import Measured

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SECONDS = float(os.environ.get("MULTILOCK_RELIABILITY_LOAD_SECONDS", "30"))
"""How long each backend is loaded: the issue asks for 30 s, which the committed
results were measured with; 20 s by default keeps this directory near its CI budget."""
PROCESSES = 4
CONTENDERS = 50  # per process: 200 in all
LOCKERS = 5  # per process: ten contenders share each connection
WORKER = Path(__file__).with_name("_load_worker.py")
START_AFTER = 4.0  # seconds for the worker processes to start and connect


def _counter(backend: str, url: str, tag: str) -> Callable[[], int]:
    """How many server connections the load test's lockers (tagged ``tag``, where the
    server can tell) have open now; ``url`` is the untagged one, to ask with."""
    if backend == "postgres":
        settings = parse_settings(LockURL.parse(url))

        def postgres() -> int:
            with psycopg.connect(settings.conninfo, **settings.connect_kwargs()) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
                ).fetchone()
            assert row is not None
            return int(row[0])

        return postgres
    if backend == "redis":

        def redis_clients() -> int:
            with redis.Redis.from_url(url.split("?")[0]) as client:
                return sum(1 for c in client.client_list() if c.get("name") == tag)

        return redis_clients
    host, port = LockURL.parse(url).hosts[0]

    def zookeeper() -> int:  # the whole server's: no client tag in ZooKeeper
        with socket.create_connection((host, port or 2181), timeout=5) as conn:
            conn.sendall(b"mntr")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        for line in data.decode().splitlines():
            key, _, value = line.partition("\t")
            if key == "zk_num_alive_connections":
                return int(value)
        raise AssertionError(f"no zk_num_alive_connections in mntr: {data[:200]!r}")

    return zookeeper


def _overlaps(record: Path) -> tuple[int, int]:
    """(acquisitions, overlapping holders) from the holders' record."""
    holder: str | None = None
    taken = overlaps = 0
    for line in record.read_text().splitlines():
        sign, who = line[0], line[1:]
        if sign == "+":
            overlaps += holder is not None
            holder = who
            taken += 1
        else:
            overlaps += holder != who
            holder = None
    return taken, overlaps


class Sampler:
    """Samples a connection count every half second in a thread."""

    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append(self.count())

    def stop(self) -> list[int]:
        """Stop sampling; the samples."""
        self._stop.set()
        self._thread.join(10)
        return self.samples


@pytest.mark.parametrize("backend", ["postgres", "redis", "zookeeper"])
def test_load_no_overlap_no_leak_no_growth(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, measured: Measured
) -> None:
    base: str = request.getfixturevalue(f"{backend}_url")
    tag = f"rel-load-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {
        "postgres": {"application_name": tag},
        "redis": {"client_name": tag},
        "zookeeper": {"session_timeout": "4s"},
    }[backend]
    url = with_options(base, **options)
    count = _counter(backend, base, tag)
    before = count()
    name = f"rel-load-{tag}"
    record = tmp_path / "holders.log"
    start = time.time() + START_AFTER
    args = [url, name, str(CONTENDERS), str(LOCKERS), str(record), str(start), str(SECONDS)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(PROCESSES)
    ]
    time.sleep(START_AFTER)
    sampler = Sampler(count)
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=SECONDS + 60)
            outputs.append([*out.decode().split(), err.decode()[-1000:]])
    finally:
        for proc in procs:
            proc.kill()
    samples = sampler.stop()
    assert all(o[0] == "done" for o in outputs), outputs
    errors = sum(int(o[2]) for o in outputs)
    taken, overlaps = _overlaps(record)
    after = poll("connections back to where they were", lambda: count() <= before or None, 10)
    with multilock.connect(base) as fresh:
        lease = fresh.try_acquire(name)
        free = lease is not None
        if lease is not None:
            lease.release()
    half = len(samples) // 2
    first, second = max(samples[:half], default=0), max(samples[half:], default=0)
    measured(
        f"{PROCESSES * CONTENDERS} contenders in {PROCESSES} processes, one name, {SECONDS:g} s",
        backend,
        "no overlapping holders, no lock left, connections flat then gone",
        f"{taken} acquisitions ({taken / SECONDS:.0f}/s), {overlaps} overlaps, {errors}"
        f" errors; lock free after: {free}; connections {before} before, peak"
        f" {first} / {second} (1st / 2nd half), {count()} after",
    )
    assert taken > 0
    assert overlaps == 0
    assert errors == 0
    assert free, "the lock was still held after every contender stopped"
    assert after
    assert second <= first, f"server connections grew under load: {samples}"
