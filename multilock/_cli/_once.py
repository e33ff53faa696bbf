"""``multilock once --name NAME -- COMMAND...``: a distributed ``flock(1)`` for crontabs.

Every host starts the command for the same tick; the one that takes the lock runs it,
passes its exit code through and forwards signals to it, and keeps the lock until
``--hold`` has passed since the tick (as the scheduler keeps a tick's lease), so that
a host whose cron fires late finds it held and skips.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import click

from .._durations import parse_duration
from .._locks.registry import connect_async
from .._scheduling.per_tick import shown_tick, too_late
from .._scheduling.ticks import TICK_UNITS, check_hold, parse_tick, tick_of
from .._url import mask_url
from ..abc import AsyncLease
from ..errors import BackendUnavailable, MultilockError
from ._app import cli, one_line

EXIT_SKIPPED = 75  # EX_TEMPFAIL: not run here, another host holds this tick
EXIT_OWN_FAILURE = 125  # as timeout(1) and env(1): the wrapper itself failed
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
TERMINATING = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
FORWARDED = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
LOCK_URL_ENV = "MULTILOCK_LOCK_URL"


def _say(message: str) -> None:
    click.echo(f"error: {one_line(mask_url(message))}", err=True)


class _UsageError(click.UsageError):
    exit_code = EXIT_OWN_FAILURE


class _Command(click.Command):
    """Its own usage errors exit 125 too: 1 and 2 may be the command's own codes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _UsageError(exc.format_message(), exc.ctx) from None


