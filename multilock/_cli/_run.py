"""``multilock run MODULE:ATTR``: run the Scheduler a user's module defines (like uvicorn)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
from typing import Any
from wsgiref.simple_server import WSGIServer

import click

from .._durations import parse_duration
from .._scheduling.scheduler import Scheduler
from ..errors import BackendUnavailable, ConfigurationError
from ._app import EXIT_FAILURE, cli, handle_errors
from ._http import Endpoints, serve
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
    except Exception as exc:  # the module's own code failed: one line, with where
        detail = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise ConfigurationError(
            f"importing module {module_name!r} failed: {_where(exc)}{type(exc).__name__}: {detail}"
        ) from None
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(found, Scheduler):
        raise ConfigurationError(f"{target} is a {type(found).__name__}, not a multilock.Scheduler")
    return found


def _where(exc: Exception) -> str:
    """``file:line: `` of the innermost frame that raised ``exc`` (or of a syntax error)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}: "
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""


def _serve_endpoints(
    scheduler: Scheduler,
    metrics: tuple[str, int] | None,
    health: tuple[str, int] | None,
) -> list[WSGIServer]:
    """Serve /metrics and /healthz + /readyz: on one server when given the same address."""
    servers = []
    if metrics is not None:
        endpoints = Endpoints(scheduler)
        endpoints.add_metrics()
        if health == metrics:
            endpoints.add_health()
        servers.append(serve(endpoints, *metrics, "metrics"))
    if health is not None and health != metrics:
        endpoints = Endpoints(scheduler)
        endpoints.add_health()
        servers.append(serve(endpoints, *health, "health checks"))
    return servers


@cli.command()
@click.argument("target", metavar="MODULE:ATTR")
@click.option(
    "--lock",
    "lock_url",
    envvar="MULTILOCK_LOCK_URL",
    default=None,
    help="lock URL, instead of the scheduler's own (or $MULTILOCK_LOCK_URL: out of `ps`)",
)
@click.option(
    "--wait-for-backend",
    metavar="DURATION",
    default=None,
    help="retry an unreachable backend at start for this long (e.g. 2m) instead of exiting",
)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="serve /metrics")
@click.option(
    "--metrics-addr", default="127.0.0.1", show_default=True, help="address of --metrics-port"
)
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="serve /healthz and /readyz (may be the metrics port)",
)
@click.option(
    "--health-addr", default="127.0.0.1", show_default=True, help="address of --health-port"
)
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
    target: str,
    lock_url: str | None,
    wait_for_backend: str | None,
    metrics_port: int | None,
    metrics_addr: str,
    health_port: int | None,
    health_addr: str,
    log_format: str,
    log_level: str,
) -> None:
    """Run the Scheduler at MODULE:ATTR until SIGTERM or SIGINT.

    It starts once its backend answers a probe: at once, else it exits 1 with one
    line saying why (or retries for --wait-for-backend). On a signal no new runs
    start; running jobs finish or time out (the scheduler's stop timeout) and every
    lease is released before exit.
    """
    configure_logging(log_format, log_level)
    scheduler = load_scheduler(target)
    if lock_url is not None:
        scheduler.use_lock(lock_url)
    if wait_for_backend is not None:
        scheduler.wait_for_backend = parse_duration(wait_for_backend, what="--wait-for-backend")
    metrics = None if metrics_port is None else (metrics_addr, metrics_port)
    health = None if health_port is None else (health_addr, health_port)
    servers = _serve_endpoints(scheduler, metrics, health)
    try:
        scheduler.run()
    except BackendUnavailable as exc:
        # One line, in the log's own format (JSON lines stay JSON): the scheduler's.
        logging.getLogger("multilock.scheduler").error("%s", exc)
        sys.exit(EXIT_FAILURE)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
