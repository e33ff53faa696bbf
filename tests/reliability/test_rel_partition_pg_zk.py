"""Partitions, PostgreSQL and ZooKeeper: the holder runs in a network namespace of the
test's own, and its link to the lock server is cut by dropping packets (nftables in
the namespace: nothing is closed, refused or reset), while a fenced resource stays in
its reach. Checked per backend: the holder's ``lost`` fires within the documented
bound, before another replica can take the name, and no write of the stale holder --
which goes on writing after ``lost``, the worst case -- lands after the new holder's
first write.

The lock servers are private ones listening on the host's end of the namespace's veth
pair; the fenced resource is a table of another private PostgreSQL
(``_fenced.py``). The holder is ``_partition_holder.py``; the new holder is this
process.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

import multilock
from multilock.testing import poll
from multilock.testing._servers.postgres import private_server
from multilock.testing._servers.zookeeper import PrivateZooKeeper
from multilock_zookeeper._config import KEEP_GRACE_SHARE
from tests.reliability import _private
from tests.reliability._fenced import Verdict, history, install, judge
from tests.reliability._netns import Namespace, namespace_or_skip
from tests.reliability.conftest import Measured

pytestmark = [pytest.mark.topology, pytest.mark.faults, pytest.mark.slow]

HOLDER = Path(__file__).with_name("_partition_holder.py")
BOUND = 30.0  # seconds any step may take before the test fails
SLACK = 0.5  # on top of a backend's bound: a loaded 2-core machine's scheduling
STALE_AFTER = 10  # stale attempts to see refused after the new holder's first write
# PostgreSQL: the holder's health check, and the server's keepalive that ends a dead
# client's session (and so frees its lock): idle 1 s, then 2 probes 1 s apart.
HEALTH_INTERVAL, HEALTH_TIMEOUT = 1.0, 0.5
SERVER_KEEPALIVE = {"tcp_keepalives_idle": "1", "tcp_keepalives_interval": "1"}
SERVER_KEEPALIVE["tcp_keepalives_count"] = "2"
SESSION_TIMEOUT = 4.0  # ZooKeeper


@pytest.fixture(scope="module")
def netns(request: pytest.FixtureRequest) -> Iterator[Namespace]:
    """The holder's namespace."""
    namespace = namespace_or_skip(request.config)
    try:
        yield namespace
    finally:
        namespace.remove()


@dataclass(frozen=True)
class Resource:
    """The fenced resource's server, as the host and the namespace reach it."""

    here: str
    there: str


@pytest.fixture(scope="module")
def resource(request: pytest.FixtureRequest, netns: Namespace) -> Iterator[Resource]:
    """A private PostgreSQL with the fenced resource, reachable from the namespace."""
    server = private_server(request.config, addresses=("127.0.0.1", netns.host))
    try:
        here = f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"
        install(here)
        yield Resource(here, f"host={netns.host} port={server.port} user=postgres dbname=postgres")
    finally:
        server.remove()


@dataclass
class Partition:
    """What happened around one cut (epoch seconds)."""

    cut_at: float
    lost_at: float | None
    lost_reason: str
    taken_at: float
    old_token: int
    new_token: int
    verdict: Verdict

    @property
    def lost_after(self) -> float:
        assert self.lost_at is not None, "the holder's lost never fired"
        return self.lost_at - self.cut_at

    @property
    def taken_after(self) -> float:
        return self.taken_at - self.cut_at

    def row(self) -> str:
        """The measured column."""
        v = self.verdict
        return (
            f"lost after {self.lost_after:.2f} s; another replica took the name after"
            f" {self.taken_after:.2f} s ({self.taken_after - self.lost_after:.2f} s later);"
            f" stale writes: {v.stale_accepted_before} landed before the new holder's first,"
            f" {v.stale_accepted_after} after, {v.stale_rejected_after} refused after"
        )


class Holder:
    """``_partition_holder.py`` in the namespace, its lines read as they come."""

    def __init__(self, netns: Namespace, url: str, name: str, resource: Resource) -> None:
        argv = [sys.executable, str(HOLDER), url, name, resource.there]
        self.proc = netns.popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")  # end of output

    def expect(self, word: str, within: float) -> str:
        """The next line, which must start with ``word``."""
        try:
            line = self.lines.get(timeout=within)
        except queue.Empty:
            line = ""
        if not line.startswith(word):
            raise AssertionError(f"the holder said {line!r}, not {word!r}: {self.stop()}")
        return line

    def stop(self) -> str:
        """Close its stdin (it exits at once); its stderr."""
        proc = self.proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            proc.stdin.close()
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._reader.join(timeout=10)
        proc.stdout.close()
        stderr = proc.stderr.read()[-2000:]
        proc.stderr.close()
        return stderr


