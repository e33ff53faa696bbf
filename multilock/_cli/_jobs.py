"""``multilock jobs MODULE:ATTR``: a scheduler's jobs, their next fire times and, from
running replicas, each job's last outcome."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._scheduling.events import EventKind
from ..errors import ConfigurationError
from ._app import EXIT_FAILURE, cli, fail, handle_errors
from ._job_view import job_rows
from ._locks import printable
from ._run import load_scheduler

__all__ = ["jobs"]

_FETCH_TIMEOUT = 5.0  # seconds a replica has to answer /jobs
# Which outcome of one tick tells the most, when replicas saw it differently: the run
# itself (on the replica that ran it), then a miss, then a skip (another replica ran it).
_RANK: dict[str, int] = {
    EventKind.SUCCEEDED: 3,
    EventKind.FAILED: 3,
    EventKind.TIMED_OUT: 3,
    EventKind.LEASE_LOST: 3,
    EventKind.MISSED: 2,
    EventKind.SKIPPED_OVERLAP: 1,
    EventKind.SKIPPED_HELD: 0,
}


def _fetch(replica: str) -> list[dict[str, Any]]:
    """The rows a running ``multilock run --health-port`` serves at ``/jobs``."""
    base = replica if "://" in replica else f"http://{replica}"
    if not base.startswith(("http://", "https://")):
        raise ConfigurationError(f"--replica expects http://HOST:PORT, got {printable(replica)!r}")
    url = base.rstrip("/") + "/jobs"
    try:
        with urllib.request.urlopen(url, timeout=_FETCH_TIMEOUT) as answer:
            body = json.load(answer)
    except (OSError, ValueError) as exc:
        fail(f"cannot read {url}: {getattr(exc, 'reason', None) or exc}", EXIT_FAILURE)
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
        fail(f"{url} did not answer with multilock's /jobs document", EXIT_FAILURE)
    return [row for row in body["jobs"] if isinstance(row, dict)]


def _merge(rows: list[dict[str, Any]], seen: Iterable[list[dict[str, Any]]]) -> None:
    """Each row's ``last``: of the replicas' views, the latest tick's most telling one."""
    for answers in seen:
        by_name = {row.get("name"): row.get("last") for row in answers}
        for row in rows:
            other = by_name.get(row["name"])
            if isinstance(other, dict) and _better(other, row["last"]):
                row["last"] = other


def _better(candidate: dict[str, Any], current: dict[str, Any] | None) -> bool:
    if current is None:
        return True

    def key(last: dict[str, Any]) -> tuple[str, int]:
        return str(last.get("fire_time", "")), _RANK.get(str(last.get("outcome")), -1)

    return key(candidate) > key(current)


def _last_text(last: dict[str, Any] | None) -> str:
    if last is None:
        return ""
    text = f"{last['outcome']} {last['fire_time']} on {last['replica']}"
    if last.get("duration") is not None:
        text += f" ({last['duration']:.3f} s)"
    if last.get("reason"):
        text += f": {last['reason']}"
    return printable(text)


@cli.command()
@click.argument("target", metavar="MODULE:ATTR")
@click.option("-n", "count", default=3, show_default=True, type=click.IntRange(1, 1000),
              help="next fire times shown per job")  # fmt: skip
@click.option(
    "--replica",
    "replicas",
    multiple=True,
    metavar="HOST:PORT",
    help="a running `multilock run --health-port`: the jobs' last outcomes as it saw"
    " them (repeatable: the replicas' views are merged)",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON array of the jobs")
@handle_errors
def jobs(target: str, count: int, replicas: tuple[str, ...], as_json: bool) -> None:
    """List the jobs of the Scheduler at MODULE:ATTR: trigger, mode, next fire times
    and, with --replica, each job's last outcome.

    A table on a terminal; otherwise one job per line, tab-separated (name, trigger,
    mode, next fire time, last outcome), or JSON with --json.
    """
    rows = job_rows(load_scheduler(target), count)
    _merge(rows, (_fetch(replica) for replica in replicas))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif sys.stdout.isatty():
        table = Table("name", "trigger", "mode", "next", "last outcome", title=Text(target))
        for row in rows:
            cells = [printable(row[field]) for field in ("name", "trigger", "mode")]
            cells += ["\n".join(row["next"]), _last_text(row["last"])]
            table.add_row(*(Text(cell) for cell in cells))
        Console().print(table)
    else:
        for row in rows:
            first = row["next"][0] if row["next"] else ""
            cells = [row["name"], row["trigger"], row["mode"], first]
            click.echo("\t".join([*(printable(cell) for cell in cells), _last_text(row["last"])]))
