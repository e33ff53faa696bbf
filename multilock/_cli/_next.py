"""``multilock next EXPR``: the next fire times of a cron expression."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from .._scheduling.triggers import parse_cron
from .._scheduling.walltime import as_timezone
from ..errors import ConfigurationError
from ._app import cli, handle_errors


@cli.command("next")
@click.argument("expression")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA timezone")
@click.option("-n", "count", default=5, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--seconds", is_flag=True, help="EXPRESSION has 6 fields, seconds first")
@click.option("--after", default=None, help="start from this ISO time instead of now")
@handle_errors
def next_(expression: str, timezone: str, count: int, seconds: bool, after: str | None) -> None:
    """Print the next fire times of a cron EXPRESSION, as the scheduler computes them
    (same timezone and DST policy), with their UTC instants.

    EXPRESSION has 5 fields (6 with --seconds) or is an alias: @hourly, @daily,
    @weekly, @monthly, @yearly."""
    tz = as_timezone(timezone)
    trigger = parse_cron(expression, seconds=seconds, flag="--seconds")
    start = datetime.now(UTC) if after is None else _parse_after(after, tz)
    for index in range(count):
        fire = trigger.next_fire(start, tz, expression)
        if fire is None:
            if index == 0:
                raise ConfigurationError(f"cron expression {expression!r} never fires")
            break
        local = fire.astimezone(tz)
        click.echo(f"{local.isoformat()}  {local.tzname()}  ({fire.astimezone(UTC).isoformat()})")
        start = fire


def _parse_after(text: str, tz: object) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(f"invalid --after time {text!r} (expected ISO 8601)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=tz)  # type: ignore[arg-type]
