"""``multilock run MODULE:ATTR``: run the Scheduler a user's module defines (like uvicorn)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import traceback
from datetime import UTC, datetime
from typing import Any

import click

from .._scheduler import Scheduler
from .._url import mask_url
from ..errors import ConfigurationError
from ._app import cli, handle_errors

# Attributes every LogRecord has; anything else on a record is a structured field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a caller attached to ``record`` (``extra=...``)."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as JSON; values that are not JSON become strings."""
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": mask_url(record.getMessage()),
        }
        data.update(_fields(record))
        if record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """Readable lines, with the structured fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The classic line plus the record's extra fields."""
        line = mask_url(super().format(record))
        extra = [f"{k}={v}" for k, v in _fields(record).items()]
        return f"{line} [{' '.join(extra)}]" if extra else line


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


def _configure_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


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
    _configure_logging(log_format, log_level)
    scheduler = load_scheduler(target)
    if lock_url is not None:
        scheduler.use_lock(lock_url)
    if metrics_port is not None:
        _serve_metrics(metrics_port)
    scheduler.run()
