"""Scheduler load: N interval jobs firing every second, multilock beside APScheduler 3.

    python benchmarks/scheduler_load.py                 # 100, 1,000, 10,000 jobs, 20 s each
    python benchmarks/scheduler_load.py --quick         # CI smoke: 100 jobs, 3 s
    python benchmarks/scheduler_load.py --json out.json # also write the figures

Each configuration runs in a fresh child process (so peak RSS and CPU are its
own), one after the other in the same run: multilock on memory:// (and on
PostgreSQL at 1,000 jobs when a server answers), and APScheduler 3.x's
AsyncIOScheduler with the same async job, and the floor: bare asyncio, which
creates one task per job when it is due and does nothing else (no trigger, no
lock, no bookkeeping): no scheduler on this event loop can start a body sooner.

Two phasings of the same N jobs, each measured: ``aligned``, every job due on the
whole second (lateness then measures throughput: the last job of a tick starts
after the other N - 1), and ``spread``, job i due at i/N past each second, as jobs
given their own start (or a jitter) are (lateness then measures how promptly the
scheduler wakes for each job). A job records how late it started against its
fire time: multilock reports it exactly (``current_run().fire_time``); the others'
jobs know their phase, and their lateness is the time past it.
Reported: lateness p50/p99/max, CPU seconds per wall second, peak RSS, and the full
(oldest-generation) garbage collections during the window.

With ``BENCH_GC_FREEZE=1`` in the environment, every child calls ``gc.freeze()`` once
warmed up: the full collections then trace only what was made since, which separates
their share of the lateness from the scheduler's own work (not how the figures of
docs/benchmarks.md's targets are measured: those take the collector as Python sets it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _cycle import reachable, server_url

WARMUP = 2.0
SIZES = (100, 1_000, 10_000)
PHASINGS = ("aligned", "spread")
COMPARED = 1_000  # jobs: multilock and APScheduler run REPEATS times each, alternating
REPEATS = 3
QUICK_SIZES = (100,)
PG_JOBS = 1_000


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _measure(lateness: list[float], started: float, cpu0: float, full0: int) -> dict[str, float]:
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "runs": len(lateness),
        "p50_ms": _percentile(lateness, 0.50) * 1000,
        "p99_ms": _percentile(lateness, 0.99) * 1000,
        "max_ms": max(lateness, default=math.nan) * 1000,
        "cpu_per_wall": (usage.ru_utime + usage.ru_stime - cpu0) / wall,
        "peak_rss_mb": _peak_rss_mb(usage),
        # Full (oldest-generation) collections in the window: each pauses the loop for a
        # scan of every tracked object, the usual cause of a lateness tail.
        "full_gc": _full_collections() - full0,
    }


def _full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


def _peak_rss_mb(usage: resource.struct_rusage) -> float:
    # ru_maxrss survives exec on Linux (a child started by a big parent reports the
    # parent's peak); VmHWM belongs to this process's own memory map.
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return usage.ru_maxrss / 1024


def _phase(index: int, jobs: int, phasing: str) -> float:
    """Seconds past each whole second at which job ``index`` of ``jobs`` is due."""
    return index / jobs if phasing == "spread" else 0.0


def _late(now: float, phase: float) -> float:
    """How long after its last due time (``phase`` past a whole second) ``now`` is;
    slightly early reads as slightly negative."""
    return (now - phase + 0.5) % 1.0 - 0.5


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Recorder:
    """The lateness of the runs that start while recording is on."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self.on = False

    async def measure(self, seconds: float) -> dict[str, float]:
        """Warm up, then record for ``seconds``; the figures of that window."""
        await asyncio.sleep(WARMUP)
        if os.environ.get("BENCH_GC_FREEZE") == "1":
            gc.freeze()
        self.on = True
        started, cpu0, full0 = time.monotonic(), _cpu(), _full_collections()
        await asyncio.sleep(seconds)
        self.on = False
        return _measure(self.lateness, started, cpu0, full0)


async def _child_multilock(jobs: int, seconds: float, lock: str, phasing: str) -> dict[str, float]:
    import multilock

    recorder = _Recorder()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    async def job() -> None:
        if recorder.on:
            fire = multilock.current_run().fire_time.timestamp()
            recorder.lateness.append(time.time() - fire)

    scheduler = multilock.Scheduler(lock, metrics=False)  # grace: the default 0.25 s
    for index in range(jobs):
        start = epoch + timedelta(seconds=_phase(index, jobs, phasing))
        trigger = multilock.every(seconds=1, start=start)
        scheduler.add_job(job, trigger, name=f"bench-{os.getpid()}-{index}")
    async with scheduler:
        return await recorder.measure(seconds)


async def _child_apscheduler(jobs: int, seconds: float, phasing: str) -> dict[str, float]:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    recorder = _Recorder()

    async def job(phase: float) -> None:
        if recorder.on:
            recorder.lateness.append(_late(time.time(), phase))

    scheduler = AsyncIOScheduler(timezone="UTC")
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    for index in range(jobs):
        phase = _phase(index, jobs, phasing)
        scheduler.add_job(
            job, "interval", seconds=1, start_date=start + timedelta(seconds=phase),
            args=(phase,), id=f"bench-{index}",
            misfire_grace_time=1, coalesce=True, max_instances=1,
        )  # fmt: skip
    scheduler.start()
    try:
        return await recorder.measure(seconds)
    finally:
        scheduler.shutdown(wait=False)


