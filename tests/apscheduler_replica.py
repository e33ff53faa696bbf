"""One replica of the APScheduler fleet test: a BlockingScheduler in its own process.

Usage: ``python apscheduler_replica.py URL PREFIX JOBS EVERY HOLD SKEW RECORD REPLICA``.
It registers ``JOBS`` cron jobs ``PREFIX-<i>`` firing every ``EVERY`` seconds on the
:class:`~multilock.integrations.apscheduler.LockedThreadPoolExecutor`; each run appends
``<job> <fire time in ms> <replica>`` to RECORD (O_APPEND: one write per line). It
prints ``ready`` once the scheduler has started, and shuts down on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType

from apscheduler.schedulers.background import BackgroundScheduler

from multilock.integrations.apscheduler import LockedThreadPoolExecutor, current_fire_time


def main(argv: list[str]) -> None:
    """Run one replica (see the module docstring for the arguments)."""
    url, prefix, jobs, every, hold, skew, record, name = argv
    logging.basicConfig(level=logging.WARNING, format=f"{name} %(levelname)s %(message)s")
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def body(job: str) -> None:
        fire = current_fire_time()
        assert fire is not None
        os.write(fd, f"{job} {round(fire.timestamp() * 1000)} {name}\n".encode())

    executor = LockedThreadPoolExecutor(url, hold=float(hold), skew_tolerance=float(skew))
    scheduler = BackgroundScheduler(
        executors={"default": executor},
        job_defaults={"misfire_grace_time": 5, "coalesce": False, "max_instances": 1},
        timezone="UTC",
    )
    for i in range(int(jobs)):
        job = f"{prefix}-{i}"
        scheduler.add_job(body, "cron", second=f"*/{every}", id=job, args=(job,))
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    scheduler.start()
    print("ready", flush=True)
    while not stopping.wait(1.0):  # a timeout: the handler runs between two waits
        pass
    scheduler.shutdown(wait=True)
    os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1:])
