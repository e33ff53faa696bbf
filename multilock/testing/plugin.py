"""The pytest plugin (entry point ``pytest11``): inert until given a URL.

``pytest --multilock-url=URL`` (repeatable; or the ``MULTILOCK_URL``
environment variable, whitespace-separated) collects the conformance suite
shipped in this package and runs it against each URL -- alone when no test
paths are given, beside them when they are. Without a URL the plugin only
registers its options and the ``tcp_proxy`` fixture (for tests that ask for it).
Load it explicitly with ``-p multilock.testing.plugin`` where plugin autoloading
is off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from multilock.backend import mask_url

from ._process import URL_ENV
from ._proxy import TcpProxy

__all__ = ["SUITE_MODULE", "URL_ENV", "tcp_proxy", "urls"]

SUITE_MODULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_plugin_suite.py")
"""The file collected when URLs are given."""


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
    """The URLs the suite was given, from the option and the environment, deduplicated."""
    given: list[str] = list(config.getoption("multilock_url") or [])
    given += os.environ.get(URL_ENV, "").split()
    return list(dict.fromkeys(given))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """With URLs, add the suite module to what pytest collects.

    Given no test paths, the suite runs alone (not the project's testpaths or
    the current directory): ``pytest --multilock-url URL`` means "check URL".
    """
    if not urls(config) or SUITE_MODULE in config.args:
        return
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.append(SUITE_MODULE)
    else:
        config.args[:] = [SUITE_MODULE]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the collected suite with the URLs (passwords masked in test ids)."""
    # Compared by file: the import mode decides under which module name it was imported.
    module_file = getattr(metafunc.module, "__file__", None) or ""
    if metafunc.cls is not None and os.path.abspath(module_file) == SUITE_MODULE:
        given = urls(metafunc.config)
        metafunc.parametrize(
            "multilock_url", given, indirect=True, ids=[mask_url(url) for url in given]
        )


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[tuple[str, int] | str], TcpProxy]]:
    """``tcp_proxy(upstream)``: a started :class:`~multilock.testing.TcpProxy` to
    ``(host, port)``, or in front of a lock URL's server; closed after the test."""
    proxies: list[TcpProxy] = []

    def make(upstream: tuple[str, int] | str) -> TcpProxy:
        proxy = TcpProxy.before(upstream) if isinstance(upstream, str) else TcpProxy(upstream)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()
