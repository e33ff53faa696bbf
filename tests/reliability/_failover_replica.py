"""One replica of the failover fleets: a Scheduler in its own process, recording every
run's start with its fencing token, and every lost lease.

Usage: ``python _failover_replica.py URL PREFIX JOBS RECORD REPLICA_ID``.

``JOBS`` short jobs ``PREFIX-<i>`` fire every second (~1 ms bodies); ``PREFIX-long``
fires every 2 s and runs 1.5 s, so that a lease is nearly always held by a running
job when the server side fails. Each run appends ``start <job> <fire ms> <replica>
<fencing token> <epoch s>`` to RECORD when its body starts, each ``lease_lost``
event ``lost <job> <fire ms> <replica> <epoch s>``, and each ``missed`` one ``missed
<job> <fire ms> <replica> <epoch s> <reason>`` (O_APPEND: one write per line).
Prints ``ready`` once connected and scheduling; stops gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import multilock

SKEW_TOLERANCE = 0.1  # one host, one clock
MISFIRE_GRACE = 0.3  # a tick's lease is held until 0.5 s after its fire time
LONG_RUN = 1.5


async def replica(url: str, prefix: str, jobs: int, fd: int, name: str) -> None:
    """Schedule the fleet's jobs until SIGTERM."""

    def record(line: str) -> None:
        os.write(fd, f"{line}\n".encode())

    async def body(job: str, seconds: float) -> None:
        run = multilock.current_run()
        fire_ms = round(run.fire_time.timestamp() * 1000)
        record(f"start {job} {fire_ms} {name} {run.fencing_token} {time.time()!r}")
        await asyncio.sleep(seconds)

    def listen(event: multilock.JobEvent) -> None:
        fire_ms = round(event.fire_time.timestamp() * 1000)
        if event.kind is multilock.EventKind.LEASE_LOST:
            record(f"lost {event.job} {fire_ms} {name} {time.time()!r}")
        elif event.kind is multilock.EventKind.MISSED:
            reason = " ".join(str(event.reason).split())
            record(f"missed {event.job} {fire_ms} {name} {time.time()!r} {reason}")

    async with multilock.connect_async(url) as locker:
        scheduler = multilock.Scheduler(
            locker,
            skew_tolerance=SKEW_TOLERANCE,
            misfire_grace=MISFIRE_GRACE,
            stop_timeout=5,
            replica_id=name,
            metrics=False,
        )
        scheduler.add_listener(listen)
        for i in range(jobs):
            job = f"{prefix}-{i}"
            scheduler.add_job(body, multilock.every(seconds=1), name=job, args=(job, 0.001))
        long = f"{prefix}-long"
        scheduler.add_job(body, multilock.every(seconds=2), name=long, args=(long, LONG_RUN))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, scheduler.request_stop)
        await scheduler.serve(started=lambda: print("ready", flush=True))


def main(argv: list[str]) -> None:
    """Run one replica (see the module docstring for the arguments)."""
    url, prefix, jobs, record, name = argv
    logging.basicConfig(level=logging.WARNING, format=f"{name} %(levelname)s %(message)s")
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        asyncio.run(replica(url, prefix, int(jobs), fd, name))
    finally:
        os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1:])
