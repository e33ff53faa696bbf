"""The pytest plugin (entry point ``pytest11``): options only, inert until given a URL."""

from __future__ import annotations

import os

import pytest

URL_ENV = "MULTILOCK_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the multilock options."""
    group = parser.getgroup("multilock", "multilock conformance suite")
    group.addoption(
        "--multilock-url",
        action="append",
        default=[],
        metavar="URL",
        help=f"run the conformance suite against this lock URL (repeatable; env {URL_ENV})",
    )
    group.addoption(
        "--multilock-require-backends",
        action="store_true",
        default=False,
        help="a backend server that cannot be reached fails the run instead of skipping"
        " (env MULTILOCK_REQUIRE_BACKENDS=1)",
    )


def urls(config: pytest.Config) -> list[str]:
    """The URLs the suite was given, from the option and the environment."""
    given: list[str] = list(config.getoption("multilock_url") or [])
    given += os.environ.get(URL_ENV, "").split()
    return given
