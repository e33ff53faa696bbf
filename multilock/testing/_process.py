"""The parent's side of :mod:`multilock.testing._child`: spawn, talk, pause, kill."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from types import TracebackType
from typing import Any

__all__ = ["START_TIMEOUT", "URL_FROM_STDIN", "Child"]

URL_ENV = "MULTILOCK_URL"
"""The environment variable of the suite's URLs (whitespace-separated)."""
URL_FROM_STDIN = "-"
"""The child's URL argument when the URL is the first line of its stdin."""

START_TIMEOUT = 30.0
"""Seconds a child may take to start Python, import multilock and answer."""


class Child:
    """One ``python -m multilock.testing._child`` process (an async context manager
    that kills the process on exit, whatever happened).

    ``args`` are the child's arguments, ``KIND URL COMMAND NAME ...``; the URL goes
    down the child's stdin, never on its command line or in its environment, where a
    password in it would be anyone's to read (``ps``, ``/proc``).
    """

    def __init__(self, *args: str, module: str = "multilock.testing._child") -> None:
        self.args = args
        self.module = module
        self._proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Child:
        env = {k: v for k, v in os.environ.items() if k != URL_ENV}
        # The child imports what this process imports (a source checkout, say).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        kind, url, *rest = self.args
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            kind,
            URL_FROM_STDIN,
            *rest,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        await self.send(url)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            self.signal(signal.SIGCONT)
            proc.kill()
        if proc is not None:
            await proc.wait()

    @property
    def pid(self) -> int:
        """The child's process id."""
        assert self._proc is not None
        return self._proc.pid

    async def expect(self, prefix: str, within: float = START_TIMEOUT) -> str:
        """The child's next output line, which must start with ``prefix``."""
        assert self._proc is not None
        assert self._proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self._proc.stdout.readline(), within)
        except TimeoutError:
            raise AssertionError(
                f"child {' '.join(self.args[2:4])!r} said nothing within {within:g} s"
                f" (expected {prefix!r})"
            ) from None
        line = raw.decode(errors="replace").strip()
        if not line.startswith(prefix):
            raise AssertionError(
                f"child {' '.join(self.args[2:4])!r} said {line or '<EOF>'!r}, expected {prefix!r}"
                + await self._stderr()
            )
        return line[len(prefix) :].strip()

    async def send(self, command: str) -> None:
        """Write one command line to the child."""
        assert self._proc is not None
        assert self._proc.stdin is not None
        self._proc.stdin.write(command.encode() + b"\n")
        await self._proc.stdin.drain()

    async def ask(self, patience: float = START_TIMEOUT, **request: Any) -> dict[str, Any]:
        """One JSON request to a :mod:`multilock.testing._serve` child: its answer,
        which fails the check when it is an error."""
        await self.send(json.dumps(request))
        answer: dict[str, Any] = json.loads("{" + await self.expect("{", patience))
        if "error" in answer:
            raise AssertionError(f"child {self.module} failed {request['do']!r}: {answer['error']}")
        return answer

    def signal(self, signum: int) -> None:
        """Send ``signum`` (SIGKILL, SIGSTOP, SIGCONT...) unless the child is gone."""
        if self._proc is not None and self._proc.returncode is None:
            try:
                os.kill(self._proc.pid, signum)
            except ProcessLookupError:
                pass

    async def wait(self, within: float = START_TIMEOUT) -> int:
        """Wait for the child to exit; its return code."""
        assert self._proc is not None
        return await asyncio.wait_for(self._proc.wait(), within)

    async def _stderr(self) -> str:
        assert self._proc is not None
        assert self._proc.stderr is not None
        try:
            await asyncio.wait_for(self._proc.wait(), 2.0)
        except TimeoutError:
            return ""  # still running: its stderr would block
        text = (await self._proc.stderr.read()).decode(errors="replace").strip()
        return f"\nchild stderr:\n{text[-2000:]}" if text else ""
