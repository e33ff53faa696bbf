"""One replica competing for the lead, for tests/test_leadership_api.py.

    python tests/leadership_replica.py NAME RECORD LEAD_SECONDS < url

Reads the lock URL from stdin (never argv or the environment: a test scans /proc).
Campaigns with ``multilock.leadership``; its callbacks append ``PID elected|revoked
EPOCH`` lines to RECORD; once elected, leads LEAD_SECONDS, then leaves the block
(the lease released) and exits. Prints ``ready`` once campaigning.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import multilock


def note(record: str, what: str) -> None:
    """One line of RECORD (an append of one short write: whole lines, however many
    processes write)."""
    line = f"{os.getpid()} {what} {time.time():.6f}\n".encode()
    descriptor = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)


async def main(name: str, record: str, lead_seconds: float) -> None:
    """Campaign, lead for ``lead_seconds``, step down."""
    url = sys.stdin.readline().strip()
    async with (
        multilock.connect_async(url) as locker,
        multilock.leadership(
            locker,
            name,
            ttl=3.0,
            poll=0.1,
            jitter=0.05,
            on_elected=lambda: note(record, "elected"),
            on_revoked=lambda: note(record, "revoked"),
        ) as lead,
    ):
        print("ready", flush=True)
        await lead.elected
        await asyncio.sleep(lead_seconds)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