@cli.command(cls=_Command, context_settings={"allow_interspersed_args": False})
@click.option(
    "--lock",
    "lock_url",
    envvar=LOCK_URL_ENV,
    default=None,
    metavar="URL",
    help="lock URL (or $MULTILOCK_LOCK_URL: out of `ps`); the command does not inherit it",
)
@click.option("--name", required=True, help="the lock name: the same on every host")
@click.option(
    "--hold",
    default="30s",
    show_default=True,
    metavar="DURATION",
    help="keep the lock until this long after the tick, so that a late host skips",
)
@click.option(
    "--tick",
    default="minute",
    show_default=True,
    metavar="minute|second|ISO-TIME",
    help="the tick: the minute or second the command was started in, or given",
)
@click.option(
    "--skew-tolerance",
    default="250ms",
    show_default=True,
    metavar="DURATION",
    help="how far any host's clock may be from true time",
)
@click.option(
    "--skipped-exit-code",
    type=click.IntRange(0, 255),
    default=EXIT_SKIPPED,
    show_default=True,
    help="exit code when another host holds the tick",
)
@click.option(
    "--kill-after",
    default="10s",
    show_default=True,
    metavar="DURATION",
    help="after a lost lock, SIGKILL a command still running this long after SIGTERM",
)
@click.option("-v", "--verbose", is_flag=True, help="say why the command did not run here")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def once(
    lock_url: str | None,
    name: str,
    hold: str,
    tick: str,
    skew_tolerance: str,
    skipped_exit_code: int,
    kill_after: str,
    verbose: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND on exactly one of the hosts that start it for the same tick.

    \b
      multilock once --name nightly-reindex --hold 30s -- ./reindex.sh --full

    Exit codes: the command's own (128+N when signal N ended it); 75 when another host
    holds the tick (--skipped-exit-code); 125 when multilock itself failed (bad option,
    backend unreachable, too late for the tick, lock lost while the command ran); 126
    when the command cannot be executed, 127 when it is not found.
    """
    started = process_started()
    try:
        if lock_url is None:
            raise MultilockError(f"no lock URL: give --lock URL or set ${LOCK_URL_ENV}")
        held, skew = check_hold(hold, skew_tolerance)
        at = tick_of(started, tick) if tick in TICK_UNITS else parse_tick(tick)  # type: ignore[arg-type]
        grace = parse_duration(kill_after, what="--kill-after")
        run = _Once(lock_url, name, at, held, skew, grace, list(command))
        code = asyncio.run(run.main(skipped_exit_code, verbose))
    except BackendUnavailable as exc:
        _say(f"backend unavailable: {exc}")
        code = EXIT_OWN_FAILURE
    except MultilockError as exc:
        _say(str(exc))
        code = EXIT_OWN_FAILURE
    sys.exit(code)


def process_started() -> float:
    """When this process was started, by the wall clock (Linux: ``/proc/self/stat``):
    the tick is the minute or second the command was started for, and a loaded host
    may take a second to import Python before this code runs. Elsewhere: now."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            line = stat.read()
        ticks = int(line[line.rindex(b")") + 2 :].split()[19])  # field 22, starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        per_second = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()
    return started_at(ticks, per_second, since_boot, time.time())


def started_at(ticks: int, per_second: int, since_boot: float, now: float) -> float:
    """The wall-clock time a process started ``ticks`` clock ticks (``per_second`` a
    second) after boot, seen at ``now`` (``since_boot`` seconds after boot).

    The kernel counts whole ticks, rounded down (10 ms at 100 a second): taken as it is,
    a command cron started a few milliseconds into 03:00 could read as started at
    02:59:59.99, and run for the tick before. The end of its tick is taken instead --
    never before the true start, at most one tick after it, never after ``now``."""
    age = since_boot - (ticks + 1) / per_second
    return now - max(0.0, age)


class _Once:
    """One host's attempt at one tick: lock, run, forward, hold, release."""

    def __init__(
        self,
        url: str,
        name: str,
        tick: float,
        hold: float,
        skew: float,
        kill_after: float,
        command: list[str],
    ) -> None:
        self.url, self.name, self.tick = url, name, tick
        self.hold, self.skew, self.kill_after = hold, skew, kill_after
        self.command = command
        self.child: asyncio.subprocess.Process | None = None
        self.stopped: int | None = None  # the first terminating signal received
        self.stop = asyncio.Event()

    async def main(self, skipped: int, verbose: bool) -> int:
        loop = asyncio.get_running_loop()
        for signum in FORWARDED:
            loop.add_signal_handler(signum, self._signalled, signum)
        try:
            async with connect_async(self.url) as locker:
                lease = await locker.try_acquire(self.name)
                if lease is None:
                    if verbose:
                        click.echo(
                            f"{self.name}: tick {shown_tick(self.tick)} is held by"
                            " another host: not run here",
                            err=True,
                        )
                    return skipped
                async with lease:
                    return await self._holding(lease)
        finally:
            for signum in FORWARDED:
                loop.remove_signal_handler(signum)

    async def _holding(self, lease: AsyncLease) -> int:
        late = too_late(self.tick, self.hold, self.skew)
        if late is not None:
            raise MultilockError(f"{self.name}: too late for tick {shown_tick(self.tick)}: {late}")
        if self.stopped is not None:
            return 128 + self.stopped  # asked to stop before the command started
        code = await self._run(lease)
        if code not in (EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND):  # it ran: keep its tick
            await self._keep(lease)
        return code

    async def _run(self, lease: AsyncLease) -> int:
        env = {key: value for key, value in os.environ.items() if key != LOCK_URL_ENV}
        env["MULTILOCK_TICK"] = shown_tick(self.tick)
        if lease.fencing_token is not None:
            env["MULTILOCK_FENCING_TOKEN"] = str(lease.fencing_token)
        try:
            # Its own process group, as timeout(1) does: a signal forwarded reaches the
            # command and what it started, and a terminal's Ctrl-C reaches it once.
            self.child = await asyncio.create_subprocess_exec(
                *self.command, env=env, process_group=0
            )
        except FileNotFoundError:
            _say(f"command not found: {self.command[0]}")
            return EXIT_NOT_FOUND
        except OSError as exc:
            _say(f"cannot execute {self.command[0]}: {exc.strerror or exc}")
            return EXIT_CANNOT_EXECUTE
        waited = asyncio.ensure_future(self.child.wait())
        lost = asyncio.ensure_future(_lost(lease))
        try:
            await asyncio.wait({waited, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not waited.done():
            _say(
                f"{self.name}: the lock was lost while the command ran ({lease.lost.reason});"
                " stopping it with SIGTERM"
            )
            await self._terminate(waited)
            return EXIT_OWN_FAILURE
        code = waited.result()
        return 128 - code if code < 0 else code

    async def _terminate(self, waited: asyncio.Future[int]) -> None:
        self._kill(signal.SIGTERM)
        done, _ = await asyncio.wait({waited}, timeout=self.kill_after)
        if not done:
            self._kill(signal.SIGKILL)
            await waited

    async def _keep(self, lease: AsyncLease) -> None:
        """Keep the lease until tick + hold, or until a signal asks to stop."""
        left = self.tick + self.hold - time.time()
        if left > 0 and lease.held:
            stop = asyncio.ensure_future(self.stop.wait())
            lost = asyncio.ensure_future(_lost(lease))
            await asyncio.wait({stop, lost}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            lost.cancel()

    def _signalled(self, signum: int) -> None:
        """Forward ``signum`` to the running command; a terminating one also ends the
        hold early, or (before the command started) means not to start it."""
        if self.child is not None and self.child.returncode is None:
            self._kill(signum)
        if signum in TERMINATING:
            self.stop.set()
            if self.child is None and self.stopped is None:
                self.stopped = signum

    def _kill(self, signum: int) -> None:
        assert self.child is not None
        try:
            os.killpg(self.child.pid, signum)
        except ProcessLookupError:
            pass  # it has just ended


async def _lost(lease: AsyncLease) -> None:
    await lease.lost
