"""The holder of the partition tests, run inside the test's network namespace.

Usage: ``python _partition_holder.py LOCK_URL NAME RESOURCE_CONNINFO``.

Takes ``NAME`` (trying until it gets it, for at most 30 s), prints ``holding
<token>``, then writes to the fenced resource (``tests/reliability/_fenced.py``)
with that token every 20 ms -- and goes on after its lease is lost: a job that does
not stop (a long GC pause, a write already in flight), the worst case a fence is for.
When ``lost`` fires it prints ``lost <epoch seconds> <reason>``. At EOF on stdin it
exits at once, without closing its locker over a cut link.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import psycopg

import multilock
from multilock.testing import poll


def main(url: str, name: str, conninfo: str) -> None:
    """Hold ``name`` and write with its token until stdin closes."""
    resource = psycopg.connect(conninfo, autocommit=True)
    locker = multilock.connect(url)
    lease = poll(f"taking {name!r}", lambda: locker.try_acquire(name), 30, 0.05, not_yet=())
    lease.lost.add_callback(lambda reason: print(f"lost {time.time()!r} {reason}", flush=True))
    print(f"holding {lease.fencing_token}", flush=True)
    done = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while not done.wait(0.02):
        resource.execute("SELECT fenced_write(%s, 'stale', %s)", (name, lease.fencing_token))
    os._exit(0)  # not close(): the lock server is out of reach, and that is the point


if __name__ == "__main__":
    main(*sys.argv[1:])
