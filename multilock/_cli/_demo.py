"""``multilock demo``: replica processes race for the same jobs; watch exactly-once hold."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from .._locks.registry import connect
from .._url import mask_url
from ._app import EXIT_FAILURE, cli, fail, handle_errors

JOBS = ("nightly-reindex", "send-digest")
STARTUP = 3.0  # seconds for the replicas to import and connect before the first tick


@dataclass
class _Tick:
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _offsets(replicas: int, skew: float) -> list[float]:
    """Clock offsets spread evenly over [-skew, +skew]: early, on time and late replicas."""
    if replicas == 1:
        return [0.0]
    return [-skew + 2 * skew * i / (replicas - 1) for i in range(replicas)]


def _read(directory: Path) -> dict[tuple[str, float], _Tick]:
    ticks: dict[tuple[str, float], _Tick] = defaultdict(_Tick)
    for path in sorted(directory.glob("replica-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4:
                continue  # a line being written right now
            outcome, job, fire, replica = parts
            tick = ticks[(job, round(float(fire), 3))]
            (tick.ran if outcome == "ran" else tick.skipped).append(replica)
    return ticks


@cli.command()
@click.option("--replicas", default=3, show_default=True, type=click.IntRange(1, 16))
@click.option("--lock", "lock_url", default=None, help="lock URL (default: file:// in a temp dir)")
@click.option("--seconds", default=20, show_default=True, type=click.IntRange(1, 3600))
@click.option(
    "--skew",
    default=250,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="clock offsets of the replicas spread over ±SKEW milliseconds",
)
@click.option(
    "--skew-tolerance",
    default=350,
    show_default=True,
    type=click.IntRange(1, 499),
    help="the schedulers' skew_tolerance in milliseconds: how far any replica's clock may be"
    " from true time (misfire_grace is 200 ms)",
)
@click.option("--naive", is_flag=True, help="the plain lock-while-running pattern instead")
@handle_errors
def demo(
    replicas: int,
    lock_url: str | None,
    seconds: int,
    skew: int,
    skew_tolerance: int,
    naive: bool,
) -> None:
    """Start replica processes running the same jobs every second and show who ran each tick.

    With the default skew the replicas' clocks disagree by up to half a second
    (±250 ms, within the ±350 ms tolerance), yet every tick runs exactly once.
    --naive holds the lock only while the job runs (the usual recipe) and shows
    the duplicates a late replica causes.
    """
    console = Console(highlight=False, soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="multilock-demo-") as tmp:
        directory = Path(tmp)
        url = lock_url or f"file://{directory / 'locks'}"
        with connect(url) as locker:  # a bad URL or a server that is down: say so now
            locker.try_acquire("multilock-demo-probe")
        start = math.ceil(time.time() + STARTUP)
        offsets = _offsets(replicas, skew / 1000)
        children = [
            _start_replica(directory, url, index, offset, start, seconds, skew_tolerance, naive)
            for index, offset in enumerate(offsets, 1)
        ]
        pattern = "lock held only while running (naive)" if naive else "multilock scheduler"
        console.print(f"[bold]{replicas} replicas[/bold], {pattern}, lock {escape(mask_url(url))}")
        console.print(
            "clock offsets: "
            + ", ".join(f"r{i} {o * 1000:+.0f} ms" for i, o in enumerate(offsets, 1))
            + f"; skew tolerance {skew_tolerance} ms"
        )
        console.print(f"{'tick':<10} {'job':<16} {'ran on':<14} skipped on")
        shown: set[tuple[str, float]] = set()
        try:
            ended = False
            while not ended:
                ended = all(child.poll() is not None for child in children)
                settle = (skew / 1000) + 2 * skew_tolerance / 1000 + 0.7
                ticks = _read(directory)
                for key in sorted(ticks, key=lambda k: (k[1], k[0])):
                    if key in shown or (not ended and time.time() < key[1] + settle):
                        continue
                    shown.add(key)
                    _row(console, key, ticks[key])
                time.sleep(0.1)
        except KeyboardInterrupt:
            for child in children:
                child.terminate()
            raise
        failed = [index for index, child in enumerate(children, 1) if child.returncode != 0]
        summary = _summary(_read(directory), start, seconds)
        why = _last_line(directory / f"replica-{failed[0]}.err") if failed else ""
    console.print(summary)
    if failed:
        names = ", ".join(f"r{index}" for index in failed)
        fail(f"replica {names} failed: {why or 'no message'}", EXIT_FAILURE)


def _start_replica(
    directory: Path,
    url: str,
    index: int,
    offset: float,
    start: int,
    seconds: int,
    skew_tolerance: int,
    naive: bool,
) -> subprocess.Popen[bytes]:
    """One replica process; it reads the URL from a pipe, never from argv or environ."""
    command = [sys.executable, "-m", "multilock._cli._replica", "--id", f"r{index}"]
    command += ["--offset", str(offset), "--start", str(start), "--seconds", str(seconds)]
    command += ["--record", str(directory / f"replica-{index}.log")]
    command += ["--skew-tolerance", str(skew_tolerance / 1000)]
    command += ["--naive", *JOBS] if naive else list(JOBS)
    reading, writing = os.pipe()
    try:
        with os.fdopen(writing, "w", encoding="utf-8") as pipe:
            pipe.write(url)  # far below a pipe's buffer: written before the child reads
        with (directory / f"replica-{index}.err").open("wb") as errors:
            return subprocess.Popen(
                [*command, "--lock-fd", str(reading)],
                stdin=subprocess.DEVNULL,
                stderr=errors,  # reported as one line if the replica fails
                pass_fds=(reading,),
            )
    finally:
        os.close(reading)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _row(console: Console, key: tuple[str, float], tick: _Tick) -> None:
    job, fire = key
    when = time.strftime("%H:%M:%S", time.localtime(fire))
    ran = ", ".join(sorted(tick.ran)) or "-"
    style = "red" if len(tick.ran) > 1 else ("yellow" if not tick.ran else "green")
    mark = "  DUPLICATE" if len(tick.ran) > 1 else ("  MISSED" if not tick.ran else "")
    skipped = ", ".join(sorted(tick.skipped)) or "-"
    console.print(f"{when:<10} {job:<16} [{style}]{ran:<14}[/{style}] {skipped}{mark}")


def _summary(ticks: dict[tuple[str, float], _Tick], start: int, seconds: int) -> str:
    expected = [(job, float(start + k)) for k in range(seconds) for job in JOBS]
    runs = sum(len(ticks[key].ran) for key in expected if key in ticks)
    duplicates = sum(max(0, len(ticks[key].ran) - 1) for key in expected if key in ticks)
    missed = sum(1 for key in expected if key not in ticks or not ticks[key].ran)
    return f"{len(expected)} ticks, {runs} runs, {duplicates} duplicates, {missed} missed"
