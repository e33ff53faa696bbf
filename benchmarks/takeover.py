"""Leader takeover: how long a standby takes to lead once the leader goes, per backend.

    python benchmarks/takeover.py           # every reachable backend, left and killed
    python benchmarks/takeover.py --quick   # CI: 1 round left, 1 killed on file:// and PostgreSQL

Two replicas of ``multilock.leadership`` on one name, with the API's defaults (poll
1 s, jitter 0.1 s, ttl 10 s). *Left*: the leader, in this process, leaves its block
(the lease released) at a random moment of the standby's poll cycle; the time runs
from the start of its exit to the standby's ``elected`` firing (woken by the
release where the backend announces it). *Killed*: the leader is a child process,
SIGKILLed; the time runs from the kill to the standby's ``elected``: the poll (or
the wake-up) after the backend frees the lease -- at once where the lease is the
session's (PostgreSQL, MySQL, a flock), after the session timeout or the ttl
elsewhere. memory:// has no process to kill. Backends that cannot be reached are
left out.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

from _cycle import reachable, server_url

import multilock

POLL = 1.0  # the API's defaults: what a user gets
JITTER = 0.1
TTL = 10.0
FULL = (10, 3)  # rounds: left, killed
QUICK = (1, 1)
QUICK_KILLED = ("file", "postgresql")  # session-bound: a kill frees the lease at once
BOUND = 60.0  # a round that takes longer has failed


@dataclass(frozen=True)
class Row:
    """One backend's takeover times, in seconds."""

    backend: str
    left: list[float]
    killed: list[float]


def _leadership(locker: multilock.AsyncDistributedLock, name: str) -> multilock.AsyncLeadership:
    return multilock.leadership(locker, name, poll=POLL, jitter=JITTER, ttl=TTL)


async def _elected_after(standby: multilock.AsyncLeadership, began: float) -> float:
    """Seconds from ``began`` (monotonic) to ``standby`` leading, timed where it fires."""
    fired: list[float] = []
    standby.elected.add_callback(lambda reason: fired.append(time.monotonic()))
    async with asyncio.timeout(BOUND):
        await standby.elected
    return fired[0] - began


async def left(url: str, rounds: int) -> list[float]:
    """``rounds`` hand-overs by a leader leaving its block, alternately each way."""
    name = f"bench-takeover-{uuid.uuid4().hex[:8]}"
    times = []
    async with multilock.connect_async(url) as a, multilock.connect_async(url) as b:
        lockers = [a, b]
        leader = _leadership(a, name)
        await leader.__aenter__()
        try:
            async with asyncio.timeout(BOUND):
                await leader.elected
            for index in range(rounds):
                standby = _leadership(lockers[(index + 1) % 2], name)
                await standby.__aenter__()
                # Leave at a random phase of the standby's polls (its first try, at
                # once, was refused): what a user sees on average.
                await asyncio.sleep(random.uniform(0.05, POLL))
                began = time.monotonic()
                await leader.__aexit__(None, None, None)
                leader = standby
                times.append(await _elected_after(standby, began))
        finally:
            await leader.__aexit__(None, None, None)
    return times


def killed(url: str, rounds: int) -> list[float]:
    """``rounds`` hand-overs by a leader process SIGKILLed."""
    times = []
    for _ in range(rounds):
        name = f"bench-takeover-{uuid.uuid4().hex[:8]}"
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdin is not None
            assert child.stdout is not None
            child.stdin.write(url + "\n")  # never argv or the environment: /proc shows them
            child.stdin.close()
            if child.stdout.readline().strip() != "leading":
                raise RuntimeError(f"the leader process on {url} did not lead")
            child.stdout.close()
            times.append(asyncio.run(_standby_after_kill(url, name, child)))
        finally:
            child.kill()
            child.wait(timeout=BOUND)
    return times


async def _standby_after_kill(url: str, name: str, child: subprocess.Popen[str]) -> float:
    async with (
        multilock.connect_async(url) as locker,
        _leadership(locker, name) as standby,
    ):
        await asyncio.sleep(random.uniform(0.05, POLL))
        began = time.monotonic()
        child.kill()
        return await _elected_after(standby, began)


async def _child(name: str) -> None:
    """The leader process: lead, say so, wait to be killed."""
    url = sys.stdin.readline().strip()
    async with (
        multilock.connect_async(url) as locker,
        _leadership(locker, name) as lead,
    ):
        await lead.elected
        print("leading", flush=True)
        await asyncio.Event().wait()


def backend_urls(directory: str) -> dict[str, str]:
    """Every backend's URL: the servers from the shared environment variables."""
    servers = ("postgresql", "redis", "zookeeper", "etcd", "nats", "mysql")
    return {
        "memory": "memory://bench-takeover",
        "file": f"file://{directory}",
        **{backend: server_url(backend) for backend in servers},
    }


def measure(quick: bool) -> list[Row]:
    """Every reachable backend, one after the other."""
    rounds_left, rounds_killed = QUICK if quick else FULL
    rows = []
    with tempfile.TemporaryDirectory(prefix="multilock-bench-") as directory:
        for backend, url in backend_urls(directory).items():
            if not reachable(url):
                print(f"  {backend:<10} unreachable, left out", flush=True)
                continue
            kill = backend != "memory" and (not quick or backend in QUICK_KILLED)
            row = Row(
                backend,
                asyncio.run(left(url, rounds_left)),
                killed(url, rounds_killed) if kill else [],
            )
            print(f"  {backend:<10} left {_shown(row.left)}; killed {_shown(row.killed)}")
            rows.append(row)
    return rows


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 0.1 else f"{value:.2f} s"


def _shown(times: list[float]) -> str:
    if not times:
        return "not measured"
    median, most = statistics.median(times), max(times)
    return f"median {_seconds(median)}, max {_seconds(most)} ({len(times)})"


def table(rows: list[Row]) -> list[str]:
    """The Markdown table of ``rows``."""
    out = [
        "| backend | left: median | left: max | killed: median | killed: max |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [
            f"{_seconds(statistics.median(t))} | {_seconds(max(t))}" if t else "— | —"
            for t in (row.left, row.killed)
        ]
        out.append(f"| {row.backend} | {cells[0]} | {cells[1]} |")
    return out


def main() -> int:
    """Parse the command line, measure, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (CI)")
    parser.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(args.child))
        return 0
    print("\n".join(table(measure(args.quick))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
