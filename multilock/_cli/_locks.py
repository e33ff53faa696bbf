"""``multilock locks URL``: who holds what, where the backend can tell."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from .._registry import connect
from ..abc import Capability
from ._app import EXIT_FAILURE, cli, fail, handle_errors


@cli.command()
@click.argument("url")
@handle_errors
def locks(url: str) -> None:
    """Show the locks held on the backend at URL: name where known, key, holder, since."""
    with connect(url) as locker:
        lister = getattr(locker, "locks", None)
        if Capability.INTROSPECTION not in locker.capabilities or lister is None:
            fail(
                f"the backend at {locker.url} cannot list its locks"
                " (it does not declare the introspection capability)",
                EXIT_FAILURE,
            )
            return
        held = lister()
    table = Table("name", "key", "holder", "since", title=f"locks held at {locker.url}")
    for info in held:
        since = info.since.isoformat(timespec="seconds") if info.since else ""
        table.add_row(info.name or "?", str(info.key), info.holder or "", since)
    console = Console()
    if held:
        console.print(table)
    else:
        console.print(f"no locks held at {locker.url}", highlight=False)
