"""One replica of the fleet test: a Scheduler in its own process, with a skewed clock.

Usage: ``python fleet_replica.py URL PREFIX JOBS OFFSET RECORD REPLICA_ID COORDINATION
SKEW GRACE TTL POLL [extras] [interval=I] [jump=BY] [claims=0]`` (coordination
``lock`` or ``leader``; then skew_tolerance, misfire_grace, lease_ttl and leader_poll in
seconds). ``interval``: the jobs' interval in seconds (default 1); ``jump=BY``: on
SIGUSR1 the clock jumps ``BY`` seconds forward, on SIGUSR2 back; ``claims=0``: the
scheduler holds locks even on a backend that claims ticks. It
registers ``JOBS`` jobs ``PREFIX-<i>`` firing every second; each run appends
``<job> <fire time in ms> <replica> <start ms> <end ms>`` to RECORD (O_APPEND: one
write per line; start and end by the host's clock, the true time of every replica).
With ``extras``, three jobs more, for what unit tests cannot fake: ``PREFIX-held``
(registered first, so first in the batch of each second; the test holds its name
from outside for a while), ``PREFIX-long`` (a 1.3 s body: longer than the hold and
than the interval) and ``PREFIX-offset`` (``every(1 s, start=...437 ms)``: ticks and
holds off the whole second).
It prints ``ready`` once its lock backend is connected and the scheduler has
started, and shuts down gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from datetime import UTC, datetime

import multilock

OFF_GRID = datetime(2000, 1, 1, 0, 0, 0, 437000, tzinfo=UTC)  # ticks at .437 of each second


class JumpingClock(multilock.SystemClock):
    """The host clock ``offset`` off, ``jumped`` seconds more while a jump lasts."""

    def __init__(self, offset: float) -> None:
        super().__init__(offset)
        self.jumped = 0.0

    def now(self) -> float:
        """``time.time() + offset``, plus the jump."""
        return time.time() + self.offset + self.jumped


async def replica(
    url: str,
    prefix: str,
    jobs: int,
    offset: float,
    fd: int,
    name: str,
    coordination: str,
    timing: list[float],
    extras: bool,
    options: dict[str, str],
) -> None:
    """Schedule the fleet's jobs until SIGTERM."""

    async def body(job: str, length: float = 0.001) -> None:
        fire_ms = round(multilock.current_run().fire_time.timestamp() * 1000)
        began = time.time()
        await asyncio.sleep(length)  # the ~1 ms body, by default
        line = f"{job} {fire_ms} {name} {round(began * 1000)} {round(time.time() * 1000)}"
        os.write(fd, f"{line}\n".encode())

    async with multilock.connect_async(url) as locker:
        probe = await locker.try_acquire(f"{prefix}-probe-{name}")  # connected now
        assert probe is not None
        await probe.release()
        skew, grace, ttl, poll = timing
        clock = JumpingClock(offset)
        if "jump" in options:
            by, loop = float(options["jump"]), asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(clock, "jumped", by))
            loop.add_signal_handler(signal.SIGUSR2, lambda: setattr(clock, "jumped", 0.0))
        scheduler = multilock.Scheduler(
            locker,
            coordination="leader" if coordination == "leader" else "lock",
            leader_name=f"{prefix}-leader",
            leader_poll=poll,
            skew_tolerance=skew,
            misfire_grace=grace,
            lease_ttl=ttl,
            stop_timeout=5,
            replica_id=name,
            clock=clock,
            metrics=False,
            tick_claims=options.get("claims", "1") == "1",
        )
        second = multilock.every(seconds=float(options.get("interval", "1")))
        if extras:
            scheduler.add_job(body, second, name=f"{prefix}-held", args=(f"{prefix}-held",))
        for i in range(jobs):
            job = f"{prefix}-{i}"
            scheduler.add_job(body, second, name=job, args=(job,))
        if extras:
            scheduler.add_job(body, second, name=f"{prefix}-long", args=(f"{prefix}-long", 1.3))
            off_grid = multilock.every(seconds=1, start=OFF_GRID)
            scheduler.add_job(body, off_grid, name=f"{prefix}-offset", args=(f"{prefix}-offset",))
        scheduler.add_listener(missed_to_stderr)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, scheduler.request_stop)
        await scheduler.serve(started=lambda: print("ready", flush=True))


def missed_to_stderr(event: multilock.JobEvent) -> None:
    """Say every missed tick and why on stderr: the test quotes them when a tick is missing."""
    if event.kind is multilock.EventKind.MISSED:
        fire_ms = round(event.fire_time.timestamp() * 1000)
        print(f"missed {event.job} {fire_ms} {event.reason}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    """Run one replica (see the module docstring for the arguments)."""
    url, prefix, jobs, offset, record, name, coordination, *timing = argv
    extras = "extras" in timing[4:]
    options = dict(arg.split("=", 1) for arg in timing[4:] if "=" in arg)
    logging.basicConfig(level=logging.WARNING, format=f"{name} %(levelname)s %(message)s")
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        timings = [float(value) for value in timing[:4]]
        run = replica(
            url, prefix, int(jobs), float(offset), fd, name, coordination, timings, extras, options
        )
        asyncio.run(run)
    finally:
        os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1:])
