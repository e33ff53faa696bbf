"""What the private servers share: a free port, the repository's scripts, a process frozen
whole, and the two ways a server is run -- by one of the repository's scripts
(:class:`ScriptedServer`) or as a child of the test (:class:`ChildServer`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from .._poll import poll
from . import unavailable

__all__ = ["ChildServer", "ScriptedServer", "free_port", "freeze", "script", "thaw"]


def script(config: pytest.Config, name: str) -> Path:
    """The repository's script ``name`` (``scripts/`` under pytest's root directory: the
    checkout's); a skip outside a checkout (an installed sdist), a failure there when
    backends are required."""
    path = config.rootpath / "scripts" / name
    if not path.exists():
        unavailable(config, f"scripts/{name} is not here (not a checkout of the repository)")
    return path


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on ``address`` a moment ago (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
    return port


def freeze(pid: int) -> None:
    """SIGSTOP process ``pid``: the kernel still completes TCP handshakes and takes bytes,
    nothing answers -- a hung server, which TCP never reports. Returns once every thread
    of it is stopped (a thread running on another core at the signal could otherwise
    still answer one more request)."""
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    poll(
        f"every thread of process {pid} stopped",
        lambda: all(
            (task / "stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
            for task in tasks.iterdir()
        ),
        within=5,
        every=0.005,
        not_yet=(OSError,),  # a thread that ended as we looked
    )


def thaw(pid: int) -> None:
    """SIGCONT process ``pid``; nothing if it is gone."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


class ScriptedServer:
    """A server that one of the repository's scripts starts and stops (``bash SCRIPT
    start|stop``, configured by :attr:`env`; see :func:`script`), its process id in
    ``pid_file``."""

    def __init__(self, script: Path, env: dict[str, str], pid_file: Path) -> None:
        self.script = script
        self.env = {**os.environ, **env}
        self.pid_file = pid_file

    def _run(self, command: str) -> None:
        subprocess.run(
            ["bash", str(self.script), command], env=self.env, check=True, capture_output=True
        )

    def start(self) -> None:
        """Start the server; return once it answers."""
        self._run("start")

    def stop(self) -> None:
        """Stop the server, gracefully (a frozen one is thawed first)."""
        self.thaw()
        self._run("stop")

    def kill(self) -> None:
        """SIGKILL the server: its connections are reset, as when its host crashes."""
        os.kill(self.pid(), signal.SIGKILL)

    def freeze(self) -> None:
        """Stop the server where it stands: a blackhole that keeps connections (see
        :func:`freeze`)."""
        freeze(self.pid())

    def thaw(self) -> None:
        """Let a frozen server go on; nothing if it was never started."""
        try:
            thaw(self.pid())
        except FileNotFoundError:
            pass

    def pid(self) -> int:
        """The server's process id (as ``start`` recorded it)."""
        return int(self.pid_file.read_text())


class ChildServer:
    """A server process the test started itself (:attr:`process`, ``None`` while it is
    not running)."""

    process: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        """Kill it (SIGKILL: a crash, not a shutdown) and wait for it to exit."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def freeze(self) -> None:
        """SIGSTOP it: connections stay open, nothing answers (see :func:`freeze`)."""
        assert self.process is not None
        freeze(self.process.pid)

    def thaw(self) -> None:
        """SIGCONT: a frozen server goes on."""
        assert self.process is not None
        thaw(self.process.pid)
