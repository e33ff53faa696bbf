"""The waiting acquire's parts the conformance suite cannot see: the backoff, the
timeout's forms, memory://'s wake-up on release, and the sync locker's async view."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType

import pytest

import multilock
from multilock._locks.base import (
    FIRST_WAIT,
    POLL_CAP,
    WAKE_CAP,
    AsyncReleaseWatch,
    Patience,
    parse_timeout,
)
from multilock._locks.sync_adapter import AsyncView
from multilock.errors import ConfigurationError, LockTimeout
from multilock.testing import apoll, poll
from multilock.testing._waits import observe_waits


def test_timeout_forms() -> None:
    assert parse_timeout(None) is None
    assert parse_timeout(0) == 0.0
    assert parse_timeout(timedelta(0)) == 0.0
    assert parse_timeout("250ms") == 0.25
    for bad in (-1, -0.5, "soon", True, float("nan")):
        with pytest.raises(ConfigurationError):
            parse_timeout(bad)


def test_backoff_is_jittered_capped_and_ends_at_the_deadline() -> None:
    waits = [Patience("x", None).next_wait() for _ in range(200)]
    assert all(FIRST_WAIT / 2 <= w <= FIRST_WAIT for w in waits)
    assert len(set(waits)) > 100, "the first waits are not jittered"
    for wakes, cap in ((False, POLL_CAP), (True, WAKE_CAP)):
        patience = Patience("x", None)
        later = [patience.next_wait(wakes) for _ in range(30)][-10:]
        assert all(cap / 2 <= w <= cap for w in later), (wakes, later)
    with pytest.raises(LockTimeout, match="'x' stayed held"):
        Patience("x", 0).next_wait()
    patience = Patience("x", 0.05)
    assert sum(patience.next_wait() for _ in range(3)) <= 0.05  # never past the deadline


def test_memory_watch_wakes_on_release(memory_url: str) -> None:
    """A sync waiter on memory:// is woken by the release, not by its next poll."""
    with multilock.connect(memory_url) as holder, multilock.connect(memory_url) as waiter:
        lease = holder.try_acquire("woken")
        assert lease is not None
        with waiter.watch_released("woken") as watch:  # type: ignore[attr-defined]
            assert watch.wakes
            releasing = threading.Timer(0.1, lease.release)
            releasing.start()
            start = time.monotonic()
            watch.wait(30)
            releasing.join()  # its reply read before the holder closes
            assert time.monotonic() - start < 10, "the watch slept its whole wait"


def test_memory_async_watch_wakes_on_release_from_another_thread(memory_url: str) -> None:
    async def scenario() -> None:
        async with multilock.connect_async(memory_url) as waiter:
            with multilock.connect(memory_url) as holder:
                lease = holder.try_acquire("woken-async")
                assert lease is not None
                async with waiter.watch_released("woken-async") as watch:  # type: ignore[attr-defined]
                    releasing = threading.Timer(0.1, lease.release)
                    releasing.start()
                    await asyncio.wait_for(watch.wait(30), 10)
                    releasing.join()  # its reply read before the holder closes
                got = await waiter.acquire("woken-async", timeout=5)
                await got.release()

    asyncio.run(scenario())


def test_memory_waiter_is_forgotten_after_its_wait(memory_url: str) -> None:
    """Nothing of a timed-out wait stays queued: the namespace has no waiter left."""
    with multilock.connect(memory_url) as holder, multilock.connect(memory_url) as waiter:
        lease = holder.try_acquire("forgotten")
        assert lease is not None
        with pytest.raises(LockTimeout):
            waiter.acquire("forgotten", timeout=0.05)
        assert "forgotten" not in waiter._space.waiters  # type: ignore[attr-defined]
        lease.release()


