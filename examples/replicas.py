"""Several replicas race for the same job every tick; exactly one runs it.

    python examples/replicas.py                  # 5 replicas, 5 ticks, 1 s apart
    python examples/replicas.py --replicas 8 --ticks 10 --interval 0.5

Each replica is a separate process on the embedded ``file://`` backend (a temp
directory). All of them compute the same fire times; each fires a little late, as
replicas with skewed clocks do. The one whose ``try_acquire`` wins runs the job and
keeps the lease until ``fire time + skew tolerance``, so a replica that fires late
finds the tick taken instead of running it again. The job appends to a shared log,
and the summary counts that log: what ran, not what the replicas claim.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from queue import Queue

import multilock

JOB = "nightly-report"


def sleep_until(deadline: float) -> None:
    """Sleep until the wall clock reads ``deadline``."""
    while (left := deadline - time.time()) > 0:
        time.sleep(min(left, 0.05))


def replica(index: int, args: argparse.Namespace) -> None:
    """One replica: every tick, fire (late by up to ``--skew``) and try to run the job."""
    rng = random.Random(os.getpid())
    # A replica runs a tick only up to `grace` after its fire time, and the winner holds
    # the lease until fire + tolerance: with tolerance >= skew nobody can run it twice.
    grace = max(args.tolerance, args.skew)
    with multilock.connect(f"file://{args.dir}/locks") as locker:
        print("ready", flush=True)
        start = float(sys.stdin.readline())  # the same first fire time for every replica
        for tick in range(args.ticks):
            fire = start + tick * args.interval
            sleep_until(fire + rng.uniform(0, args.skew))
            outcome = _run_tick(locker, tick, index, fire, grace, args)
            print(json.dumps({"tick": tick, "replica": index, "outcome": outcome}), flush=True)


def _run_tick(
    locker: multilock.DistributedLock,
    tick: int,
    index: int,
    fire: float,
    grace: float,
    args: argparse.Namespace,
) -> str:
    if time.time() > fire + grace:
        return "late"  # a misfire: too late for this tick
    lease = locker.try_acquire(JOB)
    if lease is None:
        return "skipped"
    with lease:
        if time.time() >= fire + grace:
            return "late"  # won only after the tick's holder let go: it has run
        with open(Path(args.dir) / "job.log", "a") as log:  # the job
            log.write(f"{tick} {index}\n")
        # Keep the tick's lease until late replicas have given up on it.
        sleep_until(fire + args.tolerance)
    return "ran"


def _read_reports(proc: subprocess.Popen[str], reports: Queue[dict[str, object]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        reports.put(json.loads(line))


def main(args: argparse.Namespace) -> int:
    """Start the replicas, print who ran each tick, then the summary; 1 if not exactly once."""
    with tempfile.TemporaryDirectory(prefix="multilock-demo-") as directory:
        common = [
            f"--dir={directory}",
            f"--ticks={args.ticks}",
            f"--interval={args.interval}",
            f"--skew={args.skew}",
            f"--tolerance={args.tolerance}",
        ]
        print(
            f"{args.replicas} replicas, one job ({JOB!r}) every {args.interval:g}s on file://,"
            f" clocks up to {args.skew * 1000:.0f} ms late, lease kept"
            f" {args.tolerance * 1000:.0f} ms past each fire time"
        )
        reports: Queue[dict[str, object]] = Queue()
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, f"--replica={i}", *common],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(1, args.replicas + 1)
        ]
        # Start the clock once every replica is up: a slow start must not look like a miss.
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a replica failed to start")
        start = time.time() + 0.2
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n")
            proc.stdin.close()
        readers = [threading.Thread(target=_read_reports, args=(p, reports)) for p in procs]
        for reader in readers:
            reader.start()
        by_tick: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for _ in range(args.ticks * args.replicas):
            report = reports.get(timeout=args.ticks * args.interval + 30)
            tick = int(str(report["tick"]))
            outcomes = by_tick[tick]
            outcomes[str(report["outcome"])].append(int(str(report["replica"])))
            if sum(len(v) for v in outcomes.values()) == args.replicas:
                line = "  ".join(
                    f"{kind}: {' '.join(f'replica-{r}' for r in sorted(outcomes[kind]))}"
                    for kind in ("ran", "skipped", "late")
                    if outcomes[kind]
                )
                counts = " ".join(f"{k}={len(outcomes[k])}" for k in ("ran", "skipped"))
                print(f"tick {tick + 1}: {line}  ({counts})", flush=True)
        failed = [p.wait() for p in procs]
        for reader in readers:
            reader.join()
        runs: dict[int, int] = defaultdict(int)
        log = Path(directory) / "job.log"
        for entry in log.read_text().splitlines() if log.exists() else []:
            runs[int(entry.split()[0])] += 1
    duplicates = sum(n - 1 for n in runs.values() if n > 1)
    missed = sum(1 for tick in range(args.ticks) if runs[tick] == 0)
    total = sum(runs.values())
    print(f"{args.ticks} ticks, {total} runs, {duplicates} duplicates, {missed} missed")
    return 1 if duplicates or missed or any(failed) else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=5, help="replica processes (5)")
    parser.add_argument("--ticks", type=int, default=5, help="fire times to run (5)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between ticks (1)")
    parser.add_argument("--skew", type=float, default=0.2, help="max lateness of a replica (0.2)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.4,
        help="lease kept past the fire time (0.4); below --skew, late replicas rerun ticks",
    )
    parser.add_argument("--replica", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    options = _parser().parse_args()
    if not (0 <= options.skew < options.interval / 2 and 0 <= options.tolerance < options.interval):
        _parser().error("need 0 <= --skew < --interval/2 and 0 <= --tolerance < --interval")
    if options.replicas < 1 or options.ticks < 1:
        _parser().error("--replicas and --ticks must be at least 1")
    if options.replica is not None:
        replica(options.replica, options)
    else:
        sys.exit(main(options))
