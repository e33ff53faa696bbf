"""Secrets and isolation: a password in the lock URL never shows in a repr, a log line,
an error or the CLI's output, on every backend that takes one; ZooKeeper digest auth
keeps other clients off our nodes; a Redis ``prefix`` keeps two applications apart."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

import multilock
from multilock.backend import LockURL
from multilock.errors import MultilockError
from multilock_zookeeper._config import Config
from tests.reliability import _private
from tests.reliability._common import fresh_name, hooks, with_options
from tests.reliability.conftest import Measured

pytestmark = pytest.mark.faults

SECRET = "Pa55-w0rd-8c1f2e"


def _credentialed(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if backend == "postgres":  # local trust auth accepts the password it is given
        base = LockURL.parse(request.getfixturevalue("postgres_url"))
        yield f"postgresql://postgres:{SECRET}@{base.host}:{base.port or 5432}{base.path}"
    elif backend == "redis":
        server = _private.redis_server(request.config, tmp_path, SECRET)
        try:
            yield f"redis://:{SECRET}@127.0.0.1:{server.port}/0?ttl=1s"
        finally:
            server.remove()
    else:
        base = LockURL.parse(request.getfixturevalue("zookeeper_url"))
        chroot = f"{base.path.rstrip('/')}/secrets-{fresh_name('z')}"
        yield f"zookeeper://app:{SECRET}@{base.host}:{base.port or 2181}{chroot}?session_timeout=2s"


@pytest.fixture(params=["postgres", "redis", "zookeeper"])
def secret_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A working URL of each server backend carrying ``SECRET`` as its password."""
    yield from _credentialed(str(request.param), request, tmp_path)


def _unreachable(url: str) -> str:
    """The same URL, password and all, on a port where nothing listens."""
    found = hooks(url).unreachable_url(LockURL.parse(url))
    assert found is not None
    return found


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "multilock", *args], capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


def _everything_said(url: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every repr, str, error message and CLI output multilock produces for ``url``."""
    said: list[str] = []
    name = fresh_name("secret")
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(name)
        assert lease is not None
        said += [repr(locker), str(locker), locker.url, repr(lease), str(lease)]
        hooks(url).break_lease(LockURL.parse(url), locker, lease)
        assert lease.lost.wait(10)
        said.append(lease.lost.reason or "")
        lease.release()

    async def schedule() -> None:
        scheduler = multilock.Scheduler(url, skew_tolerance=0.2, metrics=False)
        scheduler.add_job(asyncio.sleep, multilock.every(seconds=1), name=name, args=(0.01,))
        async with scheduler:
            await asyncio.sleep(1.5)

    asyncio.run(schedule())
    for bad in (_unreachable(url), with_options(url, bogus_option=1), url.replace("/", "", 2)):
        try:
            with multilock.connect(bad) as locker:
                said.append(repr(locker))
                locker.try_acquire(name)
        except MultilockError as exc:
            said += [str(exc), repr(exc), repr(exc.__cause__), repr(exc.__context__)]
        said += [_cli("locks", bad), _cli("conformance", bad)]
    said.append(_cli("locks", url))
    formatter = logging.Formatter("%(message)s %(args)s")
    said += [formatter.format(record) for record in caplog.records]
    return said


def test_password_never_shown(
    secret_url: str, caplog: pytest.LogCaptureFixture, measured: Measured
) -> None:
    caplog.set_level(logging.DEBUG)
    said = _everything_said(secret_url, caplog)
    leaks = [text for text in said if SECRET in text]
    backend = LockURL.parse(secret_url).scheme.replace("postgresql", "postgres")
    measured(
        "password in the URL",
        backend,
        "never in a repr, log line, error or CLI output",
        f"{len(said)} texts scanned ({len(caplog.records)} log records at DEBUG, CLI"
        f" locks/conformance), {len(leaks)} with the password",
    )
    assert not leaks, leaks[:3]


def test_zookeeper_digest_auth_keeps_others_off(
    request: pytest.FixtureRequest, tmp_path: Path, measured: Measured
) -> None:
    url = next(_credentialed("zookeeper", request, tmp_path))
    config = Config.from_url(LockURL.parse(request.getfixturevalue("zookeeper_url")))
    intruder = KazooClient(hosts=config.hosts, timeout=config.session_timeout)
    intruder.start(timeout=config.connect_timeout)
    refused = []
    try:
        with multilock.connect(url) as locker:
            lease = locker.try_acquire("job")
            assert lease is not None
            attempts: list[Callable[[], object]] = [
                lambda: intruder.delete(str(lease.key)),
                lambda: intruder.create(f"{lease.key}-x", ephemeral=True),
            ]
            for attempt in attempts:
                try:
                    attempt()
                except NoAuthError:
                    refused.append(True)
            held = intruder.exists(str(lease.key)) is not None and lease.held
            assert lease.release()
    finally:
        intruder.stop()
        intruder.close()
    measured(
        "another client without our digest",
        "zookeeper",
        "cannot delete our lock node nor create one beside it",
        f"{len(refused)} of 2 attempts refused (NoAuth); our lease still held: {held}",
    )
    assert refused == [True, True]
    assert held


def test_redis_prefix_keeps_applications_apart(redis_url: str, measured: Measured) -> None:
    name = fresh_name("prefix")
    apps = [with_options(redis_url, prefix=f"{app}-{name}:") for app in ("app-a", "app-b")]
    with (
        multilock.connect(apps[0]) as a,
        multilock.connect(apps[1]) as b,
        multilock.connect(apps[0]) as a_again,
    ):
        first, second = a.try_acquire(name), b.try_acquire(name)
        same_app = a_again.try_acquire(name)
        both = first is not None and second is not None
        for lease in (first, second, same_app):
            if lease is not None:
                lease.release()
    measured(
        "two applications on one Redis, prefixes a: and b:",
        "redis",
        "each holds the same name at once; within one prefix they exclude",
        f"both held it: {both}; a second locker of the same prefix got"
        f" {'nothing' if same_app is None else 'it too'}",
    )
    assert both
    assert same_app is None
