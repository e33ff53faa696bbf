"""Fixtures of the PostgreSQL backend's tests, written as a third party would.

The server comes from ``MULTILOCK_POSTGRES_URL`` (default: the local test
database) through :func:`multilock.testing.server_url`, which skips when it is
down -- or fails when backends are required, as in CI. Tests that restart a
server or need TLS get a private cluster (``private_server``), with certificates
of a throwaway CA made by the repository's ``scripts/test-ca`` (``test_ca``).
The topology tests put Debian's PgBouncer in front of a server (``pgbouncer``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

from multilock.backend import LockURL
from multilock.testing import TcpProxy, require_backends, server_url
from multilock_postgres._config import parse_settings

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


@pytest.fixture(scope="session")
def postgres_url(request: pytest.FixtureRequest) -> str:
    """The PostgreSQL lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_POSTGRES_URL", DEFAULT_URL))


@pytest.fixture
def app_name() -> str:
    """An application_name unique to the test, to find its sessions in pg_stat_activity."""
    return f"mlpg-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_url(postgres_url: str, app_name: str) -> Callable[..., str]:
    """``make_url(**options)``: the test URL with the test's application_name and options."""

    def make(**options: Any) -> str:
        merged = {"application_name": app_name, **options}
        query = urlencode(
            {k: str(v).lower() if isinstance(v, bool) else v for k, v in merged.items()}
        )
        return f"{postgres_url}{'&' if '?' in postgres_url else '?'}{query}"

    return make


