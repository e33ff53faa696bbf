"""Scheduler start-up: 100,000 registered jobs, multilock beside APScheduler 3.

    python benchmarks/scheduler_startup.py                  # 100,000 jobs, 3 runs each
    python benchmarks/scheduler_startup.py --quick          # CI smoke: 2,000 jobs, 1 run
    python benchmarks/scheduler_startup.py --json out.json  # also write the figures

A registry as large services have: 95 % daily crons (``M H * * *``, every minute
of the day used: 1,440 distinct expressions) and 5 % intervals (1 to 60 minutes).
Each run is a fresh child process, multilock (on memory://) and APScheduler's
AsyncIOScheduler alternating: construct the scheduler, add the jobs, start it --
ready once ``start()`` has returned, every job's first fire time computed.
Reported: the seconds of each phase and their total, the peak RSS of the process
(VmHWM) and its steady RSS (VmRSS one second after start, the scheduler running).
Of each library's runs, the one with the median total is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

JOBS = 100_000
QUICK_JOBS = 2_000
REPEATS = 3
LIBS = ("multilock", "apscheduler")
SETTLE = 1.0  # seconds running before the steady RSS is read


def _schedule(index: int) -> tuple[str, int, int]:
    """Job ``index``'s schedule: ``("cron", minute, hour)`` or ``("interval", minutes, 0)``."""
    if index % 20 == 19:
        return "interval", 1 + index % 60, 0
    return "cron", index % 60, (index // 60) % 24


def _memory_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _child_multilock(jobs: int) -> dict[str, float]:
    import multilock

    async def job() -> None:
        pass

    began = time.perf_counter()
    scheduler = multilock.Scheduler("memory://", metrics=False, probe_interval=None)
    built = time.perf_counter()
    for index in range(jobs):
        kind, a, b = _schedule(index)
        trigger = multilock.cron(f"{a} {b} * * *") if kind == "cron" else multilock.every(minutes=a)
        scheduler.add_job(job, trigger, name=f"job-{index}")
    added = time.perf_counter()
    await scheduler.start()
    ready = time.perf_counter()
    try:
        await asyncio.sleep(SETTLE)
        return _figures(began, built, added, ready)
    finally:
        await scheduler.stop()


async def _child_apscheduler(jobs: int) -> dict[str, float]:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    async def job() -> None:
        pass

    began = time.perf_counter()
    scheduler = AsyncIOScheduler(timezone="UTC")
    built = time.perf_counter()
    for index in range(jobs):
        kind, a, b = _schedule(index)
        trigger = (
            CronTrigger(minute=a, hour=b, timezone="UTC")
            if kind == "cron"
            else IntervalTrigger(minutes=a, timezone="UTC")
        )
        scheduler.add_job(job, trigger, id=f"job-{index}")
    added = time.perf_counter()
    scheduler.start()  # adds the pending jobs: each one's first fire time is computed here
    ready = time.perf_counter()
    try:
        await asyncio.sleep(SETTLE)
        return _figures(began, built, added, ready)
    finally:
        scheduler.shutdown(wait=False)


def _figures(began: float, built: float, added: float, ready: float) -> dict[str, float]:
    return {
        "construct_s": built - began,
        "add_s": added - built,
        "start_s": ready - added,
        "total_s": ready - began,
        "peak_rss_mb": _memory_mb("VmHWM"),
        "steady_rss_mb": _memory_mb("VmRSS"),
    }


def _run_child(lib: str, jobs: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", lib, "--jobs", str(jobs)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(jobs: int, repeats: int) -> list[dict[str, Any]]:
    """``repeats`` runs of each library, alternating; a row each: the median run by total
    time (or an error), with every run's total."""
    print(
        f"{'library':<12} {'jobs':>7} {'construct s':>11} {'add s':>7} {'start s':>8}"
        f" {'total s':>8} {'peak MB':>8} {'steady MB':>9}"
    )
    runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib in LIBS}
    for _ in range(repeats):
        for lib in LIBS:
            result = _run_child(lib, jobs)
            runs[lib].append(result)
            if "error" in result:
                print(f"{lib:<12} {jobs:>7} error: {result['error']}", flush=True)
            else:
                print(
                    f"{lib:<12} {jobs:>7} {result['construct_s']:>11.3f} {result['add_s']:>7.2f}"
                    f" {result['start_s']:>8.2f} {result['total_s']:>8.2f}"
                    f" {result['peak_rss_mb']:>8.1f} {result['steady_rss_mb']:>9.1f}",
                    flush=True,
                )
    rows = []
    for lib in LIBS:
        failed = [run for run in runs[lib] if "error" in run]
        if failed:
            rows.append({"library": lib, "jobs": jobs, **failed[0]})
            continue
        ranked = sorted(runs[lib], key=lambda run: run["total_s"])
        totals = [run["total_s"] for run in runs[lib]]
        rows.append({"library": lib, "jobs": jobs, **ranked[len(ranked) // 2], "totals": totals})
    return rows


def main() -> int:
    """The command line: the parent's plan, or one child's measurement."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke: small, one run each")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--child", choices=LIBS, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        run = _child_multilock if args.child == "multilock" else _child_apscheduler
        print(json.dumps(asyncio.run(run(args.jobs or JOBS))))
        return 0

    jobs = args.jobs or (QUICK_JOBS if args.quick else JOBS)
    repeats = args.repeats or (1 if args.quick else REPEATS)
    rows = measure(jobs, repeats)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows}, fh, indent=2)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
