"""The holder of the partition test, run in a network namespace of the test's own.

Usage: ``python partition_holder.py LOCK_URL RESOURCE_URL NAME STALE_FOR``. It takes
lock NAME and writes to the fenced resource (a Redis list that refuses an older
fencing token, see :data:`FENCED_WRITE`) every 20 ms with its fencing token. When
its lease is lost it goes on writing for STALE_FOR seconds -- a job slow to stop, or
paused -- then exits. It prints ``held <token> <wall time>``, then ``lost <wall
time>``, then ``refused <count>`` (writes the resource turned down).
"""

from __future__ import annotations

import sys
import time

import redis

import multilock

# KEYS: the highest token seen, the log of accepted writes  ARGV: token, entry
FENCED_WRITE = """
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < highest then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""
"""A write that lands only if its fencing token is not older than any before it."""
RESOURCE_KEYS = ("resource:highest", "resource:log")


def fenced_write(resource: redis.Redis, token: int, who: str) -> bool:
    """Write ``who``'s entry with ``token``; whether the resource accepted it."""
    entry = f"{token} {who} {time.time():.6f}"
    return bool(resource.eval(FENCED_WRITE, 2, *RESOURCE_KEYS, token, entry))


def main(lock_url: str, resource_url: str, name: str, stale_for: float) -> None:
    """Hold ``name`` and write under it (see the module docstring)."""
    resource = redis.Redis.from_url(resource_url, socket_timeout=1)
    refused = 0
    with multilock.connect(lock_url) as locker:
        lease = locker.try_acquire(name)
        assert lease is not None, "the lock was not free"
        token = lease.fencing_token or 0
        print(f"held {token} {time.time():.6f}", flush=True)
        stop_at = float("inf")
        while time.time() < stop_at:
            if lease.lost.is_set() and stop_at == float("inf"):
                print(f"lost {time.time():.6f}", flush=True)
                stop_at = time.time() + stale_for
            if not fenced_write(resource, token, "stale" if lease.lost.is_set() else "holder"):
                refused += 1
            time.sleep(0.02)
    print(f"refused {refused}", flush=True)
    resource.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
