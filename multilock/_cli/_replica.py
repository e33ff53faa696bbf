"""One replica of ``multilock demo``: ``python -m multilock._cli._replica ...``.

It runs the demo's jobs every second from ``--start`` for ``--seconds`` ticks, with
its clock shifted by ``--offset`` (a replica whose clock is early or late), and
appends one line per tick to ``--record``: ``ran|skipped JOB FIRE REPLICA``.
With ``--naive`` it runs the plain lock-while-running pattern instead of the
scheduler, to show the duplicate runs a late replica causes. The lock URL comes
through the inherited pipe ``--lock-fd``: a password in it never shows in the
process list nor in the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from .._locks.registry import connect_async
from .._scheduling.clock import SystemClock
from .._scheduling.events import EventKind, JobEvent
from .._scheduling.scheduler import Scheduler
from .._scheduling.triggers import every
from .._url import mask_url
from ..errors import MultilockError

JOB_SECONDS = 0.005  # a short job: the case where a late replica re-runs a tick


class _Record:
    def __init__(self, path: str, replica: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.replica = replica

    def write(self, outcome: str, job: str, fire: float) -> None:
        # One write() per line with O_APPEND: lines of replicas never interleave.
        os.write(self.fd, f"{outcome} {job} {fire:.3f} {self.replica}\n".encode())


class _Ticks:
    """Every second from ``start``, ``count`` ticks, then no more: the demo's ticks."""

    def __init__(self, start: datetime, count: int) -> None:
        self._every = every(seconds=1, start=start)
        self._last = start + timedelta(seconds=count - 1)

    def next_fire(self, after: datetime, tz: ZoneInfo, seed: str) -> datetime | None:
        """The next second after ``after``, up to the last tick."""
        fire = self._every.next_fire(after, tz, seed)
        return fire if fire is not None and fire <= self._last else None


async def _scheduled(args: argparse.Namespace, url: str, record: _Record) -> None:
    clock = SystemClock(args.offset)
    scheduler = Scheduler(
        url,
        clock=clock,
        skew_tolerance=args.skew_tolerance,
        misfire_grace=args.misfire_grace,
        replica_id=args.id,
        metrics=False,
    )

    async def job() -> None:
        await asyncio.sleep(JOB_SECONDS)

    def listen(event: JobEvent) -> None:
        if event.kind is EventKind.SUCCEEDED:
            record.write("ran", event.job, event.fire_time.timestamp())
        elif event.kind is EventKind.SKIPPED_HELD:
            record.write("skipped", event.job, event.fire_time.timestamp())

    start = datetime.fromtimestamp(args.start, UTC)
    for name in args.jobs:
        scheduler.add_job(job, _Ticks(start, args.seconds), name=name)
    scheduler.add_listener(listen)
    # Hold the last tick as long as any other tick: a late replica must find it held.
    end = args.start + args.seconds - 1 + 2 * args.skew_tolerance + args.misfire_grace + 0.3
    async with scheduler:
        await clock.sleep_until(end)


async def _naive(args: argparse.Namespace, url: str, record: _Record) -> None:
    clock = SystemClock(args.offset)
    async with connect_async(url) as locker:

        async def loop(name: str) -> None:
            for tick in range(args.seconds):
                fire = args.start + tick
                await clock.sleep_until(fire)
                lease = await locker.try_acquire(name)
                if lease is None:
                    record.write("skipped", name, fire)
                    continue
                async with lease:  # held only while the job runs: the naive pattern
                    await asyncio.sleep(JOB_SECONDS)
                record.write("ran", name, fire)

        await asyncio.gather(*(loop(name) for name in args.jobs))


def main() -> None:
    """Parse the parent's arguments and run until the last tick."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--lock-fd", type=int, required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--offset", type=float, default=0.0)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--seconds", type=int, required=True)
    parser.add_argument("--skew-tolerance", type=float, default=0.35)
    parser.add_argument("--misfire-grace", type=float, default=0.2)
    parser.add_argument("--record", required=True)
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("jobs", nargs="+")
    args = parser.parse_args()
    with os.fdopen(args.lock_fd, encoding="utf-8") as pipe:
        url = pipe.read()
    record = _Record(args.record, args.id)
    try:
        asyncio.run(_naive(args, url, record) if args.naive else _scheduled(args, url, record))
    except MultilockError as exc:
        print(f"{type(exc).__name__}: {mask_url(str(exc))}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