@pytest.fixture
def admin(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain psycopg session on the test database, as another replica would have."""
    settings = parse_settings(LockURL.parse(postgres_url))
    with psycopg.Connection.connect(settings.conninfo, **settings.connect_kwargs()) as conn:
        yield conn


@pytest.fixture
def sessions(admin: psycopg.Connection[Any]) -> Callable[[str], int]:
    """``sessions(app_name)``: how many server sessions carry that application_name."""

    def count(app_name: str) -> int:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app_name,)
        ).fetchone()
        assert row is not None
        return int(row[0])

    return count


@pytest.fixture
def holders(admin: psycopg.Connection[Any]) -> Callable[[int], list[int]]:
    """``holders(key)``: pids of the sessions holding bigint advisory ``key`` here."""

    def find(key: int) -> list[int]:
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        rows = admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
            " AND classid::bigint = %s AND objid::bigint = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (unsigned >> 32, unsigned & 0xFFFFFFFF),
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    return find


@pytest.fixture
def frozen_proxy(postgres_url: str) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test server, to freeze (see :meth:`TcpProxy.freeze`)."""
    url = LockURL.parse(postgres_url)
    with TcpProxy((url.host or "127.0.0.1", url.port or 5432)) as proxy:
        yield proxy


def _bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if found.returncode == 0 and (Path(found.stdout.strip()) / "initdb").exists():
            return Path(found.stdout.strip())
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


def _run_as() -> str | None:
    """The user to run a server as: ``postgres`` when we are root (servers refuse root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no postgres user to run a server as")
    return "postgres"


class PrivateServer:
    """A PostgreSQL cluster in a temporary directory, on a free port, that a test may
    stop, start, kill and reconfigure. As root it runs as the ``postgres`` user (the
    server refuses root). It listens on ``addresses`` (loopback by default; the
    partition tests add a veth address, whose clients it trusts as well).

    ``standby_of``: a streaming standby of that (running) server, copied from it with
    ``pg_basebackup``; :meth:`promote` makes it a primary.
    """

    def __init__(
        self,
        bindir: Path,
        *,
        addresses: tuple[str, ...] = ("127.0.0.1",),
        standby_of: PrivateServer | None = None,
    ) -> None:
        self._bindir = bindir
        self._user = _run_as()
        self.addresses = addresses
        self.directory = Path(tempfile.mkdtemp(prefix="multilock-pg-"))
        if self._user:
            shutil.chown(self.directory, self._user)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._process: subprocess.Popen[bytes] | None = None
        data = str(self.directory / "data")
        if standby_of is None:
            command = [str(bindir / "initdb"), "-D", data, "-A", "trust", "-U", "postgres"]
            command += ["--no-sync", "--no-instructions"]
        else:
            # -R: the copy starts as a standby streaming from its source.
            command = [str(bindir / "pg_basebackup"), "-D", data, "-R", "-X", "stream"]
            command += ["-c", "fast", "--no-sync", "-h", "127.0.0.1", "-U", "postgres"]
            command += ["-p", str(standby_of.port)]
        subprocess.run(command, check=True, capture_output=True, user=self._user)
        if standby_of is None and addresses != ("127.0.0.1",):
            # Reachable from loopback and the test's own network namespace only.
            rules = self.directory / "data" / "pg_hba.conf"
            rules.write_text(f"host all all 0.0.0.0/0 trust\n{rules.read_text()}")

    @property
    def url(self) -> str:
        """A lock URL of this server's ``postgres`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Start the server and wait (at most 30 s) until it accepts connections."""
        self._process = subprocess.Popen(
            [
                *(str(self._bindir / "postgres"), "-D", str(self.directory / "data")),
                *("-p", str(self.port), "-k", str(self.directory), "-c", "fsync=off"),
                *("-c", f"listen_addresses={','.join(self.addresses)}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self._user,
            # Its own process group: kill() takes the server's every process at once.
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres").close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise
                time.sleep(0.05)

    def install(self, source: Path, name: str) -> Path:
        """Copy file ``source`` into the cluster's directory as ``name``, readable by the
        server only (a private key must be)."""
        target = self.directory / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
        if self._user:
            shutil.chown(target, self._user)
        return target

    def configure(self, *, hba: str | None = None, **settings: str) -> None:
        """Set server ``settings`` (postgresql.conf) and put ``hba`` first in pg_hba.conf;
        a running server reloads them."""
        data = self.directory / "data"
        with (data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = '{value}'\n" for name, value in settings.items())
        if hba is not None:
            rules = data / "pg_hba.conf"
            rules.write_text(f"{hba}\n{rules.read_text()}")
        if self._process is not None:
            with self.admin() as conn:
                conn.execute("SELECT pg_reload_conf()")

    def admin(self) -> psycopg.Connection[Any]:
        """A superuser session, without TLS."""
        return psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres sslmode=disable", autocommit=True
        )

    def stop(self) -> None:
        """Fast shutdown: the server ends every session, then exits."""
        if self._process is not None:
            self._process.send_signal(signal.SIGINT)
            self._process.wait(timeout=30)
            self._process = None

    def kill(self) -> None:
        """SIGKILL every process of the server at once, as when its host dies: no
        goodbye on any session (the kernel closes their sockets)."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=30)
            self._process = None

    def promote(self) -> None:
        """Make this standby a primary; return once it takes writes."""
        with self.admin() as conn:
            conn.execute("SELECT pg_promote(true, 30)")

    def replicating(self) -> bool:
        """Whether a standby streams from this server (``pg_stat_replication``)."""
        with self.admin() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()
        return bool(row and row[0])

    def remove(self) -> None:
        """Stop and delete the cluster."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


class ReplicatedPair:
    """A primary :class:`PrivateServer` and its streaming standby, started, the standby
    synchronous (``synchronous_standby_names``: a commit waits until the standby has it)
    unless ``synchronous=False``. :attr:`url` names both, primary first."""

    def __init__(self, bindir: Path, *, synchronous: bool = True) -> None:
        self.primary = PrivateServer(bindir)
        self.standby: PrivateServer | None = None
        try:
            self.primary.start()
            self.standby = PrivateServer(bindir, standby_of=self.primary)
            self.standby.start()
            deadline = time.monotonic() + 30
            while not self.primary.replicating():
                if time.monotonic() > deadline:
                    raise AssertionError("the standby did not stream within 30 s")
                time.sleep(0.05)
            if synchronous:
                self.primary.configure(synchronous_standby_names="*")
        except BaseException:
            self.remove()
            raise

    @property
    def url(self) -> str:
        """A lock URL of the ``postgres`` database naming both servers."""
        assert self.standby is not None
        ports = (self.primary.port, self.standby.port)
        return f"postgresql://postgres@{','.join(f'127.0.0.1:{p}' for p in ports)}/postgres"

    def remove(self) -> None:
        """Stop and delete both clusters."""
        for server in (self.standby, self.primary):
            if server is not None:
                server.remove()


@pytest.fixture(scope="module")
def replicated_pair(request: pytest.FixtureRequest) -> Iterator[Callable[..., ReplicatedPair]]:
    """``replicated_pair(synchronous=True)``: a started :class:`ReplicatedPair`; every
    pair the module made is removed after it. Without the server's programs: a skip, or
    a failure when backends are required (CI)."""
    bindir = _bindir()
    if bindir is None or not (bindir / "pg_basebackup").exists():
        message = "the PostgreSQL server binaries (initdb, pg_basebackup) are not installed"
        if require_backends(request.config):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    pairs: list[ReplicatedPair] = []

    def make(*, synchronous: bool = True) -> ReplicatedPair:
        pairs.append(ReplicatedPair(bindir, synchronous=synchronous))
        return pairs[-1]

    try:
        yield make
    finally:
        for pair in pairs:
            pair.remove()


class PgBouncer:
    """Debian's ``pgbouncer`` on a free loopback port, in front of ``host:port``, every
    database passed through, trusting every client (as the servers of these tests do).
    ``settings`` go into its ``[pgbouncer]`` section (``pool_mode``, ``default_pool_size``,
    ``server_round_robin``...); ``databases`` adds entries of its own to ``[databases]``
    (alias: further parameters, such as ``dbname=test pool_mode=session``)."""

    def __init__(
        self, host: str, port: int, databases: dict[str, str] | None = None, **settings: str | int
    ) -> None:
        self._user = _run_as()
        self.directory = Path(tempfile.mkdtemp(prefix="multilock-pgbouncer-"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        options: dict[str, str | int] = {
            "listen_addr": "127.0.0.1",
            "listen_port": self.port,
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.directory / "userlist.txt"),
            "logfile": str(self.directory / "pgbouncer.log"),
            "max_client_conn": 500,
            # psycopg sends nothing else at startup; an unknown one would be refused.
            "ignore_startup_parameters": "extra_float_digits",
            **settings,
        }
        config = "\n".join(f"{key} = {value}" for key, value in options.items())
        entries = "".join(
            f"{alias} = host={host} port={port} {extra}\n"
            for alias, extra in (databases or {}).items()
        )
        (self.directory / "pgbouncer.ini").write_text(
            f"[databases]\n{entries}* = host={host} port={port}\n\n[pgbouncer]\n{config}\n"
        )
        # trust still looks the user up in the auth file.
        (self.directory / "userlist.txt").write_text('"postgres" ""\n')
        if self._user:
            for path in (self.directory, *self.directory.iterdir()):
                shutil.chown(path, self._user)
        self._process = subprocess.Popen(
            ["pgbouncer", "-q", str(self.directory / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            user=self._user,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(
                    f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
                ).close()
                return
            except psycopg.OperationalError:
                if self._process.poll() is not None:
                    raise RuntimeError(f"pgbouncer exited: {self.log()}") from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def url(self, database: str) -> str:
        """A lock URL of ``database`` through this pooler."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        """The tail of the pooler's log."""
        path = self.directory / "pgbouncer.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def stop(self) -> None:
        """Stop the pooler (SIGINT: at once, closing every connection) and remove its files."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stderr is not None:
            self._process.stderr.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def pgbouncer(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[Callable[..., str]]:
    """``pgbouncer(databases=None, **settings)``: a started :class:`PgBouncer` in front of
    the test server; the test database's lock URL through it. Stopped after the module."""
    if shutil.which("pgbouncer") is None:
        message = "pgbouncer is not installed (Debian's pgbouncer; scripts/test installs it)"
        if require_backends(request.config):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    url = LockURL.parse(postgres_url)
    started: list[PgBouncer] = []

    def start(databases: dict[str, str] | None = None, **settings: str | int) -> str:
        host, port = url.host or "127.0.0.1", url.port or 5432
        started.append(PgBouncer(host, port, databases, **settings))
        return started[-1].url(url.path.lstrip("/") or "postgres")

    try:
        yield start
    finally:
        for bouncer in started:
            bouncer.stop()


@pytest.fixture(scope="module")
def private_server() -> Iterator[PrivateServer]:
    """A private server of the test module, started; a test that stops it starts it again."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("the PostgreSQL server binaries (initdb) are not installed")
    server = PrivateServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.remove()