def _write(conninfo: str, name: str, token: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT fenced_write(%s, 'new', %s)", (name, token))


def partition(netns: Namespace, resource: Resource, port: int, urls: tuple[str, str]) -> Partition:
    """Hold a name from the namespace over ``urls[0]``, cut the lock server's ``port``,
    take the name over ``urls[1]`` from here and write with its token; judge the fence."""
    there, here = urls
    name = f"partition-{uuid.uuid4().hex[:12]}"
    holder = Holder(netns, there, name, resource)
    try:
        old_token = int(holder.expect("holding", BOUND).split()[1])
        # Its writes land while it holds the lock.
        poll("the holder writing", lambda: len(history(resource.here, name)) >= 5, BOUND)
        cut_at = time.time()
        netns.cut(port)
        with multilock.connect(here) as locker:
            lease = poll("the name free", lambda: locker.try_acquire(name), BOUND)
            taken_at = time.time()
            assert lease.fencing_token is not None
            new_token = lease.fencing_token
            _write(resource.here, name, new_token)
            lease.release()

        def refused_after() -> bool:
            return judge(history(resource.here, name), "stale", "new").stale_rejected_after >= 5

        poll("the stale holder writing on", refused_after, BOUND)
        lost = holder.lines.get_nowait() if not holder.lines.empty() else ""
    finally:
        stderr = holder.stop()
        netns.heal()
    words = lost.split(" ", 2)
    lost_at = float(words[1]) if words[0] == "lost" else None
    assert lost_at is not None, f"the holder's lost never fired ({lost!r}); stderr: {stderr}"
    verdict = judge(history(resource.here, name), "stale", "new")
    return Partition(
        cut_at, lost_at, words[2] if len(words) > 2 else "", taken_at, old_token, new_token, verdict
    )


def check(result: Partition, bound: float) -> None:
    """What every backend must show."""
    assert result.lost_after <= bound + SLACK, f"lost after {result.lost_after:.2f}s > {bound}s"
    assert result.lost_after < result.taken_after, "another replica took it before lost fired"
    assert result.new_token > result.old_token
    assert result.verdict.stale_accepted_after == 0, result.verdict
    assert result.verdict.stale_rejected_after >= 5, result.verdict
    assert result.verdict.stale_accepted_before > 0, result.verdict


FAULT = "partition: the holder's link to the server cut (packets dropped), fenced resource"


def test_partition_postgres(
    request: pytest.FixtureRequest, netns: Namespace, resource: Resource, measured: Measured
) -> None:
    server = private_server(request.config, addresses=("127.0.0.1", netns.host))
    try:
        server.configure(**SERVER_KEEPALIVE)
        options = f"fencing=true&health_interval={HEALTH_INTERVAL}&health_timeout={HEALTH_TIMEOUT}"
        there = f"postgresql://postgres@{netns.host}:{server.port}/postgres?{options}"
        here = f"postgresql://postgres@127.0.0.1:{server.port}/postgres?fencing=true"
        result = partition(netns, resource, server.port, (there, here))
    finally:
        server.remove()
    bound = HEALTH_INTERVAL + HEALTH_TIMEOUT
    check(result, bound)
    measured(
        FAULT,
        "postgres",
        f"lost within health_interval + health_timeout ({bound:g} s) + {SLACK:g} s, before the"
        " server ends the dead session (its keepalive: 3 s) and another replica takes the"
        " name; no stale write lands after the new holder's first",
        result.row(),
    )


@pytest.fixture(scope="module")
def zookeeper(
    request: pytest.FixtureRequest, netns: Namespace, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateZooKeeper]:
    """A private ZooKeeper listening on the host's end of the namespace's link."""
    server = _private.zookeeper_server(
        request.config, tmp_path_factory.mktemp("zk"), address=netns.host
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("policy", ["lost", "keep"])
def test_partition_zookeeper(
    netns: Namespace,
    resource: Resource,
    zookeeper: PrivateZooKeeper,
    policy: str,
    measured: Measured,
) -> None:
    url = (
        f"zookeeper://{netns.host}:{zookeeper.port}/partition"
        f"?session_timeout={SESSION_TIMEOUT}&connect_timeout=1"
    )
    result = partition(netns, resource, zookeeper.port, (f"{url}&suspended={policy}", url))
    # kazoo suspends the connection once a ping goes unanswered: at most 2T/3 after the
    # server last heard from it; suspended=keep then waits its grace, T/6.
    bound = SESSION_TIMEOUT * (2 / 3 + (KEEP_GRACE_SHARE if policy == "keep" else 0))
    check(result, bound)
    assert result.taken_after >= SESSION_TIMEOUT - SLACK  # the server expired the session
    rule = "2/3 of the session timeout" + (" + the grace, T/6" if policy == "keep" else "")
    measured(
        f"{FAULT}, suspended={policy}",
        "zookeeper",
        f"lost within {rule} ({bound:.2f} s with T = {SESSION_TIMEOUT:g} s) + {SLACK:g} s,"
        " before the server expires the session (T) and another replica takes the name;"
        " no stale write lands after the new holder's first",
        result.row(),
    )
