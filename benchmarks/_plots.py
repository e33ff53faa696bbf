"""The PNG plots of ``docs/benchmarks.md`` (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, on machines without a display

import matplotlib.pyplot as plt
from _cycle import OURS

if TYPE_CHECKING:
    from _report import Results

__all__ = ["draw"]

_OURS_COLOUR, _OTHER_COLOUR = "tab:blue", "tab:gray"


def draw(results: Results, directory: Path) -> None:
    """Every plot there are figures for, as ``bench-<section>.png`` in ``directory``."""
    if results.cycles:
        _cycle(results, directory / "bench-cycle.png")
    if results.many:
        _many(results, directory / "bench-many.png")
    if any("error" not in row for row in results.scheduler):
        _scheduler(results, directory / "bench-scheduler.png")
    if results.contention_rows:
        _contention(results, directory / "bench-contention.png")


def _save(figure: Any, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _cycle(results: Results, path: Path) -> None:
    tables = results.cycles
    columns = 2
    rows = (len(tables) + 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(11, 2.6 * rows), squeeze=False)
    for ax, table in zip(axes.flat, tables, strict=False):
        variants = sorted(table.medians, key=table.medians.__getitem__)
        medians = [table.medians[v] for v in variants]
        colours = [_OURS_COLOUR if v == OURS else _OTHER_COLOUR for v in variants]
        ax.barh(variants, medians, color=colours)
        ax.set_xscale("log")  # peers can be tens of times slower than the rest
        ax.set_title(f"{table.backend}, {table.api}: median µs per cycle (log)", fontsize=10)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(tables) :]:
        ax.axis("off")
    _save(figure, path)


def _many(results: Results, path: Path) -> None:
    backends = sorted({row.backend for row in results.many})
    figure, axes = plt.subplots(1, len(backends), figsize=(5 * len(backends), 3.6), squeeze=False)
    for ax, backend in zip(axes.flat, backends, strict=True):
        rows = [row for row in results.many if row.backend == backend]
        sizes = [row.n for row in rows]
        ax.loglog(sizes, [r.ours_ms for r in rows], "o-", color=_OURS_COLOUR, label="multilock")
        in_a_row = [r for r in rows if r.raw_ms == r.raw_ms]  # not NaN: measured
        ax.loglog(
            [r.n for r in in_a_row],
            [r.raw_ms for r in in_a_row],
            "s--",
            color=_OTHER_COLOUR,
            label="raw, in a row",
        )
        ax.loglog(sizes, [r.batch_ms for r in rows], "^:", color="tab:gray", label="raw, one batch")
        ax.axhline(10 * rows[0].rtt_ms, color="tab:red", linestyle=":", label="10 round trips")
        ax.set_title(f"{backend}: time to take N locks", fontsize=10)
        ax.set_xlabel("N")
        ax.set_ylabel("ms")
        ax.legend(fontsize=8)
    _save(figure, path)


def _scheduler(results: Results, path: Path) -> None:
    rows = [row for row in results.scheduler if "error" not in row]
    figure, (late, cpu) = plt.subplots(1, 2, figsize=(10, 3.6))

    def key(row: dict[str, Any]) -> tuple[str, str, str]:
        return row["library"], row["backend"], row.get("phasing", "aligned")

    for library, backend, phasing in sorted({key(row) for row in rows}):
        points = sorted(
            (row for row in rows if key(row) == (library, backend, phasing)),
            key=lambda row: row["jobs"],
        )
        label = library if backend == "-" else f"{library} ({backend})"
        jobs = [row["jobs"] for row in points]
        dashes = "-" if phasing == "aligned" else "--"
        style = {"marker": "o", "linestyle": dashes, "label": f"{label}, {phasing}"}
        late.loglog(jobs, [max(row["p99_ms"], 0.01) for row in points], **style)
        cpu.semilogx(jobs, [row["cpu_per_wall"] for row in points], **style)
    late.axhline(5, color="tab:red", linestyle=":", label="5 ms target")
    late.set_title("p99 fire lateness (ms)", fontsize=10)
    cpu.set_title("CPU seconds per wall second", fontsize=10)
    for ax in (late, cpu):
        ax.set_xlabel("interval jobs firing every second")
        ax.legend(fontsize=8)
    _save(figure, path)


def _contention(results: Results, path: Path) -> None:
    rows = results.contention_rows
    figure, ax = plt.subplots(figsize=(7, 3))
    ax.bar([row.backend for row in rows], [row.per_second for row in rows], color=_OURS_COLOUR)
    ax.set_yscale("log")
    contenders = rows[0].contenders
    ax.set_title(f"exclusive sections per second, {contenders} contenders", fontsize=10)
    _save(figure, path)