def test_async_view_waits_and_cancels_cleanly(memory_url: str) -> None:
    """The async view of a sync locker waits by polling, and a cancelled wait leaves
    nothing held."""

    async def scenario() -> None:
        with multilock.connect(memory_url) as holder, multilock.connect(memory_url) as inner:
            view = AsyncView(inner)
            lease = holder.try_acquire("view")
            assert lease is not None
            waiting = asyncio.ensure_future(view.acquire("view", timeout=30))
            await asyncio.sleep(0.1)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            assert waiting.cancelled()
            with pytest.raises(LockTimeout):
                await view.acquire("view", timeout=0.1)
            waiting = asyncio.ensure_future(view.acquire("view", timeout=30))
            await asyncio.sleep(0.1)
            lease.release()
            got = await asyncio.wait_for(waiting, 10)
            assert got.held
            assert holder.try_acquire("view") is None
            await got.release()
            poll("free after the view's release", lambda: holder.try_acquire("view"), 5).release()
            await view.aclose()

    asyncio.run(scenario())


def test_acquire_under_timeout_of_the_caller(memory_url: str) -> None:
    """An `asyncio.timeout` around acquire cancels the wait; nothing stays held."""

    async def scenario() -> None:
        async with (
            multilock.connect_async(memory_url) as holder,
            multilock.connect_async(memory_url) as waiter,
        ):
            lease = await holder.try_acquire("outer")
            assert lease is not None
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await waiter.acquire("outer")
            await lease.release()
            got = await apoll("free", lambda: holder.try_acquire("outer"), 5)
            await got.release()

    asyncio.run(scenario())


class _SlowExit(AsyncReleaseWatch):
    """A watch whose exit awaits (a connection to close): a cancellation can land there."""

    def __init__(self, exiting: asyncio.Event) -> None:
        self.exiting = exiting

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.exiting.set()
        await asyncio.sleep(0.5)


def test_grant_cancelled_while_the_watch_closes_is_released(memory_url: str) -> None:
    """The lease is granted, then the caller is cancelled while the watch's exit awaits:
    the kit releases the lease nobody will get (found on Redis, whose exit closes a
    pub/sub connection)."""

    async def scenario() -> None:
        async with multilock.connect_async(memory_url) as locker:
            exiting = asyncio.Event()
            locker.watch_released = lambda name: _SlowExit(exiting)  # type: ignore[attr-defined]
            task = asyncio.ensure_future(locker.acquire("slow-exit"))
            await asyncio.wait_for(exiting.wait(), 10)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
            again = await locker.try_acquire("slow-exit")
            assert again is not None, "the lease granted before the cancellation stayed held"
            await again.release()

    asyncio.run(scenario())


# -- woken, not polling: the backoff made so long that a poll would miss the bound -----

SLOW_POLL = 20.0
"""The first wait between two tries while these checks run: a waiter that only polls
sleeps at least half of it, past :data:`WOKEN_WITHIN` and its acquire's timeout."""
WOKEN_WITHIN = 1.0
"""Seconds from a release to the waiter's grant that a woken waiter keeps to."""


