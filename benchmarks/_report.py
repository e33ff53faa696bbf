"""What ``benchmarks/run.py`` writes: the results, the targets, the document and the plots."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _cycle import OURS, RAW, Table
from connections import Row as ConnectionRow
from contention import Row as ContentionRow
from many_locks import TARGET_RTTS
from many_locks import Row as ManyRow
from profile_cycle import Row as ProfileRow
from profile_cycle import write as write_profile
from takeover import Row as TakeoverRow
from takeover import table as takeover_table
from tick_claims import Row as ClaimRow
from tick_claims import table as claims_table

__all__ = ["Results", "write"]

LATENESS_P99_MS = 5.0
SCHEDULER_JOBS = 1_000
SCALE_JOBS = 10_000  # spread: issue 18's targets, against APScheduler's own figures
MANY_N = (1_000, 10_000)


@dataclass
class Results:
    """Everything one run measured (a section not run leaves its part empty)."""

    quick: bool
    command: str
    machine: dict[str, str] = field(default_factory=dict)
    cycles: list[Table] = field(default_factory=list)
    many: list[ManyRow] = field(default_factory=list)
    many_delayed: list[ManyRow] = field(default_factory=list)  # through the delaying proxy
    many_delay_ms: float = 0.0  # that proxy's one-way delay
    scheduler: list[dict[str, Any]] = field(default_factory=list)
    scheduler_seconds: float = 0.0
    startup: list[dict[str, Any]] = field(default_factory=list)  # 100,000 registered jobs
    contention_rows: list[ContentionRow] = field(default_factory=list)
    connection_rows: list[ConnectionRow] = field(default_factory=list)
    takeover_rows: list[TakeoverRow] = field(default_factory=list)
    profile_rows: list[ProfileRow] = field(default_factory=list)
    claim_rows: list[ClaimRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    wall_seconds: float = 0.0


@dataclass(frozen=True)
class _Check:
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


def _checks(results: Results) -> list[_Check]:
    checks: list[_Check] = []
    for table in results.cycles:
        checks.append(
            _Check(
                f"cycle {table.backend} {table.api}: median <= {table.target:.2f}x raw",
                f"{table.ratio:.2f}x",
                table.ratio <= table.target,
            )
        )
        if table.peers:
            slower = table.slower_than
            checks.append(
                _Check(
                    f"cycle {table.backend} {table.api}: ahead of every peer",
                    f"behind {', '.join(slower)}" if slower else "ahead of all",
                    not slower,
                )
            )
    link = f"{results.many_delay_ms:g} ms each way"
    for where, many in (("loopback", results.many), (link, results.many_delayed)):
        for backend in sorted({row.backend for row in many}):
            for n in MANY_N:
                row = next((r for r in many if r.backend == backend and r.n == n), None)
                checks.append(
                    _Check(
                        f"{n} locks on {backend} in < {TARGET_RTTS:.0f} round trips ({where})",
                        f"{row.ours_rtts:.1f} RTT ({row.ours_ms:.2f} ms; one raw batch"
                        f" {row.batch_ms / row.rtt_ms:.1f} RTT, the server's own work in it"
                        f" {row.server_ms / row.rtt_ms:.1f} RTT)"
                        if row
                        else "not measured",
                        row.ours_rtts < TARGET_RTTS if row else None,
                    )
                )
    checks += _scheduler_checks(results.scheduler)
    checks += _startup_checks(results.startup)
    for crow in results.contention_rows:
        checks.append(
            _Check(
                f"contention {crow.backend}: zero overlap", str(crow.overlaps), not crow.overlaps
            )
        )
    rows = {row.variant: row for row in results.connection_rows}
    if "multilock" in rows and "seed pattern" in rows:
        ours, seed = rows["multilock"], rows["seed pattern"]
        seed_jobs = "" if seed.jobs == ours.jobs else f" (seed pattern: {seed.jobs} jobs, room)"
        checks.append(
            _Check(
                f"connections with {ours.jobs} jobs running at once: fewer than the seed pattern",
                f"{ours.connections} vs {seed.connections}{seed_jobs}",
                ours.connections < seed.connections and ours.concurrent == ours.jobs,
            )
        )
    return checks


def _scheduler_checks(rows: list[dict[str, Any]]) -> list[_Check]:
    def find(
        library: str, backend: str, phasing: str, jobs: int = SCHEDULER_JOBS
    ) -> dict[str, Any] | None:
        for row in rows:
            key = (row["library"], row["backend"], row.get("phasing"), row["jobs"])
            if key == (library, backend, phasing, jobs):
                return None if "error" in row else row
        return None

    checks: list[_Check] = []
    for phasing in ("aligned", "spread"):
        aps = find("apscheduler", "-", phasing)
        floor = find("asyncio-floor", "-", phasing)
        for backend in ("memory", "postgresql"):
            ours = find("multilock", backend, phasing)
            what = f"scheduler {SCHEDULER_JOBS} jobs {phasing} on {backend}"
            measured = "not measured"
            if ours is not None:
                measured = f"{ours['p99_ms']:.2f} ms"
                if floor is not None:
                    measured += f" (asyncio floor {floor['p99_ms']:.2f} ms)"
            checks.append(
                _Check(
                    f"{what}: p99 lateness < 5 ms",
                    measured,
                    ours["p99_ms"] < LATENESS_P99_MS if ours else None,
                )
            )
            cpu = "not measured"
            met: bool | None = None
            if ours is not None and aps is not None:
                cpu = f"{ours['cpu_per_wall']:.3f} vs {aps['cpu_per_wall']:.3f}"
                met = ours["cpu_per_wall"] <= aps["cpu_per_wall"]
            checks.append(_Check(f"{what}: CPU <= APScheduler's", cpu, met))
    ours = find("multilock", "memory", "spread", SCALE_JOBS)
    aps = find("apscheduler", "-", "spread", SCALE_JOBS)
    for key, what, unit in (("p99_ms", "p99 lateness", " ms"), ("cpu_per_wall", "CPU", "")):
        checks.append(
            _Check(
                f"scheduler {SCALE_JOBS} jobs spread on memory: {what} <= APScheduler's",
                _versus(ours, aps, key, ".3g", unit),
                ours[key] <= aps[key] if ours and aps else None,
            )
        )
    return checks


def _startup_checks(rows: list[dict[str, Any]]) -> list[_Check]:
    found = {row["library"]: row for row in rows if "error" not in row}
    ours, aps = found.get("multilock"), found.get("apscheduler")
    jobs = rows[0]["jobs"] if rows else 0
    checks = []
    for key, what, unit in (
        ("total_s", "start-up time", " s"),
        ("peak_rss_mb", "peak RSS", " MB"),
        ("steady_rss_mb", "steady RSS", " MB"),
    ):
        met = ours[key] <= aps[key] if ours and aps else None
        what = f"scheduler {jobs} registered jobs: {what} <= APScheduler's"
        checks.append(_Check(what, _versus(ours, aps, key, ".1f", unit), met))
    return checks


def _versus(
    ours: dict[str, Any] | None, aps: dict[str, Any] | None, key: str, spec: str, unit: str
) -> str:
    if ours is None or aps is None:
        return "not measured"
    return f"{ours[key]:{spec}}{unit} vs {aps[key]:{spec}}{unit}"


def _verdict(met: bool | None) -> str:
    return {True: "pass", False: "**MISS**", None: "not measured"}[met]


def _lines(results: Results) -> list[str]:
    out = ["# Benchmarks", ""]
    if results.quick:
        out += ["> A `--quick` smoke run: too few samples for the figures to mean anything.", ""]
    out += [
        f"Written by `{results.command}` in {results.wall_seconds / 60:.1f} minutes, against",
        "the local PostgreSQL, Redis, ZooKeeper, etcd and NATS servers. The machine is shared and",
        "noisy: compare the ratios (measured in the same run, variants interleaved),",
        "not the absolute times, which are shown but not asserted.",
        "",
    ]
    out += [f"- {key}: {value}" for key, value in results.machine.items()]
    out += [
        "",
        "## How to run",
        "",
        "```sh",
        "pip install -e '.[bench]' -e 'backends/postgres[bench]' \\",
        "    -e 'backends/redis[bench]' -e 'backends/zookeeper[bench]' \\",
        "    -e 'backends/mysql[bench]' -e 'backends/etcd[bench]' -e 'backends/nats'",
        "python benchmarks/run.py          # all: rewrites this page and docs/img/bench-*.png",
        "python benchmarks/run.py --quick  # CI smoke: checks it all runs (into a tmpdir)",
        "python benchmarks/run.py --only cycle,many --out build/bench",
        "```",
        "",
        "Servers come from `MULTILOCK_POSTGRES_URL`, `MULTILOCK_REDIS_URL`,",
        "`MULTILOCK_ZOOKEEPER_URL`, `MULTILOCK_MYSQL_URL`, `MULTILOCK_ETCD_URL` and",
        "`MULTILOCK_NATS_URL`",
        "(defaults: the local test servers). Each section is",
        "also a script of its own in `benchmarks/` with a docstring saying what it does.",
    ]
    out += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    out += [f"| {c.target} | {c.measured} | {_verdict(c.met)} |" for c in _checks(results)]
    out += [f"- not run: {reason}" for reason in results.skipped]
    out += [f"- **failed to run**: {name}" for name in results.failed]
    out += _cycle_lines(results.cycles)
    out += _many_lines(results.many, results.many_delayed, results.many_delay_ms)
    out += _scheduler_lines(results.scheduler, results.scheduler_seconds)
    out += _startup_lines(results.startup)
    out += _contention_lines(results.contention_rows)
    out += _connection_lines(results.connection_rows)
    out += _takeover_lines(results.takeover_rows)
    out += _claim_lines(results.claim_rows)
    return out


def _cycle_lines(tables: list[Table]) -> list[str]:
    if not tables:
        return []
    out = [
        "",
        "## Lock cycle: uncontended try_acquire + release",
        "",
        "Microseconds per cycle; `raw` is the client library by hand, the floor is one",
        "server round trip (`SELECT 1`, `PING`, `exists`). Each script's docstring",
        "(`benchmarks/<backend>_cycle.py`) says exactly what each variant does.",
        "Each backend's benchmark runs three times in a full run (one run's ratio to",
        "raw swings by about ±0.05 here); each table is the run whose ratio is the",
        "median of the three, and `benchmarks/run.py` prints all three. Where each",
        "cycle's time goes (our code, the driver, the loop, the wait) is in",
        "[cycle-profile.md](cycle-profile.md).",
        "",
        "![cycle medians](img/bench-cycle.png)",
    ]
    for table in tables:
        out += [
            "",
            f"### {table.backend}, {table.api} (at least {table.cycles} cycles per variant)",
            "",
            "| variant | median µs | p99 µs | median vs raw |",
            "|---|---:|---:|---:|",
        ]
        for variant in sorted(table.medians, key=table.medians.__getitem__):
            name = f"**{variant}**" if variant == OURS else variant
            ratio = table.medians[variant] / table.medians[RAW]
            out.append(
                f"| {name} | {table.medians[variant]:.1f} | {table.p99s[variant]:.1f}"
                f" | {ratio:.2f}x |"
            )
    return out


def _many_table(rows: list[ManyRow]) -> list[str]:
    out = [
        "| backend | N | multilock ms | in round trips | fresh names ms | raw ms"
        " | raw / multilock | raw batch ms | server's own ms | multilock CPU µs/name |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {r.backend} | {r.n} | {r.ours_ms:.2f} | {r.ours_rtts:.1f} | {r.fresh_ms:.2f}"
        + (
            " | - | - |"
            if math.isnan(r.raw_ms)
            else f" | {r.raw_ms:.2f} | {r.raw_ms / r.ours_ms:.1f}x |"
        )
        + f" {r.batch_ms:.2f} | {r.server_ms:.2f} | {r.cpu_us_per_name:.1f} |"
        for r in rows
    ]
    rtts = {r.backend: r.rtt_ms * 1000 for r in rows}
    out += ["", "Round-trip time: " + ", ".join(f"{b} {t:.0f} µs" for b, t in rtts.items()) + "."]
    return out


def _many_lines(rows: list[ManyRow], delayed: list[ManyRow], delay_ms: float) -> list[str]:
    if not rows:
        return []
    out = [
        "",
        "## Many due jobs at one tick: try_acquire_many",
        "",
        "Median milliseconds to take N names: one `try_acquire_many` against N raw",
        "calls in a row (`pg_try_advisory_lock`, `SET NX PX`) on one connection (up",
        "to 1,000 names), and against the raw calls in one batch (`unnest` of a",
        "`bigint[]`, a redis-py pipeline): the client library's own floor. The",
        "names are the same each repetition (released in between), as a scheduler's",
        "jobs are every tick, and the raw side gets its keys precomputed too; `fresh",
        "names` is multilock with never-seen names (hashing included).",
        "",
        "![many locks](img/bench-many.png)",
        "",
        "### On loopback",
        "",
    ]
    out += _many_table(rows)
    out += [
        "",
        "On loopback a round trip is so short that the server's own work on 1000",
        "names (PostgreSQL's `EXPLAIN ANALYZE`: 0.6-0.9 ms; Redis runs 1000",
        "`SET NX PX` + `INCR` in the script) outweighs it, so the count in round",
        "trips measures the server, not the protocol.",
    ]
    if delayed:
        out += [
            "",
            f"### Through a proxy delaying {delay_ms:g} ms each way (a LAN)",
            "",
            "The same measurement through `multilock.testing.TcpProxy`, the tests' TCP",
            "proxy, in a process of its own (`benchmarks/_delay_proxy.py`): what the",
            "target in round trips is about. The raw",
            "pattern costs one round trip per lock; `try_acquire_many` stays near one.",
            "",
        ]
        out += _many_table(delayed)
    return out


def _scheduler_lines(rows: list[dict[str, Any]], seconds: float) -> list[str]:
    if not rows:
        return []
    out = [
        "",
        "## Scheduler: N interval jobs firing every second",
        "",
        f"Each configuration in its own process for {seconds:.0f} s after a 2 s warm-up;",
        "lateness is how long after its fire time a job's body started; CPU is",
        "user + system seconds per wall second of that process. Two phasings of the",
        "same N jobs: **aligned**, all N due on the whole second, so lateness measures",
        "throughput (the last job of a tick starts after the other N - 1 have been",
        "started), and **spread**, job i due i/N s past each second (as jobs given",
        "their own `start`, or a `jitter`, are), so lateness measures how promptly the",
        "scheduler wakes for each job. Every library's job knows its fire time and",
        "reports the time past it. `runs` counts the runs started in the window,",
        "against the ticks due in it: a scheduler that cannot keep up reports ticks",
        "missed past their grace (multilock: `misfire_grace`, here 0.25 s;",
        "APScheduler: `misfire_grace_time=1`). `asyncio-floor` creates one task per",
        "job when it is due and does nothing else: no scheduler on this event loop",
        "can start a body sooner. At 1,000 jobs on memory:// multilock and APScheduler",
        "run three times each, alternating, and the run with the median CPU is shown",
        "(all three CPU figures in the last column): one run's CPU swings by 10-30 %",
        "on this shared machine. multilock on PostgreSQL takes and releases a real",
        "advisory lock per run (APScheduler coordinates nothing): its CPU is shown",
        "against APScheduler's as the issue asks, but it is not a like-for-like pair.",
        "",
        "![scheduler](img/bench-scheduler.png)",
        "",
        "| library | backend | phasing | jobs | runs (of due) | p50 ms | p99 ms | max ms"
        " | CPU s/s | peak RSS MB | full gc | CPU of each run |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        head = f"| {r['library']} | {r['backend']} | {r.get('phasing', '-')} | {r['jobs']} |"
        if "error" in r:
            out.append(f"{head} error: {r['error']} ||||||||")
            continue
        each = ", ".join(f"{cpu:.3f}" for cpu in r.get("cpu_runs", []))
        out.append(
            f"{head} {r['runs']} ({r['runs'] / (r['jobs'] * seconds):.0%})"
            f" | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f}"
            f" | {r['cpu_per_wall']:.3f} | {r['peak_rss_mb']:.0f} | {r.get('full_gc', '-')}"
            f" | {each} |"
        )
    return out


def _startup_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["", f"## Scheduler start-up: {rows[0]['jobs']:,} registered jobs", *STARTUP_TEXT, ""]
    out += [
        "| library | jobs | construct s | add s | start s | total s | peak RSS MB"
        " | steady RSS MB | total of each run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        head = f"| {r['library']} | {r['jobs']} |"
        if "error" in r:
            out.append(f"{head} error: {r['error']} |||||||")
            continue
        each = ", ".join(f"{total:.2f}" for total in r.get("totals", []))
        out.append(
            f"{head} {r['construct_s']:.3f} | {r['add_s']:.2f} | {r['start_s']:.2f}"
            f" | {r['total_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['steady_rss_mb']:.0f} | {each} |"
        )
    return out


STARTUP_TEXT = [
    "",
    "95 % daily crons (`M H * * *`, every minute of the day: 1,440 distinct",
    "expressions), 5 % intervals of 1 to 60 minutes (`benchmarks/scheduler_startup.py`).",
    "Each run a fresh process, multilock (memory://) and APScheduler 3's",
    "AsyncIOScheduler alternating: construct, add the jobs, start -- ready once",
    "`start()` has returned, every job's first fire time computed. Peak RSS is the",
    "process's VmHWM, steady RSS its VmRSS one second after the start. The run with",
    "the median total of each library is shown (every run's total in the last column).",
]


def _contention_lines(rows: list[ContentionRow]) -> list[str]:
    if not rows:
        return []
    out = [
        "",
        "## Contention: one name, many contenders",
        "",
        "Threads, each with its own locker (connection or session), looping on",
        "`try_acquire` with a 1 ms back-off; a shared record counts entries into the",
        "section while another contender is inside (overlaps). All contenders are",
        "threads of one Python process: the rate says as much about the GIL and the",
        "clients' threads (kazoo runs its own per client) as about the servers.",
        "",
        "![contention](img/bench-contention.png)",
        "",
        "| backend | contenders | seconds | sections | sections/s | overlaps |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {r.backend} | {r.contenders} | {r.seconds:.1f} | {r.sections} | {r.per_second:.1f}"
        f" | {r.overlaps} |"
        for r in rows
    ]
    return out


def _connection_lines(rows: list[ConnectionRow]) -> list[str]:
    if not rows:
        return []
    out = [
        "",
        "## Connections: PostgreSQL connections of one replica",
        "",
        "Peak rows of `pg_stat_activity` with the variant's `application_name`, while",
        "the jobs run at once (each holding its lock while it sleeps). multilock runs",
        "all the jobs on its one session; the seed pattern needs a connection per",
        "running job, and runs as many as the server has connections left for",
        "(`max_connections` less those in use and 10 spared): on a default server,",
        "fewer than 100.",
        "",
        "| variant | jobs | running at once | server connections |",
        "|---|---:|---:|---:|",
    ]
    out += [f"| {r.variant} | {r.jobs} | {r.concurrent} | {r.connections} |" for r in rows]
    return out


def _takeover_lines(rows: list[TakeoverRow]) -> list[str]:
    if not rows:
        return []
    out = [
        "",
        "## Takeover: a standby leads once the leader goes",
        "",
        "Two replicas of `multilock.leadership` on one name, with its defaults (poll 1 s,",
        "jitter 0.1 s, ttl 10 s). *Left*: from the leader leaving its block (the lease",
        "released) at a random moment of the standby's polls, to the standby's `elected`:",
        "a round trip where the backend announces releases (memory://, Redis, ZooKeeper),",
        "else at most a poll and its jitter. *Killed*: from the SIGKILL of a leader process to",
        "the standby's `elected`: the next poll once the backend frees the lease, at once",
        "where it is the session's (PostgreSQL, MySQL, a flock), after the session",
        "timeout or the ttl elsewhere.",
        "",
    ]
    return out + takeover_table(rows)


def _claim_lines(rows: list[ClaimRow]) -> list[str]:
    if not rows:
        return []
    out = [
        "",
        "## Tick claims: a tick's cost, claim path against hold path",
        "",
        "What the scheduler asks of the backend per tick for N jobs due together, on one",
        "async locker each for the winner and a loser. *Hold*: the winner's",
        "`try_acquire_many` and, its hold over, its release of many; the loser's refused",
        "`try_acquire_many`. *Claim*: the winner's `claim_ticks`, `try_acquire_many` and",
        "release; the loser's refused `claim_ticks`, and nothing more. Median of the",
        "repetitions, the paths alternating (`benchmarks/tick_claims.py`).",
        "",
    ]
    return out + claims_table(rows)


def write(results: Results, out: Path) -> Path:
    """Write ``benchmarks.md`` and ``img/bench-*.png`` under ``out``; the document's path."""
    import _plots

    (out / "img").mkdir(parents=True, exist_ok=True)
    _plots.draw(results, out / "img")
    document = out / "benchmarks.md"
    document.write_text("\n".join(_lines(results)) + "\n")
    if results.profile_rows:
        write_profile(results.profile_rows, results.machine, out)
    return document