async def _child_floor(jobs: int, seconds: float, phasing: str) -> dict[str, float]:
    recorder = _Recorder()
    loop = asyncio.get_running_loop()

    async def job(phase: float) -> None:
        if recorder.on:
            recorder.lateness.append(_late(time.time(), phase))

    running: set[asyncio.Task[None]] = set()  # a reference each, as asyncio asks
    phases = sorted({_phase(index, jobs, phasing) for index in range(jobs)})
    per_phase = jobs // len(phases)

    def arm(phase: float) -> None:
        now = time.time()
        due = math.floor(now - phase) + 1 + phase
        loop.call_later(due - now, fire, phase)

    def fire(phase: float) -> None:
        for _ in range(per_phase):
            task = loop.create_task(job(phase))
            running.add(task)
            task.add_done_callback(running.discard)
        arm(phase)

    for phase in phases:
        arm(phase)
    return await recorder.measure(seconds)


def _run_child(lib: str, jobs: int, seconds: float, lock: str, phasing: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", lib, "--jobs", str(jobs)]
    command += ["--seconds", str(seconds), "--lock", lock, "--phasing", phasing]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(
    sizes: tuple[int, ...], seconds: float, *, postgres: bool, pg_jobs: int | None = None
) -> list[dict[str, Any]]:
    """Each size and phasing on memory:// and under APScheduler and the floor (and
    ``pg_jobs``, default 1,000, on PostgreSQL when ``postgres`` and a server
    answers), one child process after the other; a row each."""
    pg = server_url("postgresql")
    on_pg = postgres and reachable(pg)
    repeats = REPEATS if COMPARED in sizes and seconds >= 10 else 1
    header = f"{'library':<13} {'backend':<11} {'phasing':<8} {'jobs':>6} {'runs':>7}"
    header += f" {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu/wall':>9} {'rss MB':>7}"
    header += f" {'full gc':>7}"
    print(header)
    rows = []
    for phasing in PHASINGS:
        for jobs in sizes:
            # Where the targets are compared, one run's CPU swings by 10-30 % on this
            # shared machine: multilock and APScheduler alternate, and the run with the
            # median CPU of each is kept (every run is printed).
            pair = [("multilock", "memory://"), ("apscheduler", "-")]
            runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib, _ in pair}
            for _ in range(repeats if jobs == COMPARED else 1):
                for lib, lock in pair:
                    runs[lib].append(_child_row(lib, jobs, seconds, lock, phasing))
            rows += [_median_run(runs[lib]) for lib, _ in pair]
            rows.append(_child_row("asyncio-floor", jobs, seconds, "-", phasing))
        if on_pg:
            rows.append(_child_row("multilock", pg_jobs or PG_JOBS, seconds, pg, phasing))
    return rows


def _child_row(lib: str, jobs: int, seconds: float, lock: str, phasing: str) -> dict[str, Any]:
    """One child's measurement as a row, printed as it comes."""
    result = _run_child(lib, jobs, seconds, lock, phasing)
    backend = lock.split("://")[0] if lib == "multilock" else "-"
    row = {"library": lib, "backend": backend, "phasing": phasing, "jobs": jobs, **result}
    what = f"{lib:<13} {backend:<11} {phasing:<8} {jobs:>6}"
    if "error" in result:
        print(f"{what} error: {result['error']}")
    else:
        print(
            f"{what} {result['runs']:>7} {result['p50_ms']:>8.2f}"
            f" {result['p99_ms']:>8.2f} {result['max_ms']:>8.2f}"
            f" {result['cpu_per_wall']:>9.3f} {result['peak_rss_mb']:>7.1f}"
            f" {result['full_gc']:>7}",
            flush=True,
        )
    return row


def _median_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median CPU (an error, if any run failed), with every run's CPU."""
    failed = [row for row in rows if "error" in row]
    if failed:
        return failed[0]
    ranked = sorted(rows, key=lambda row: row["cpu_per_wall"])
    return {**ranked[len(ranked) // 2], "cpu_runs": [row["cpu_per_wall"] for row in rows]}


def main() -> int:
    """The command line: the parent's plan, or one child's measurement."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke: small and short")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument(
        "--child", choices=["multilock", "apscheduler", "asyncio-floor"], help=argparse.SUPPRESS
    )
    parser.add_argument("--jobs", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--lock", default="memory://", help=argparse.SUPPRESS)
    parser.add_argument("--phasing", choices=PHASINGS, default="aligned", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        seconds = args.seconds or 20.0
        if args.child == "multilock":
            result = asyncio.run(_child_multilock(args.jobs, seconds, args.lock, args.phasing))
        elif args.child == "apscheduler":
            result = asyncio.run(_child_apscheduler(args.jobs, seconds, args.phasing))
        else:
            result = asyncio.run(_child_floor(args.jobs, seconds, args.phasing))
        print(json.dumps(result))
        return 0

    seconds = args.seconds or (3.0 if args.quick else 20.0)
    rows = measure(QUICK_SIZES if args.quick else SIZES, seconds, postgres=not args.quick)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seconds": seconds, "rows": rows}, fh, indent=2)
    failed = [row for row in rows if "error" in row]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
