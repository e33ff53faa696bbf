"""Private PostgreSQL servers: a cluster of our own (:class:`PrivateServer`), a primary
with its streaming standby (:class:`ReplicatedPair`), Debian's PgBouncer in front of a
server (:class:`PgBouncer`). Each on a free loopback port, in a temporary directory."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .._poll import poll
from . import unavailable
from .process import free_port

__all__ = ["PgBouncer", "PrivateServer", "ReplicatedPair", "bindir", "private_server", "programs"]


def bindir() -> Path | None:
    """Where the PostgreSQL server's programs (``initdb``...) are, or ``None``."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if found.returncode == 0 and (Path(found.stdout.strip()) / "initdb").exists():
            return Path(found.stdout.strip())
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


def programs(config: pytest.Config, *needed: str) -> Path:
    """The directory of the server's programs, with ``initdb`` and ``needed`` ones; a
    skip where they are not installed (a failure when backends are required)."""
    found = bindir()
    wanted = ("initdb", *needed)
    if found is None or not all((found / name).exists() for name in wanted):
        unavailable(
            config, f"the PostgreSQL server programs ({', '.join(wanted)}) are not installed"
        )
    return found


def private_server(config: pytest.Config, **options: Any) -> PrivateServer:
    """A started :class:`PrivateServer` (``options``: ``addresses``); a skip, or a failure
    when backends are required, without the server's programs."""
    server = PrivateServer(programs(config), **options)
    try:
        server.start()
    except BaseException:
        server.remove()
        raise
    return server


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
        programs: Path,
        *,
        addresses: tuple[str, ...] = ("127.0.0.1",),
        standby_of: PrivateServer | None = None,
    ) -> None:
        self._bindir = programs
        self._user = _run_as()
        self.addresses = addresses
        self.directory = Path(tempfile.mkdtemp(prefix="multilock-pg-"))
        if self._user:
            shutil.chown(self.directory, self._user)
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        data = str(self.directory / "data")
        if standby_of is None:
            command = [str(programs / "initdb"), "-D", data, "-A", "trust", "-U", "postgres"]
            command += ["--no-sync", "--no-instructions"]
        else:
            # -R: the copy starts as a standby streaming from its source.
            command = [str(programs / "pg_basebackup"), "-D", data, "-R", "-X", "stream"]
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
        poll(f"PostgreSQL on port {self.port} accepting connections", self._answers, 30)

    def _answers(self) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            raise RuntimeError(f"postgres exited at start ({self._process.returncode})")
        try:
            psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres").close()
        except psycopg.OperationalError:
            return False
        return True

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

    def __init__(self, programs: Path, *, synchronous: bool = True) -> None:
        self.primary = PrivateServer(programs)
        self.standby: PrivateServer | None = None
        try:
            self.primary.start()
            self.standby = PrivateServer(programs, standby_of=self.primary)
            self.standby.start()
            poll("the standby streaming from the primary", self.primary.replicating, 30)
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
        self.port = free_port()
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
        try:
            poll(f"pgbouncer on port {self.port} accepting connections", self._answers, 30)
        except AssertionError:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self._process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited: {self.log()}")
        try:
            psycopg.connect(
                f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
            ).close()
        except psycopg.OperationalError:
            return False
        return True

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