@pytest.fixture
def slow_poll(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every wait of a waiting acquire lasts at least 10 s unless the watch wakes it;
    the names whose waiters have been refused and wait (see ``observe_waits``)."""
    import multilock._locks.base as base

    monkeypatch.setattr(base, "FIRST_WAIT", SLOW_POLL)
    return observe_waits(monkeypatch)


def woken_sync(url: str, name: str, waiting: set[str]) -> float:
    """Seconds from the holder's release to the sync waiter's grant, the waiter being
    in its (slow) wait, ``waiting`` listing it; fails if it is not woken."""
    with multilock.connect(url) as holder, multilock.connect(url) as waiter:
        lease = holder.try_acquire(name)
        assert lease is not None
        got: list[float] = []
        failed: list[BaseException] = []

        def wait() -> None:
            try:
                mine = waiter.acquire(name, timeout=5)
                got.append(time.monotonic())
                mine.release()
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        poll(f"the waiter on {name} refused and waiting", lambda: name in waiting, 10)
        assert not got, got
        assert not failed, failed
        released = time.monotonic()
        lease.release()
        thread.join(10)
        assert not failed, f"the waiter was not woken by the release: {failed[0]!r}"
        took = got[0] - released
        assert took <= WOKEN_WITHIN, f"granted {took:.2f} s after the release"
        return took


async def woken_async(url: str, name: str, waiting: set[str]) -> float:
    """:func:`woken_sync` with async lockers."""
    async with (
        multilock.connect_async(url) as holder,
        multilock.connect_async(url) as waiter,
    ):
        lease = await holder.try_acquire(name)
        assert lease is not None
        acquiring = asyncio.ensure_future(waiter.acquire(name, timeout=5))

        async def refused() -> bool:
            return name in waiting

        await apoll(f"the waiter on {name} refused and waiting", refused, 10)
        assert not acquiring.done()
        released = time.monotonic()
        await lease.release()
        mine = await acquiring
        took = time.monotonic() - released
        await mine.release()
        assert took <= WOKEN_WITHIN, f"granted {took:.2f} s after the release"
        return took


def test_file_waiter_is_woken_by_the_release(file_url: str, slow_poll: set[str]) -> None:
    """file:// (inotify): the waiter is granted at once after a release, sync and async,
    though its backoff would have it sleep 10 s or more."""
    for i in range(3):
        woken_sync(file_url, f"woken-{i}", slow_poll)
        asyncio.run(woken_async(file_url, f"woken-async-{i}", slow_poll))


def test_file_waiter_is_woken_when_the_holder_dies(
    file_url: str, tmp_path: Path, slow_poll: set[str]
) -> None:
    """A holder killed (SIGKILL) wakes the waiter: the kernel's close of its descriptor
    is announced like a release."""
    ready = tmp_path / "ready"
    script = (
        "import multilock, pathlib, sys, time\n"
        f"lease = multilock.connect({file_url!r}).try_acquire('dies')\n"
        "assert lease is not None\n"
        f"pathlib.Path({str(ready)!r}).write_text('held')\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script])
    try:
        poll("the holder holds 'dies'", lambda: ready.exists() or None, 30)
        with multilock.connect(file_url) as waiter:
            got: list[float] = []
            thread = threading.Thread(target=lambda: got.append(_timed_acquire(waiter, "dies")))
            thread.start()
            poll("the waiter on 'dies' refused and waiting", lambda: "dies" in slow_poll, 10)
            assert not got
            killed = time.monotonic()
            holder.kill()
            thread.join(10)
            assert got, "the waiter was not woken by its holder's death"
            assert got[0] - killed <= WOKEN_WITHIN + 1, f"granted {got[0] - killed:.2f} s after"
    finally:
        holder.kill()
        holder.wait()


def _timed_acquire(locker: multilock.DistributedLock, name: str) -> float:
    lease = locker.acquire(name, timeout=5)
    lease.release()
    return time.monotonic()


def test_file_wait_leaves_nothing_behind(file_url: str) -> None:
    """A wait that times out, or is cancelled, leaves no descriptor open, no thread,
    and no lock on the file: the name is free the moment its holder lets go."""
    fds = set(os.listdir("/proc/self/fd"))
    threads = threading.active_count()
    with multilock.connect(file_url) as holder, multilock.connect(file_url) as waiter:
        lease = holder.try_acquire("left")
        assert lease is not None
        with pytest.raises(LockTimeout):
            waiter.acquire("left", timeout=0.2)

        async def cancelled() -> None:
            async with multilock.connect_async(file_url) as other:
                task = asyncio.ensure_future(other.acquire("left"))
                await asyncio.sleep(0.2)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                assert task.cancelled()

        asyncio.run(cancelled())
        assert threading.active_count() <= threads, "the wait left a thread running"
        lease.release()
        again = waiter.try_acquire("left")
        assert again is not None, "the name is not free after its holder released it"
        again.release()
    leftover = set(os.listdir("/proc/self/fd")) - fds
    # The pooled inotify instances stay, for the next waits; nothing else does.
    kinds = {os.readlink(f"/proc/self/fd/{fd}") for fd in leftover if _exists(fd)}
    assert kinds <= {"anon_inode:inotify"}, kinds


def _exists(fd: str) -> bool:
    return os.path.exists(f"/proc/self/fd/{fd}")
