"""One replica of the failover fleet: the real Scheduler in its own process.

Usage: ``python failover_replica.py URL PREFIX JOBS RECORD REPLICA_ID``. It runs
``JOBS`` jobs ``PREFIX-<i>`` every second (a 1 ms body) and ``PREFIX-long`` every
4 seconds (a 3 s body: a lease held across a failover that lands in it). Each run
appends ``run <job> <fire ms> <replica> <fencing token> <start, wall ms>`` to
RECORD, each lost lease ``lost <job> <fire ms> <replica> <when, wall ms>`` and each
tick missed ``missed <job> <fire ms> <replica> <when, wall ms>`` (O_APPEND: one
write per line). It prints ``ready`` once started, and stops on SIGTERM.

Unlike ``tests/fleet_replica.py`` (whose record has no fencing token), it records
what a failover report needs: the tokens, and when leases were lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import multilock


def _now_ms() -> int:
    return round(time.time() * 1000)


async def replica(url: str, prefix: str, jobs: int, fd: int, name: str) -> None:
    """Schedule the jobs until SIGTERM."""

    def write(line: str) -> None:
        os.write(fd, f"{line}\n".encode())

    async def body(seconds: float) -> None:
        run = multilock.current_run()
        fire_ms = round(run.fire_time.timestamp() * 1000)
        write(f"run {run.job} {fire_ms} {name} {run.fencing_token} {_now_ms()}")
        await asyncio.sleep(seconds)

    def listen(event: multilock.JobEvent) -> None:
        if event.kind in (multilock.EventKind.LEASE_LOST, multilock.EventKind.MISSED):
            kind = "lost" if event.kind is multilock.EventKind.LEASE_LOST else "missed"
            fire_ms = round(event.fire_time.timestamp() * 1000)
            write(f"{kind} {event.job} {fire_ms} {name} {_now_ms()}")

    async with multilock.connect_async(url) as locker:
        probe = await locker.try_acquire(f"{prefix}-probe-{name}")  # connected now
        assert probe is not None
        await probe.release()
        scheduler = multilock.Scheduler(
            locker,
            skew_tolerance=0.2,
            misfire_grace=0.2,
            stop_timeout=5,
            replica_id=name,
            metrics=False,
        )
        scheduler.add_listener(listen)
        for i in range(jobs):
            job = f"{prefix}-{i}"
            scheduler.add_job(body, multilock.every(seconds=1), name=job, args=(0.001,))
        scheduler.add_job(body, multilock.every(seconds=4), name=f"{prefix}-long", args=(3.0,))
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
