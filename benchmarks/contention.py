"""Contention: many contenders on one name, exclusive sections per second and overlaps.

    python benchmarks/contention.py           # 50 contenders, 10 s per backend
    python benchmarks/contention.py --quick   # 50 contenders, 1 s per backend (CI)

Each contender is a thread with its own sync locker (its own connection or
session), looping: ``try_acquire`` the one name; if refused, back off a
millisecond and try again; if granted, enter the section, stay 0.2 ms, leave,
``release``. A shared record, updated under a plain mutex, notes who is inside:
a contender entering while another is recorded inside counts an overlap, which
must stay zero. Backends that cannot be reached are left out.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass

from _cycle import reachable, server_url

import multilock

CONTENDERS = 50
SECTION = 0.0002
BACKOFF = 0.001


@dataclass(frozen=True)
class Row:
    """One backend's contention figures."""

    backend: str
    contenders: int
    seconds: float
    sections: int
    overlaps: int

    @property
    def per_second(self) -> float:
        """Exclusive sections per second."""
        return self.sections / self.seconds


class _Record:
    """Who is inside the section; the mutex only keeps the record itself consistent."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.inside: int | None = None
        self.sections = 0
        self.overlaps = 0

    def enter(self, who: int) -> None:
        with self.mutex:
            if self.inside is not None:
                self.overlaps += 1
            self.inside = who
            self.sections += 1

    def leave(self, who: int) -> None:
        with self.mutex:
            if self.inside == who:
                self.inside = None


def contend(backend: str, url: str, contenders: int, seconds: float) -> Row:
    """Run ``contenders`` threads on one name of ``url`` for ``seconds``."""
    name = f"bench-contention-{uuid.uuid4().hex[:8]}"
    record = _Record()
    start = threading.Barrier(contenders + 1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def contender(who: int, locker: multilock.DistributedLock) -> None:
        start.wait()
        try:
            while not stop.is_set():
                lease = locker.try_acquire(name)
                if lease is None:
                    time.sleep(BACKOFF)
                    continue
                record.enter(who)
                time.sleep(SECTION)
                record.leave(who)
                lease.release()
        except BaseException as exc:  # reported after the run, not lost in a thread
            errors.append(exc)

    with ExitStack() as stack:
        lockers = [stack.enter_context(multilock.connect(url)) for _ in range(contenders)]
        threads = [
            threading.Thread(target=contender, args=(who, locker), daemon=True)
            for who, locker in enumerate(lockers)
        ]
        for thread in threads:
            thread.start()
        start.wait()
        began = time.monotonic()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        elapsed = time.monotonic() - began
    if errors:
        raise RuntimeError(f"{backend}: a contender failed: {errors[0]!r}") from errors[0]
    row = Row(backend, contenders, elapsed, record.sections, record.overlaps)
    print(
        f"  {backend:<10} {contenders} contenders, {elapsed:5.1f} s:"
        f" {row.per_second:8.1f} sections/s, {row.overlaps} overlaps",
        flush=True,
    )
    return row


def backend_urls(directory: str) -> dict[str, str]:
    """Every backend's URL: the servers from the shared environment variables."""
    servers = {backend: server_url(backend) for backend in ("postgresql", "redis", "zookeeper")}
    return {"memory": "memory://bench-contention", "file": f"file://{directory}", **servers}


def measure(contenders: int, seconds: float) -> list[Row]:
    """Every reachable backend, one after the other."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="multilock-bench-") as directory:
        for backend, url in backend_urls(directory).items():
            if reachable(url):
                rows.append(contend(backend, url, contenders, seconds))
            else:
                print(f"  {backend:<10} unreachable, left out")
    return rows


def main() -> int:
    """Parse ``--quick``, measure, print; exit 1 on any overlap."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s per backend")
    args = parser.parse_args()
    rows = measure(CONTENDERS, 1.0 if args.quick else 10.0)
    return 1 if any(row.overlaps for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
