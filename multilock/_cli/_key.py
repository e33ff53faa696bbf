"""``multilock key NAME...``: the PostgreSQL advisory key of job names."""

from __future__ import annotations

import click

from .._locks.keys import advisory_key
from ._app import cli


def pg_locks_halves(key: int) -> tuple[int, int]:
    """How ``pg_try_advisory_lock(key)`` shows in ``pg_locks``: (classid, objid), objsubid 1."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


@cli.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--plain", is_flag=True, help="print only the keys, one per line")
def key(names: tuple[str, ...], plain: bool) -> None:
    """Print the advisory key of each NAME and how it appears in pg_locks.

    The key is FNV-1a 64 of the UTF-8 name as a signed int64: the same number
    as Go's JobLockKey, so Go and Python replicas lock the same job.
    """
    for name in names:
        k = advisory_key(name)
        if plain:
            click.echo(k)
            continue
        classid, objid = pg_locks_halves(k)
        click.echo(f"{name}\t{k}\tpg_locks: classid={classid} objid={objid} objsubid=1")
    if len(names) == 1 and not plain:
        classid, objid = pg_locks_halves(advisory_key(names[0]))
        click.echo(
            "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory'"
            f" AND classid = {classid} AND objid = {objid} AND objsubid = 1;"
        )
