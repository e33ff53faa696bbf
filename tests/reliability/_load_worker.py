"""One process of the load test: many contenders on one lock name until a deadline.

Usage: ``python _load_worker.py URL NAME CONTENDERS LOCKERS RECORD START SECONDS``.
``CONTENDERS`` asyncio tasks share ``LOCKERS`` async lockers (so contenders on one
connection must exclude each other too) and, from epoch time ``START`` for
``SECONDS``, try the name over and over. A holder appends ``+<id>`` to RECORD on
taking it and ``-<id>`` just before releasing it (O_APPEND, one write per line): the
external record the parent checks for overlapping holders. Prints
``done <acquisitions> <errors>`` at the end.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

import multilock
from multilock.errors import MultilockError


async def contend(
    locker: multilock.AsyncDistributedLock, name: str, me: str, fd: int, until: float
) -> tuple[int, int]:
    """Try ``name`` until ``until``; (acquisitions, errors)."""
    taken = errors = 0
    while time.time() < until:
        try:
            lease = await locker.try_acquire(name)
        except MultilockError:
            errors += 1
            await asyncio.sleep(0.05)
            continue
        if lease is None:
            # Jittered backoff: busy contenders must not starve the holder of CPU.
            await asyncio.sleep(random.uniform(0.002, 0.02))
            continue
        os.write(fd, f"+{me}\n".encode())
        await asyncio.sleep(0.001)  # a window a second holder would fall into
        os.write(fd, f"-{me}\n".encode())
        await lease.release()
        taken += 1
    return taken, errors


async def main(argv: list[str]) -> None:
    """Run this process's contenders (see the module docstring)."""
    url, name, contenders, lockers, record, start, seconds = argv
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    opened = [multilock.connect_async(url) for _ in range(int(lockers))]
    try:
        await asyncio.sleep(max(0.0, float(start) - time.time()))
        until = float(start) + float(seconds)
        results = await asyncio.gather(
            *(
                contend(opened[i % len(opened)], name, f"{os.getpid()}.{i}", fd, until)
                for i in range(int(contenders))
            )
        )
    finally:
        for locker in opened:
            await locker.aclose()
        os.close(fd)
    print(f"done {sum(t for t, _ in results)} {sum(e for _, e in results)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
