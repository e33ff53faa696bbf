"""One replica of the fleet test: a Scheduler in its own process, with a skewed clock.

Usage: ``python fleet_replica.py URL PREFIX JOBS OFFSET RECORD REPLICA_ID COORDINATION
SKEW GRACE TTL POLL`` (coordination ``lock`` or ``leader``; then skew_tolerance,
misfire_grace, lease_ttl and leader_poll in seconds). It
registers ``JOBS`` jobs ``PREFIX-<i>`` firing every second; each run appends
``<job> <fire time in ms> <replica>`` to RECORD (O_APPEND: one write per line).
It prints ``ready`` once its lock backend is connected and the scheduler has
started, and shuts down gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import multilock


async def replica(
    url: str,
    prefix: str,
    jobs: int,
    offset: float,
    fd: int,
    name: str,
    coordination: str,
    timing: list[float],
) -> None:
    """Schedule the fleet's jobs until SIGTERM."""

    async def body(job: str) -> None:
        fire_ms = round(multilock.current_run().fire_time.timestamp() * 1000)
        await asyncio.sleep(0.001)  # the ~1 ms body
        os.write(fd, f"{job} {fire_ms} {name}\n".encode())

    async with multilock.connect_async(url) as locker:
        probe = await locker.try_acquire(f"{prefix}-probe-{name}")  # connected now
        assert probe is not None
        await probe.release()
        skew, grace, ttl, poll = timing
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
            clock=multilock.SystemClock(offset),
            metrics=False,
        )
        for i in range(jobs):
            job = f"{prefix}-{i}"
            scheduler.add_job(body, multilock.every(seconds=1), name=job, args=(job,))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, scheduler.request_stop)
        await scheduler.serve(started=lambda: print("ready", flush=True))


def main(argv: list[str]) -> None:
    """Run one replica (see the module docstring for the arguments)."""
    url, prefix, jobs, offset, record, name, coordination, *timing = argv
    logging.basicConfig(level=logging.WARNING, format=f"{name} %(levelname)s %(message)s")
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        timings = [float(value) for value in timing]
        run = replica(url, prefix, int(jobs), float(offset), fd, name, coordination, timings)
        asyncio.run(run)
    finally:
        os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1:])
