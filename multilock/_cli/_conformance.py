"""``multilock conformance URL``: the conformance suite against any backend URL."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from .._locks.registry import connect
from .._url import mask_url
from ._app import EXIT_BAD_INPUT, EXIT_FAILURE, cli, fail, handle_errors

if TYPE_CHECKING:
    import pytest

_ID = re.compile(r"::(?P<check>test_\w+)\[(?P<api>sync|async)-(?P<url>.*)\]$")


class _Results:
    """A pytest plugin object that keeps each check's outcome per API and URL."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        match = _ID.search(report.nodeid)
        if match is None:
            return
        cell = self.rows.setdefault((match["url"], match["check"]), {})
        if report.failed:
            cell[match["api"]] = "[red]FAIL[/red]"
        elif report.skipped and report.when in ("setup", "call"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            cell[match["api"]] = f"[yellow]skip[/yellow] {reason.removeprefix('Skipped: ')}"
        elif report.passed and report.when == "call":
            cell.setdefault(match["api"], "[green]pass[/green]")


@cli.command()
@click.argument("urls", nargs=-1, required=True)
@click.option("-k", "keyword", default=None, help="only checks matching this pytest -k expression")
@click.option("-x", "--exitfirst", is_flag=True, help="stop at the first failing check")
@click.option("-v", "--verbose", count=True, help="pytest verbosity (repeatable)")
def conformance(urls: tuple[str, ...], keyword: str | None, exitfirst: bool, verbose: int) -> None:
    """Run the conformance suite against each backend URL (third-party ones too).

    Every check runs against the sync and the async API. Exit code 0 when every
    check passes or does not apply, 1 when one fails, 2 on bad input.
    Needs pytest, which the core does not install.
    """
    try:
        import pytest
    except ImportError:
        fail(
            "multilock conformance needs pytest: pip install 'multilock[conformance]'",
            EXIT_BAD_INPUT,
        )
    _check_urls(urls)
    results = _Results()
    with tempfile.TemporaryDirectory(prefix="multilock-conformance-") as tmp:
        # An empty ini of our own: the user's pytest configuration must not leak in.
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n")
        args = ["-c", str(ini), "--rootdir", tmp, "-p", "no:cacheprovider", "-rfE"]
        # The CLI imported multilock before pytest could rewrite its asserts: say nothing of it.
        args += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
        args += ["-p", "multilock.testing.plugin", "--multilock-require-backends"]
        args += ["-q"] if verbose == 0 else ["-" + "v" * verbose]
        for url in urls:
            args += ["--multilock-url", url]
        if keyword:
            args += ["-k", keyword]
        if exitfirst:
            args.append("-x")
        code = pytest.main(args, plugins=[results])
    _summary(results)
    if code in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and results.rows:
        sys.exit(0)
    if code == pytest.ExitCode.USAGE_ERROR:
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(EXIT_FAILURE)


@handle_errors
def _check_urls(urls: tuple[str, ...]) -> None:
    """Bad URLs and unreachable backends end here, in one line, before pytest starts."""
    for url in urls:
        with connect(url) as locker:
            lease = locker.try_acquire("multilock-conformance-probe")
            if lease is not None:
                lease.release()


def _summary(results: _Results) -> None:
    console = Console()
    for url in dict.fromkeys(url for url, _ in results.rows):
        table = Table("check", "sync", "async", title=f"conformance of {mask_url(url)}")
        for (row_url, check), cell in results.rows.items():
            if row_url == url:
                name = check.removeprefix("test_").replace("_", " ")
                table.add_row(name, cell.get("sync", "-"), cell.get("async", "-"))
        console.print(table)
