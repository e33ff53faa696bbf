"""The click group and the error handling every command shares."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from .. import __version__
from .._url import mask_url
from ..errors import BackendUnavailable, ConfigurationError, MultilockError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a command ended by SIGINT


def one_line(message: str) -> str:
    """``message`` on one line: drivers' multi-line messages (psycopg's hint) joined."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``error: message`` (one line, password-masked) to stderr and exit."""
    click.echo(f"error: {one_line(mask_url(message))}", err=True)
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

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="multilock")
def cli() -> None:
    """Run scheduled jobs exactly once across the replicas of a service."""


def _quiet_libraries() -> None:
    """No log record reaches stderr unless a command asks for logs (``run`` does).

    Without a handler, Python prints warnings through its last-resort handler:
    kazoo's "Connection dropped" lines would come before the one-line error.
    """
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``multilock`` script and ``python -m multilock``."""
    # Each module registers its command; none imports pytest (`conformance` does, when run).
    from . import _conformance, _demo, _jobs, _key, _locks, _next, _once, _run  # noqa: F401

    _quiet_libraries()
    try:
        code = cli.main(args=argv, prog_name="multilock", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # `multilock` alone: the help, as click shows it
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "multilock"
        fail(f"{exc.format_message().rstrip('.')} (see '{command} --help')", exc.exit_code)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except click.Abort:
        fail("interrupted", EXIT_INTERRUPTED)
    # --help and --version end with their exit code; commands return None.
    sys.exit(code if isinstance(code, int) else 0)
