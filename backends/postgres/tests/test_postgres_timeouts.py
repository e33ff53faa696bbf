"""Every call has a deadline: the session's lock_timeout and statement_timeout on the
server, and a cut of the socket where the server does not answer within health_timeout
(issue 24)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import multilock
from multilock import advisory_key
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, InvalidOption
from multilock.testing import TcpProxy
from multilock_postgres import AsyncPostgresLocker, PostgresLocker
from multilock_postgres._async import session as async_module
from multilock_postgres._sync import session as sync_module

SLACK = 1.0  # on top of a bound: a loaded two-core machine, a round trip or two


def _name() -> str:
    return f"timeouts-{uuid.uuid4().hex}"


def _show(locker: PostgresLocker, setting: str) -> str:
    with locker._holding:
        assert locker._cursor is not None
        row = locker._cursor.execute(f"SHOW {setting}").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, ("500ms", "800ms")),  # by default half and four fifths of health_timeout (1 s)
        (
            {"lock_timeout": "250ms", "statement_timeout": "2m", "health_timeout": "3m"},
            ("250ms", "2min"),
        ),
    ],
)
def test_the_session_sets_its_timeouts(
    make_url: Callable[..., str], options: dict[str, str], expected: tuple[str, str]
) -> None:
    with multilock.connect(make_url(**options)) as locker:
        assert isinstance(locker, PostgresLocker)
        lease = locker.try_acquire(_name())
        assert lease is not None
        assert (_show(locker, "lock_timeout"), _show(locker, "statement_timeout")) == expected
        lease.release()


@pytest.mark.parametrize(
    "option", ["lock_timeout", "statement_timeout", "health_interval", "health_timeout"]
)
@pytest.mark.parametrize("value", ["25d", "0", "-1s", "1e12"])
def test_a_timeout_postgres_cannot_take_is_refused(
    postgres_url: str, option: str, value: str
) -> None:
    with pytest.raises(InvalidOption, match=option) as info:
        multilock.connect(f"{postgres_url}?{option}={value}")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("option", ["lock_timeout", "statement_timeout"])
def test_a_server_timeout_must_end_before_the_client_gives_up(
    postgres_url: str, option: str
) -> None:
    with pytest.raises(InvalidOption, match=f"'{option}'.* not shorter than health_timeout"):
        multilock.connect(f"{postgres_url}?{option}=1s")  # health_timeout: 1 s
    multilock.connect(f"{postgres_url}?{option}=1s&health_timeout=2s").close()


@pytest.mark.parametrize("connected", [True, False], ids=["connected", "connecting"])
def test_a_peer_locking_the_fencing_sequence_cannot_hang_try_acquire(
    make_url: Callable[..., str],
    sequence: str,
    peer_locks: Callable[[str], None],
    holders: Callable[[int], list[int]],
    connected: bool,
) -> None:
    # Issue 24: the acquire waited for the peer's lock for ever (sync still blocked at
    # 25 s). Now lock_timeout (0.5 s by default) ends the wait, and the advisory lock the
    # statement had already taken is not left behind.
    name, other = _name(), _name()
    with multilock.connect(make_url(fencing=True, fencing_sequence=sequence)) as locker:
        if connected:
            first = locker.try_acquire(_name())
            assert first is not None
            first.release()
        peer_locks(sequence)
        for call in (lambda: locker.try_acquire(name), lambda: locker.try_acquire_many([other])):
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="lock timeout"):
                call()
            assert time.monotonic() - started < 0.5 + SLACK
        assert holders(advisory_key(name)) == holders(advisory_key(other)) == []


def test_async_peer_locking_the_fencing_sequence_cannot_hang_try_acquire(
    make_url: Callable[..., str],
    sequence: str,
    peer_locks: Callable[[str], None],
    holders: Callable[[int], list[int]],
) -> None:
    # Issue 24: the async acquire ignored a 10 s wait_for and returned at 45 s.
    name = _name()

    async def main() -> float:
        url = make_url(fencing=True, fencing_sequence=sequence, lock_timeout="300ms")
        async with multilock.connect_async(url) as locker:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="lock timeout"):
                await asyncio.wait_for(locker.try_acquire(name), 10)
            with pytest.raises(BackendUnavailable, match="lock timeout"):
                await asyncio.wait_for(locker.try_acquire_many([name, _name()]), 10)
            return time.monotonic() - started

    peer_locks(sequence)
    assert asyncio.run(main()) < 2 * 0.3 + SLACK
    assert holders(advisory_key(name)) == []


def test_statement_timeout_ends_what_lock_timeout_does_not(
    make_url: Callable[..., str],
    sequence: str,
    peer_locks: Callable[[str], None],
    holders: Callable[[int], list[int]],
) -> None:
    name = _name()
    url = make_url(
        fencing=True,
        fencing_sequence=sequence,
        health_timeout=2,
        lock_timeout=1.9,
        statement_timeout=0.3,
    )
    with multilock.connect(url) as locker:
        peer_locks(sequence)
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="statement timeout"):
            locker.try_acquire(name)
        assert time.monotonic() - started < 0.3 + SLACK
    assert holders(advisory_key(name)) == []


def _through(proxy: TcpProxy, postgres_url: str) -> str:
    url = LockURL.parse(postgres_url)
    return (
        f"postgresql://{url.username or 'postgres'}@127.0.0.1:{proxy.port}{url.path}"
        "?health_interval=1h&health_timeout=0.5"
    )


def _freeze_once_connected(monkeypatch: pytest.MonkeyPatch, module: Any, proxy: TcpProxy) -> None:
    """Freeze the proxy the moment ``module`` has made its next connection: the server
    is reached, then never answers again."""
    real = module.open_connection

    def frozen(conn: Any) -> Any:
        proxy.freeze()
        return conn

    def open_then_freeze(*args: Any) -> Any:
        return frozen(real(*args))

    async def async_open_then_freeze(*args: Any) -> Any:
        return frozen(await real(*args))

    is_async = asyncio.iscoroutinefunction(real)
    monkeypatch.setattr(
        module, "open_connection", async_open_then_freeze if is_async else open_then_freeze
    )


# With health_interval=1h no health check comes to the rescue: these are the deadlines
# of the calls themselves, health_timeout a round trip.
BOUND = 0.5


def test_a_server_that_stops_answering_after_connect_cannot_hang_the_acquire(
    frozen_proxy: TcpProxy, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _freeze_once_connected(monkeypatch, sync_module, frozen_proxy)
    with multilock.connect(_through(frozen_proxy, postgres_url)) as locker:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="timeouts"):
            locker.try_acquire(_name())
        assert time.monotonic() - started < BOUND + SLACK


def test_locks_and_close_cannot_hang(
    frozen_proxy: TcpProxy, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with multilock.connect(_through(frozen_proxy, postgres_url)) as locker:
        lease = locker.try_acquire(_name())
        assert lease is not None
        _freeze_once_connected(monkeypatch, sync_module, frozen_proxy)
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="listing locks"):
            locker.locks()  # type: ignore[attr-defined]
        assert time.monotonic() - started < BOUND + SLACK
        started = time.monotonic()
        locker.close()  # its unlock gets no answer: cut, and the session closed anyway
        assert time.monotonic() - started < BOUND + SLACK
        assert not lease.held


def test_async_locks_close_and_session_setup_cannot_hang(
    frozen_proxy: TcpProxy, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with multilock.connect_async(_through(frozen_proxy, postgres_url)) as locker:
            assert isinstance(locker, AsyncPostgresLocker)
            lease = await locker.try_acquire(_name())
            assert lease is not None
            _freeze_once_connected(monkeypatch, async_module, frozen_proxy)
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="listing locks"):
                await asyncio.wait_for(locker.locks(), 10)
            assert time.monotonic() - started < BOUND + SLACK
            started = time.monotonic()
            await asyncio.wait_for(locker.aclose(), 10)
            assert time.monotonic() - started < BOUND + SLACK
        frozen_proxy.freeze(False)
        async with multilock.connect_async(_through(frozen_proxy, postgres_url)) as locker:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="timeouts"):
                await asyncio.wait_for(locker.try_acquire(_name()), 10)
            assert time.monotonic() - started < BOUND + SLACK

    asyncio.run(main())
