"""``multilock locks URL``: who holds what, where the backend can tell."""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._locks.keys import advisory_key
from .._locks.registry import connect
from ..abc import Capability, LockInfo
from ._app import EXIT_FAILURE, cli, fail, handle_errors
from ._run import load_scheduler


def printable(text: str) -> str:
    """``text`` safe for a terminal: control and format characters (ESC, newline, tab,
    bidi overrides...) and the backslash written as Python escapes, so that lock data
    can neither move the cursor nor pass for another line or column."""
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif unicodedata.category(char).startswith("C"):
            code = ord(char)
            if code < 0x100:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


def _names(names: tuple[str, ...], jobs: str | None) -> dict[int, str]:
    """Advisory key -> name, for the names given and the jobs of a scheduler."""
    given = [name for value in names for name in value.split(",") if name]
    if jobs is not None:
        given += [job.name for job in load_scheduler(jobs).jobs]
    return {advisory_key(name): name for name in given}


def _named(info: LockInfo, by_key: dict[int, str]) -> str | None:
    if info.name is None and isinstance(info.key, int):
        return by_key.get(info.key)  # a PostgreSQL advisory key: one-way, named by the caller
    return info.name


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else ""


def _rows(held: Iterable[LockInfo], by_key: dict[int, str]) -> list[dict[str, Any]]:
    return [
        {
            "name": _named(info, by_key),
            "key": info.key,
            "holder": info.holder,
            "since": _when(info.since) or None,
            "expires_at": _when(info.expires_at) or None,
            "details": dict(info.details),
        }
        for info in held
    ]


@cli.command()
@click.argument("url")
@click.option(
    "--names",
    multiple=True,
    metavar="A,B",
    help="job names to recognise among keys the backend cannot name (PostgreSQL advisory"
    " keys are one-way hashes); repeatable",
)
@click.option(
    "--jobs",
    metavar="MODULE:ATTR",
    default=None,
    help="recognise the job names of the Scheduler at MODULE:ATTR (as for multilock run)",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON array of the locks")
@handle_errors
def locks(url: str, names: tuple[str, ...], jobs: str | None, as_json: bool) -> None:
    """Show the locks held on the backend at URL: name where known, key, holder, since.

    A table on a terminal; otherwise one lock per line, tab-separated (name, key,
    holder, since), or JSON with --json. Names are shown as '?' where neither the
    backend nor --names/--jobs can tell them.
    """
    by_key = _names(names, jobs)
    with connect(url) as locker:
        lister = getattr(locker, "locks", None)
        if Capability.INTROSPECTION not in locker.capabilities or lister is None:
            fail(
                f"the backend at {locker.url} cannot list its locks"
                " (it does not declare the introspection capability)",
                EXIT_FAILURE,
            )
        rows = _rows(lister(), by_key)
        where = locker.url
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
    elif not rows:
        click.echo(f"no locks held at {printable(where)}")
    elif sys.stdout.isatty():
        _table(rows, where)
    else:
        for row in rows:
            click.echo("\t".join(_cells(row)))


def _cells(row: dict[str, Any]) -> list[str]:
    """A row's name, key, holder and since, printable."""
    cells = [row["name"] or "?", str(row["key"]), row["holder"] or "", row["since"] or ""]
    return [printable(cell) for cell in cells]


def _table(rows: list[dict[str, Any]], where: str) -> None:
    # Text cells: lock data is never read as rich markup.
    table = Table("name", "key", "holder", "since", title=Text(f"locks held at {printable(where)}"))
    for row in rows:
        table.add_row(*(Text(cell) for cell in _cells(row)))
    Console().print(table)
