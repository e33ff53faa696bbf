"""One replica of the fleet test: a Scheduler in its own process, with a skewed clock.

Usage: ``python fleet_replica.py URL PREFIX JOBS OFFSET RECORD REPLICA_ID``. It
registers ``JOBS`` jobs ``PREFIX-<i>`` firing every second; each run appends
``<job> <fire time in ms> <replica>`` to RECORD (O_APPEND: one write per line).
It prints ``ready`` once scheduling, and shuts down gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import multilock

SKEW_TOLERANCE = 0.9  # above the 0.6 s clock spread of the fleet, below the 1 s interval
MISFIRE_GRACE = 0.25  # lateness + spread must stay below the tolerance
LEASE_TTL = 1.0  # TTL backends: a killed replica's leases end soon after their hold


def main(argv: list[str]) -> None:
    """Run one replica until SIGTERM."""
    url, prefix, jobs, offset, record, replica = argv
    logging.basicConfig(level=logging.WARNING, format=f"{replica} %(levelname)s %(message)s")
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def body(job: str) -> None:
        run = multilock.current_run()
        fire_ms = round(run.fire_time.timestamp() * 1000)
        await asyncio.sleep(0.001)  # the ~1 ms body
        os.write(fd, f"{job} {fire_ms} {replica}\n".encode())

    scheduler = multilock.Scheduler(
        url,
        skew_tolerance=SKEW_TOLERANCE,
        misfire_grace=MISFIRE_GRACE,
        lease_ttl=LEASE_TTL,
        stop_timeout=5,
        replica_id=replica,
        clock=multilock.SystemClock(float(offset)),
        metrics=False,
    )
    for i in range(int(jobs)):
        name = f"{prefix}-{i}"
        scheduler.add_job(body, multilock.every(seconds=1), name=name, args=(name,))
    print("ready", flush=True)
    scheduler.run()
    os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1:])
