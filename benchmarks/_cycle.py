"""What the cycle benchmarks share: interleaved timing, percentiles and the command line.

A benchmark script (run as ``python benchmarks/<name>.py``, which puts this folder
on ``sys.path``) builds its variants -- zero-argument callables, or coroutine
functions for the async API -- and hands them to :func:`interleave` or
:func:`interleave_async`, which time every cycle in rounds of shuffled order, so
that drift in the machine's load lands on all variants alike.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping

import multilock
from multilock.backend import mask_url

__all__ = ["AsyncCycle", "SyncCycle", "interleave", "interleave_async", "main", "p99"]

SyncCycle = Callable[[], object]
AsyncCycle = Callable[[], Awaitable[object]]
Samples = dict[str, list[float]]
WARM_UP = 50


def interleave(variants: Mapping[str, SyncCycle], rounds: int, per_round: int) -> Samples:
    """Microseconds per cycle of each variant, after a warm-up of each."""
    clock = time.perf_counter_ns
    samples: Samples = {name: [] for name in variants}
    for cycle in variants.values():
        for _ in range(WARM_UP):
            cycle()
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            cycle, out = variants[name], samples[name]
            for _ in range(per_round):
                start = clock()
                cycle()
                out.append((clock() - start) / 1000.0)
    return samples


async def interleave_async(
    variants: Mapping[str, AsyncCycle], rounds: int, per_round: int
) -> Samples:
    """:func:`interleave` for coroutine functions, awaited on the running loop."""
    clock = time.perf_counter_ns
    samples: Samples = {name: [] for name in variants}
    for cycle in variants.values():
        for _ in range(WARM_UP):
            await cycle()
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            cycle, out = variants[name], samples[name]
            for _ in range(per_round):
                start = clock()
                await cycle()
                out.append((clock() - start) / 1000.0)
    return samples


def p99(values: list[float]) -> float:
    """The 99th percentile."""
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def main(
    doc: str,
    url: str,
    run: Callable[[str, int, int], object],
    *,
    quick: tuple[int, int] = (5, 100),
    full: tuple[int, int] = (40, 500),
) -> int:
    """Parse ``--quick``/``--rounds``/``--per-round``, then ``run(url, rounds, per_round)``.

    The exit status is 0, or 2 when the backend could not be reached.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--rounds", type=int, help="rounds of interleaved variants")
    parser.add_argument("--per-round", type=int, help="cycles per variant per round")
    args = parser.parse_args()
    default_rounds, default_per_round = quick if args.quick else full
    rounds = args.rounds or default_rounds
    per_round = args.per_round or default_per_round
    print(f"cycle benchmark against {mask_url(url)}")
    print(f"{rounds} rounds x {per_round} cycles per variant, variants interleaved")
    try:
        run(url, rounds, per_round)
    except multilock.errors.BackendUnavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    return 0
