"""``multilock run MODULE:ATTR``: run the Scheduler a user's module defines (like uvicorn)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from .._scheduler import Scheduler
from ..errors import ConfigurationError
from ._app import cli, handle_errors
from ._logs import configure_logging


def load_scheduler(target: str) -> Scheduler:
    """Import ``MODULE:ATTR`` (from the current directory too) and return the Scheduler."""
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigurationError(f"expected MODULE:ATTR (like app.jobs:scheduler), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import module {module_name!r}: {exc}") from None
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(found, Scheduler):
        raise ConfigurationError(f"{target} is a {type(found).__name__}, not a multilock.Scheduler")
    return found


def _serve_metrics(port: int) -> None:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "--metrics-port needs prometheus-client: pip install 'multilock[metrics]'"
        ) from None
    try:
        prometheus_client.start_http_server(port)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on port {port}: {exc.strerror}") from None


@cli.command()
@click.argument("target", metavar="MODULE:ATTR")
@click.option("--lock", "lock_url", default=None, help="lock URL, instead of the scheduler's own")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="serve /metrics")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
@handle_errors
def run(
    target: str, lock_url: str | None, metrics_port: int | None, log_format: str, log_level: str
) -> None:
    """Run the Scheduler at MODULE:ATTR until SIGTERM or SIGINT.

    On a signal no new runs start; running jobs finish or time out (the
    scheduler's stop timeout) and every lease is released before exit.
    """
    configure_logging(log_format, log_level)
    scheduler = load_scheduler(target)
    if lock_url is not None:
        scheduler.use_lock(lock_url)
    if metrics_port is not None:
        _serve_metrics(metrics_port)
    scheduler.run()
