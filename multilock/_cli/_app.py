"""The click group and the error handling every command shares."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .. import __version__
from .._url import mask_url
from ..errors import BackendUnavailable, ConfigurationError, MultilockError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_FAILURE) -> None:
    """Print ``error: message`` (one line, password-masked) to stderr and exit."""
    click.echo(f"error: {mask_url(message)}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn multilock errors into one-line messages and the documented exit codes."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigurationError as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except BackendUnavailable as exc:
            fail(f"backend unavailable: {exc}")
        except MultilockError as exc:
            fail(str(exc))
        return None

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="multilock")
def cli() -> None:
    """Run scheduled jobs exactly once across the replicas of a service."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``multilock`` script and ``python -m multilock``."""
    from . import _conformance, _demo, _key, _locks, _next, _run  # noqa: F401  (registers)

    cli.main(args=argv, prog_name="multilock")
