"""Checks across processes (crash, pause, contention) and against an unreachable backend."""

from __future__ import annotations

import asyncio
import functools
import signal
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import multilock
from multilock.abc import DEGRADED_STATES, Capability, SupportsDegrade
from multilock.errors import BackendUnavailable

from ._api import in_thread
from ._checks_ttl import SHORT_TTL, SLACK, fences_newer
from ._harness import Harness, eventually
from ._process import Child

__all__ = [
    "PROCESSES",
    "UNREACHABLE_BOUND",
    "crashed_holder_frees",
    "cross_process_exclusion",
    "paused_holder_is_noop",
    "unreachable_raises",
]

PROCESSES = 4
PROCESS_ROUNDS = 25
UNREACHABLE_BOUND = 10.0
"""Seconds within which an unreachable backend must raise BackendUnavailable."""


def _ttl(h: Harness) -> float | None:
    return SHORT_TTL if h.has(Capability.TTL) else None


def _crash_bound(h: Harness, ttl: float | None) -> float:
    """The hooks' bound; without hooks, a TTL lease may last its ttl, any other none."""
    if h.hooks is not None:
        return float(h.hooks.crash_release_bound(h.lock_url, ttl or 0.0))
    return ttl or 0.0


def _hold(h: Harness, label: str, ttl: float | None) -> tuple[Child, str]:
    name = h.name(label)
    return Child(h.kind, h.url, "hold", name, "-" if ttl is None else repr(ttl)), name


async def crashed_holder_frees(h: Harness) -> None:
    """A holder process killed with SIGKILL frees the name within the backend's bound."""
    h.requires(Capability.CROSS_PROCESS)
    ttl = _ttl(h)
    bound = _crash_bound(h, ttl) + SLACK
    child, name = _hold(h, "crash", ttl)
    async with child:
        await child.expect("acquired")
        await h.assert_held(name, "while another process holds it")
        child.signal(signal.SIGKILL)
        start = time.monotonic()
        await child.wait()
        await eventually(
            f"the lock of a SIGKILLed holder being freed (bound {bound:g} s)",
            lambda: h.is_free(name),
            bound,
        )
        assert time.monotonic() - start <= bound + SLACK


async def paused_holder_is_noop(h: Harness) -> None:
    """A holder frozen (SIGSTOP) past its ttl loses the name; resumed, its release and
    extend never touch the new holder's lock (the GC-pause case of fencing)."""
    h.requires(Capability.TTL, Capability.CROSS_PROCESS)
    bound = _crash_bound(h, SHORT_TTL) + SLACK
    child, name = _hold(h, "paused", SHORT_TTL)
    locker = await h.api.connect()
    async with child:
        stale_fence = await child.expect("acquired")
        await h.assert_held(name, "while another process holds it")
        child.signal(signal.SIGSTOP)

        async def take() -> Any:
            return await h.api.try_acquire(locker, name)

        fresh, _ = await eventually("the paused holder's lease expiring", take, bound)
        if h.has(Capability.FENCING):
            fences_newer(h, int(stale_fence), fresh)
        child.signal(signal.SIGCONT)
        await child.send("release")
        assert await child.expect("released") == "False", "the stale holder's release returned True"
        await h.assert_held(name, "after the stale holder released: release is a blind delete")
        await child.send("extend")
        failure = await child.expect("extend-failed")
        assert failure.endswith("True"), f"stale extend raised {failure.split()[0]}, not LockLost"
        await h.assert_held(name, "after the stale holder extended it")
        assert fresh.held
        assert await h.api.release(fresh) is True
        await child.send("exit")
        assert await child.wait() == 0


async def cross_process_exclusion(h: Harness) -> None:
    """4 processes bump a file counter non-atomically under the lock: no update is lost,
    and (FENCING) the tokens the holders saw strictly increase in holding order."""
    h.requires(Capability.CROSS_PROCESS)
    name = h.name("processes")
    with tempfile.TemporaryDirectory(prefix="multilock-conformance-") as tmp:
        path = Path(tmp) / "counter"
        path.write_text("0")
        children = [
            Child(h.kind, h.url, "count", name, str(PROCESS_ROUNDS), str(path))
            for _ in range(PROCESSES)
        ]
        for child in children:
            await child.__aenter__()
        try:
            await asyncio.gather(*(child.expect("done", within=60.0) for child in children))
        finally:
            for child in children:
                await child.__aexit__(None, None, None)
        total = PROCESSES * PROCESS_ROUNDS
        value, fences = _results(path)
        assert value == total, f"the counter guarded across {PROCESSES} processes is {value}"
        assert len(fences) == total
        if h.has(Capability.FENCING):
            tokens = [int(token) for token in fences]
            assert all(a < b for a, b in pairwise(tokens)), (
                f"fencing tokens across processes do not strictly increase: {tokens}"
            )


def _results(path: Path) -> tuple[int, list[str]]:
    """The counter's value and the fencing tokens the holders logged, in order."""
    return int(path.read_text()), Path(f"{path}.fences").read_text().split()


async def unreachable_raises(h: Harness) -> None:
    """An unreachable backend raises BackendUnavailable promptly; it never returns None."""
    if h.hooks is None:
        pytest.skip("backend ships no ConformanceHooks: no unreachable_url to try")
    url = h.hooks.unreachable_url(h.lock_url)
    if url is None:
        pytest.skip("in-process backend: ConformanceHooks.unreachable_url says it has no server")
    api = type(h.api)(url)
    start = time.monotonic()
    try:
        locker = await api.connect()
        result = await api.try_acquire(locker, h.name("unreachable"))
    except BackendUnavailable:
        result = "raised"
    finally:
        await api.close_all()
    elapsed = time.monotonic() - start
    masked = multilock.backend.mask_url(url)
    assert result == "raised", f"try_acquire on unreachable {masked} returned {result!r}"
    assert elapsed < UNREACHABLE_BOUND, (
        f"BackendUnavailable took {elapsed:.1f} s on {masked} (bound {UNREACHABLE_BOUND:g} s)"
    )


async def degraded_raises(h: Harness) -> None:
    """A backend reachable but busy, read-only or refusing raises BackendUnavailable
    (never None, which says "held by another lease"), where its hooks can make it so."""
    hooks: object = h.hooks
    if not isinstance(hooks, SupportsDegrade):
        pytest.skip("the backend's ConformanceHooks have no degraded(): nothing to put it in")
    tried = []
    for state in DEGRADED_STATES:
        manager = hooks.degraded(h.lock_url, state)
        url = await in_thread(manager.__enter__)
        try:
            if url is None:
                continue
            tried.append(state)
            result = await _try_once(type(h.api)(url), h.name(f"degraded-{state}"))
        finally:
            await in_thread(functools.partial(manager.__exit__, None, None, None))
        masked = multilock.backend.mask_url(url)
        assert result == "raised", (
            f"a {state} backend ({masked}) answered {result!r}: it must raise"
            " BackendUnavailable (None says another lease holds the name)"
        )
    if not tried:
        pytest.skip("the backend's degraded() can put it in none of " + ", ".join(DEGRADED_STATES))


async def _try_once(api: Any, name: str) -> object:
    """``"raised"`` if a new locker's try_acquire of ``name`` and its try_acquire_many
    of another name each raised BackendUnavailable, else what one of them returned."""
    try:
        locker = await api.connect()
        try:
            return await api.try_acquire(locker, name)
        except BackendUnavailable:
            pass
        try:
            return await api.try_acquire_many(locker, [f"{name}-many"])
        except BackendUnavailable:
            return "raised"
    except BackendUnavailable:
        return "raised"
    finally:
        await api.close_all()
