"""Where one lock cycle's time goes, per backend: a cProfile breakdown of try_acquire + release.

    python benchmarks/profile_cycle.py            # rewrites docs/cycle-profile.md
    python benchmarks/profile_cycle.py --quick    # a smoke run (CI): prints, writes nothing

Each backend's cycle runs ``CYCLES`` times under :mod:`cProfile` after a warm-up; every
function's own time (``tottime``) is put in one bucket by where the function lives:

* ``multilock``: the core and the backend distributions (our code);
* ``driver``: the client library (psycopg, redis-py, kazoo, PyMySQL, aiomysql, h11,
  nats-py);
* ``event loop``: asyncio, selectors and the loop's C helpers, without the wait;
* ``wait``: blocked for the server or another thread (``select``/``epoll``,
  ``socket.recv`` on a blocking socket, a thread lock's ``acquire``): the round trip;
* ``socket``: the other socket calls (send, non-blocking reads; on loopback a send
  may include the server's own turn on a shared CPU);
* ``other``: the rest of the standard library.

The profiler adds a cost to every Python call, so code made of many small calls looks
heavier than it is: read the shares to find where to look, and the cycle benchmarks
(``benchmarks/<backend>_cycle.py``) for what a change is worth. The functions listed
are our own code's heaviest, by own time per cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _cycle import machine_info, reachable, server_url

import multilock

__all__ = ["Row", "lines", "measure", "write"]

DOCS = Path(__file__).resolve().parent.parent / "docs"
BACKENDS = ("postgresql", "redis", "zookeeper", "etcd", "nats", "mysql")
CYCLES, QUICK_CYCLES, WARM_UP = 3000, 100, 200
NAME = "multilock-benchmark-profile"
_DRIVERS = ("psycopg", "redis", "kazoo", "pymysql", "aiomysql", "h11", "nats")
_WAITS = ("select", "poll", "epoll", "acquire", "recv", "recv_into", "wait")
BUCKETS = ("multilock", "driver", "event loop", "wait", "socket", "other")


@dataclass
class Row:
    """One backend's and API's breakdown: the share of each bucket, our heaviest code."""

    backend: str
    api: str
    micros: float  # profiled microseconds per cycle
    shares: dict[str, float] = field(default_factory=dict)
    ours: list[tuple[str, float]] = field(default_factory=list)  # (function, µs per cycle)


# Our functions whose own time is a driver's blocking call that cProfile cannot see
# (a method compiled with Cython is no builtin to it: its time is its caller's own).
_OPAQUE_WAITS = (("/multilock_postgres/_started.py", "_run"),)  # libpq's exec_prepared


def _bucket(filename: str, function: str) -> str:
    if any(filename.endswith(path) and function == name for path, name in _OPAQUE_WAITS):
        return "wait"
    if "/multilock/" in filename or "/multilock_" in filename:
        return "multilock"
    if any(f"/{driver}/" in filename for driver in _DRIVERS):
        # psycopg blocks for the server inside its own wait functions (in C).
        return "wait" if "/psycopg/" in filename and function.startswith("wait") else "driver"
    if filename == "~":  # a builtin: the function names its object
        if any(f"'{wait}'" in function or function.endswith(f".{wait}>") for wait in _WAITS):
            return "wait" if "socket" not in function or "recv" in function else "socket"
        if "socket" in function:
            return "socket"
        if "_asyncio" in function or "asyncio" in function:
            return "event loop"
        return "other"
    if "/asyncio/" in filename or filename.endswith("selectors.py"):
        return "event loop"
    return "other"


def _short(filename: str, line: int, function: str) -> str:
    for marker in ("/multilock_", "/multilock/"):
        if marker in filename:
            filename = marker.strip("/") + filename.split(marker, 1)[1]
            break
    return f"{filename}:{line} {function}"


def _row(backend: str, api: str, profile: cProfile.Profile, cycles: int) -> Row:
    loaded: Any = pstats.Stats(profile)  # its ``stats`` mapping is not in the stubs
    stats: dict[Any, Any] = loaded.stats
    buckets = dict.fromkeys(BUCKETS, 0.0)
    ours: list[tuple[str, float]] = []
    for (filename, line, function), (_cc, _nc, own, _cum, _callers) in stats.items():
        bucket = _bucket(filename, function)
        buckets[bucket] += own
        if bucket == "multilock":
            ours.append((_short(filename, line, function), own / cycles * 1e6))
    total = sum(buckets.values()) or 1.0
    ours.sort(key=lambda item: -item[1])
    return Row(
        backend=backend,
        api=api,
        micros=total / cycles * 1e6,
        shares={bucket: seconds / total for bucket, seconds in buckets.items()},
        ours=ours[:5],
    )


def _sync(url: str, cycles: int) -> cProfile.Profile:
    with multilock.connect(url) as locker:

        def cycle() -> None:
            lease = locker.try_acquire(NAME)
            assert lease is not None, "the profile's lock is held elsewhere"
            lease.release()

        for _ in range(WARM_UP):
            cycle()
        profile = cProfile.Profile()
        profile.runcall(_repeat(cycle, cycles))
    return profile


def _repeat(cycle: Callable[[], None], times: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(times):
            cycle()

    return run


async def _async(url: str, cycles: int) -> cProfile.Profile:
    async with multilock.connect_async(url) as locker:

        async def cycle() -> None:
            lease = await locker.try_acquire(NAME)
            assert lease is not None, "the profile's lock is held elsewhere"
            await lease.release()

        for _ in range(WARM_UP):
            await cycle()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(cycles):
            await cycle()
        profile.disable()
    return profile


def measure(quick: bool, skipped: list[str] | None = None) -> list[Row]:
    """Profile every reachable backend's cycle, sync then async."""
    cycles = QUICK_CYCLES if quick else CYCLES
    rows: list[Row] = []
    for backend in BACKENDS:
        url = server_url(backend)
        if not reachable(url):
            if skipped is not None:
                skipped.append(f"profile on {backend}: server unreachable")
            continue
        rows.append(_row(backend, "sync", _sync(url, cycles), cycles))
        rows.append(_row(backend, "async", asyncio.run(_async(url, cycles)), cycles))
        print(_text(rows[-2]), _text(rows[-1]), sep="\n", flush=True)
    return rows


