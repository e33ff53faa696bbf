"""What the benchmarks share: server URLs, interleaved timing, percentiles, the command line.

A benchmark script (run as ``python benchmarks/<name>.py``, which puts this folder
on ``sys.path``) builds its variants -- zero-argument callables, or coroutine
functions for the async API -- and hands them to :func:`interleave` or
:func:`interleave_async`, which time every cycle in rounds of shuffled order, so
that drift in the machine's load lands on all variants alike.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import multilock
from multilock.backend import mask_url

__all__ = [
    "OURS",
    "RAW",
    "TARGETS",
    "AsyncCycle",
    "SyncCycle",
    "Table",
    "interleave",
    "interleave_async",
    "main",
    "optional",
    "p99",
    "reachable",
    "report",
    "server_url",
    "tooz_cycle",
]

SyncCycle = Callable[[], object]
AsyncCycle = Callable[[], Awaitable[object]]
Samples = dict[str, list[float]]
WARM_UP = 50
ROUND_BUDGET = 0.5  # seconds a variant may spend in one round
OURS, RAW = "multilock", "raw"
TARGETS = {"sync": 1.10, "async": 1.30}  # multilock's median over raw's, at most
_SERVERS = {
    "postgresql": ("MULTILOCK_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "redis": ("MULTILOCK_REDIS_URL", "redis://127.0.0.1:6379/15"),
    "zookeeper": ("MULTILOCK_ZOOKEEPER_URL", "zookeeper://127.0.0.1:2181/multilock-test"),
    "etcd": ("MULTILOCK_ETCD_URL", "etcd://127.0.0.1:2379/multilock-test"),
    "nats": ("MULTILOCK_NATS_URL", "nats://127.0.0.1:4222/multilock-test"),
    "mysql": ("MULTILOCK_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
}


def server_url(backend: str) -> str:
    """The URL of ``backend``'s server: its environment variable, or the local default
    (the same variables and defaults as the tests)."""
    variable, default = _SERVERS[backend]
    return os.environ.get(variable, default)


def reachable(url: str) -> bool:
    """Whether a lock can be taken and released at ``url`` right now."""
    try:
        with multilock.connect(url) as locker:
            lease = locker.try_acquire("bench-probe")
            if lease is not None:
                lease.release()
    except multilock.errors.MultilockError:
        return False
    return True


def interleave(variants: Mapping[str, SyncCycle], rounds: int, per_round: int) -> Samples:
    """Microseconds per cycle of each variant, after a warm-up of each.

    A variant stops its round early once it has used :data:`ROUND_BUDGET`: a peer
    thirty times slower than the rest would otherwise take most of the run.
    """
    clock = time.perf_counter_ns
    budget = ROUND_BUDGET * 1e9
    samples: Samples = {name: [] for name in variants}
    for cycle in variants.values():
        for _ in range(WARM_UP):
            cycle()
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            cycle, out = variants[name], samples[name]
            began = clock()
            for _ in range(per_round):
                start = clock()
                cycle()
                out.append((clock() - start) / 1000.0)
                if start - began > budget:
                    break
    return samples


async def interleave_async(
    variants: Mapping[str, AsyncCycle], rounds: int, per_round: int
) -> Samples:
    """:func:`interleave` for coroutine functions, awaited on the running loop."""
    clock = time.perf_counter_ns
    budget = ROUND_BUDGET * 1e9
    samples: Samples = {name: [] for name in variants}
    for cycle in variants.values():
        for _ in range(WARM_UP):
            await cycle()
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            cycle, out = variants[name], samples[name]
            began = clock()
            for _ in range(per_round):
                start = clock()
                await cycle()
                out.append((clock() - start) / 1000.0)
                if start - began > budget:
                    break
    return samples


def p99(values: list[float]) -> float:
    """The 99th percentile."""
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def optional(module: str) -> Any:
    """An installed peer library, or ``None`` (peers are the ``bench`` extras, not required)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def tooz_cycle(url: str, name: str, opened: list[Any]) -> SyncCycle | None:
    """A cycle of a tooz lock through the driver serving ``url`` (``None`` without tooz).

    The started coordinator is appended to ``opened``; the caller stops it.
    """
    coordination = optional("tooz.coordination")
    if coordination is None:
        return None
    coordinator = coordination.get_coordinator(url, f"bench-{name}".encode())
    coordinator.start()
    opened.append(coordinator)
    lock = coordinator.get_lock(name.encode())

    def cycle() -> None:
        assert lock.acquire(blocking=False), "the tooz benchmark lock is held elsewhere"
        lock.release()

    return cycle


@dataclass(frozen=True)
class Table:
    """One backend's cycle figures for one API: microseconds per variant."""

    backend: str
    api: str
    cycles: int  # timed cycles of the variant with the fewest
    medians: dict[str, float]
    p99s: dict[str, float]
    floor: str
    peers: tuple[str, ...]
    target: float

    @property
    def ratio(self) -> float:
        """multilock's median over raw's."""
        return self.medians[OURS] / self.medians[RAW]

    @property
    def p99_ratio(self) -> float:
        """multilock's p99 over raw's."""
        return self.p99s[OURS] / self.p99s[RAW]

    @property
    def slower_than(self) -> list[str]:
        """The peers whose median is not above multilock's."""
        return [peer for peer in self.peers if self.medians[peer] <= self.medians[OURS]]

    @property
    def met(self) -> bool:
        """Within the target ratio to raw, and ahead of every peer."""
        return self.ratio <= self.target and not self.slower_than


def report(
    backend: str,
    api: str,
    samples: Samples,
    *,
    floor: str,
    target: float,
    not_peers: Collection[str] = (),
) -> Table:
    """Print one API's table (sorted by median, relative to raw) and return its figures.

    Every variant but multilock, raw, the round-trip ``floor`` and ``not_peers``
    counts as a peer that multilock must be ahead of.
    """
    table = Table(
        backend=backend,
        api=api,
        cycles=min(len(values) for values in samples.values()),
        medians={variant: statistics.median(values) for variant, values in samples.items()},
        p99s={variant: p99(values) for variant, values in samples.items()},
        floor=floor,
        peers=tuple(v for v in samples if v not in {OURS, RAW, floor, *not_peers}),
        target=target,
    )
    medians = table.medians
    print(f"\n{backend} {api} API (at least {table.cycles} cycles per variant)")
    print(f"  {'variant':<20} {'median µs':>10} {'p99 µs':>10} {'vs raw':>8}")
    for variant in sorted(samples, key=medians.__getitem__):
        print(
            f"  {variant:<20} {medians[variant]:>10.1f} {table.p99s[variant]:>10.1f}"
            f" {medians[variant] / medians[RAW]:>7.2f}x"
        )
    slower = table.slower_than
    print(
        f"  multilock/raw: median {table.ratio:.3f}x, p99 {table.p99_ratio:.3f}x"
        f" (target {target:.2f}x); raw cycle = {medians[RAW] / medians[floor]:.2f} x {floor};"
        + (f" slower than {', '.join(slower)}" if slower else " ahead of every peer")
        + (" -- meets the targets" if table.met else " -- MISSES a target")
    )
    return table


def main(
    doc: str,
    url: str,
    run: Callable[[str, int, int], object],
    *,
    quick: tuple[int, int],
    full: tuple[int, int],
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
