"""A scheduler run's cost in machine instructions, counted (not timed) under cachegrind.

    python benchmarks/run_cost.py                    # this tree
    python benchmarks/run_cost.py --tree A --tree B  # two checkouts side by side

On a shared host the CPU time of one scheduler run swings by 5-10 % from process to
process, more than most changes to the run's path are worth; the instructions it
executes do not. Each tree runs the same child twice under ``valgrind
--tool=cachegrind`` (Debian's ``valgrind``): 1,000 interval jobs spread over the
second on memory:// (``--aligned``: all due on the whole second, as one burst), a
:class:`~multilock.ManualClock` moved 5 ms at a time (virtual time: no idle, no timer),
once for ``--short`` and once for ``--long`` virtual seconds.
The difference of the two counts over the difference of their runs is the cost of one
run, start-up and shutdown cancelled out. Reported: instructions per run (the
harness's own loop turns included, alike in every tree) and each tree's ratio to the
first. A tree is a checkout of this repository, imported ahead of the installed one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta

JOBS = 1_000
STEP = 0.005  # virtual seconds per step: five runs due at each
TURNS = 3  # loop turns per step: enough for every due run to end


async def _child(seconds: float, aligned: bool) -> None:
    import multilock

    runs = 0

    async def job() -> None:
        nonlocal runs
        runs += 1

    clock = multilock.ManualClock(1_800_000_000.0)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    scheduler = multilock.Scheduler("memory://run-cost", metrics=False, clock=clock)
    for index in range(JOBS):
        start = epoch + timedelta(seconds=0 if aligned else index / JOBS)
        scheduler.add_job(job, multilock.every(seconds=1, start=start), name=f"cost-{index}")
    async with scheduler:
        for _ in range(round(seconds / STEP)):
            clock.advance(STEP)
            for _ in range(TURNS):
                await asyncio.sleep(0)
    print(f"runs={runs}")


def _count(tree: str | None, seconds: float, aligned: bool) -> tuple[int, int]:
    """(instructions, runs) of one child under cachegrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    done = subprocess.run(
        [
            "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
            sys.executable, __file__, "--child", str(seconds), *(["--aligned"] if aligned else []),
        ],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    refs = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    runs = re.search(r"runs=(\d+)", done.stdout)
    if refs is None or runs is None:
        raise SystemExit(f"cachegrind gave no count:\n{done.stderr[-2000:]}")
    return int(refs.group(1).replace(",", "")), int(runs.group(1))


def main() -> int:
    """The command line: every tree's instructions per run, or one child's runs."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tree", action="append", help="a checkout to measure (repeatable)")
    parser.add_argument("--short", type=float, default=2.0, help="virtual seconds, first run")
    parser.add_argument("--long", type=float, default=6.0, help="virtual seconds, second run")
    parser.add_argument("--aligned", action="store_true", help="every job due at once")
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        asyncio.run(_child(args.child, args.aligned))
        return 0
    if shutil.which("valgrind") is None:
        print("run_cost.py needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    first = None
    for tree in args.tree or [None]:
        short = _count(tree, args.short, args.aligned)
        long = _count(tree, args.long, args.aligned)
        per_run = (long[0] - short[0]) / (long[1] - short[1])
        first = first or per_run
        print(f"{tree or 'installed'}: {per_run:,.0f} instructions a run ({per_run / first:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