def _text(row: Row) -> str:
    shares = ", ".join(f"{bucket} {share:.0%}" for bucket, share in row.shares.items())
    return f"{row.backend} {row.api}: {row.micros:.0f} µs profiled per cycle: {shares}"


def lines(rows: list[Row]) -> list[str]:
    """The document's section: a table of shares, then our heaviest functions per row."""
    if not rows:
        return []
    out = [
        "# Where a lock cycle's time goes",
        "",
        "Written by `python benchmarks/profile_cycle.py` (and by `benchmarks/run.py`),",
        "beside [the benchmarks](benchmarks.md): one try_acquire + release cycle per backend under",
        "cProfile, each function's own time put in a bucket by where it lives (the script's",
        "docstring defines them; *wait* is the round trip: blocked in the selector, a",
        "blocking read or a thread hand-off). The profiler charges every Python call, so",
        "read the shares to know where to look and the cycle tables for what it costs.",
        "A driver's method compiled with Cython is not seen by cProfile: its time is its",
        "caller's own. PostgreSQL's sync `_started.py` `_run` is one such call, libpq's",
        "`exec_prepared` (the round trip), counted as *wait* and left out of our heaviest.",
        "",
        "| backend | API | µs profiled | " + " | ".join(BUCKETS) + " |",
        "|---|---|---:|" + "---:|" * len(BUCKETS),
    ]
    for row in rows:
        shares = " | ".join(f"{row.shares[bucket]:.0%}" for bucket in BUCKETS)
        out.append(f"| {row.backend} | {row.api} | {row.micros:.0f} | {shares} |")
    out += ["", "Our heaviest functions, own µs per cycle under the profiler:", ""]
    for row in rows:
        heaviest = "; ".join(f"`{name}` {micros:.1f}" for name, micros in row.ours)
        out.append(f"- {row.backend} {row.api}: {heaviest}")
    return out


def write(rows: list[Row], machine: dict[str, str], out: Path) -> Path:
    """Write ``cycle-profile.md`` under ``out`` (the host first); the document's path."""
    head = lines(rows)
    body = [*head[:2], *(f"- {key}: {value}" for key, value in machine.items()), "", *head[2:]]
    document = out / "cycle-profile.md"
    document.write_text("\n".join(body) + "\n")
    return document


def main() -> int:
    """Print each backend's breakdown; without ``--quick``, write the document."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: print only")
    args = parser.parse_args()
    skipped: list[str] = []
    machine = machine_info()
    rows = measure(args.quick, skipped)
    for reason in skipped:
        print("not run:", reason)
    if not args.quick:
        print("wrote", write(rows, machine, DOCS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
