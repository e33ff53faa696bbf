"""Checks of the plain contract: try-semantics, release, names, batches, close."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import multilock
from multilock.abc import Capability, LockInfo
from multilock.errors import InvalidLockName, LockLost

from ._harness import Harness, eventually

__all__ = [
    "AWKWARD_NAMES",
    "TRY_BOUND",
    "capabilities_agree",
    "close_releases",
    "different_names_independent",
    "introspection",
    "lease_attributes",
    "names_awkward",
    "release_idempotent",
    "release_on_exception",
    "release_reacquire",
    "try_acquire_many",
    "try_acquire_many_large",
    "try_semantics",
]

TRY_BOUND = 1.0
"""Seconds ``try_acquire`` may take on a name held elsewhere: it must not wait."""

AWKWARD_NAMES = {
    "unicode": "замок-锁-🔒",
    "1KiB": "k" * 1024,
    "1KiB-other": "k" * 1023 + "j",
    "slash": "a/b",
    "slash-quoted": "a%2Fb",
    "root": "/",
    "dotdot": "../..",
    "spaces": "nightly reindex",
    "percent": "100%",
    "braces": "{job}",
    "colon-fence": "job:fence",
    "job": "job",
    "Job": "Job",
    "empty": "",
    "newline": "line\nbreak",
    "nul": "nul\x00byte",
}
"""Names a backend must either keep distinct or refuse with ``InvalidLockName``."""


async def try_semantics(h: Harness) -> None:
    """A held name gives ``None`` at once -- to other lockers and to the holder's own."""
    name = h.name("try")
    holder, other = await h.api.connect(), await h.api.connect()
    lease = await h.api.try_acquire(holder, name)
    assert lease is not None, f"a free name {name!r} was refused"
    for locker in (other, other, holder, other):
        start = time.monotonic()
        got = await h.api.try_acquire(locker, name)
        elapsed = time.monotonic() - start
        assert got is None, f"a second lease on {name!r} was granted while the first is held"
        assert elapsed < TRY_BOUND, (
            f"try_acquire on a held name took {elapsed:.2f} s: it must not wait (< {TRY_BOUND} s)"
        )
    assert lease.held, "the holder's lease no longer says held after others tried"
    assert await h.api.release(lease) is True
    # No queueing: the refused attempts left no claim behind.
    await h.assert_free(name, "after its holder released it (a refused try queued?)")


async def lease_attributes(h: Harness) -> None:
    """name, key, token, fencing_token, expires_at and held say what the contract says."""
    locker = await h.api.connect()
    ttl = 5.0
    first = await h.api.try_acquire(locker, h.name("attrs"), ttl=ttl)
    second = await h.api.try_acquire(locker, h.name("attrs-2"), ttl=ttl)
    assert first is not None
    assert second is not None
    assert first.name == h.name("attrs"), f"lease.name is {first.name!r}"
    assert isinstance(first.key, str | int), f"lease.key is a {type(first.key).__name__}"
    assert first.key != second.key, "two names share one backend key"
    for lease in (first, second):
        assert isinstance(lease.token, str), "lease.token must be a str"
        assert lease.token, "lease.token must not be empty"
    assert first.token != second.token, "two acquisitions share an owner token"
    if h.has(Capability.FENCING):
        assert type(first.fencing_token) is int, f"fencing_token is {first.fencing_token!r}"
    else:
        assert first.fencing_token is None, (
            f"fencing_token is {first.fencing_token!r} but the backend does not declare FENCING"
        )
    now = datetime.now(UTC)
    if h.has(Capability.TTL):
        assert first.expires_at is not None, "a TTL backend must say when the lease expires"
        assert first.expires_at.tzinfo is not None, "expires_at must be timezone-aware (UTC)"
        slack = timedelta(seconds=2)
        assert now - slack < first.expires_at <= now + timedelta(seconds=ttl) + slack, (
            f"expires_at {first.expires_at} is not about {ttl} s from now ({now})"
        )
    elif h.has(Capability.SESSION):
        assert first.expires_at is None, (
            f"a session-bound lease (SESSION without TTL) has expires_at={first.expires_at}"
        )
    assert first.held
    assert not first.lost.is_set()
    await h.api.extend(first)  # a held lease extends without error (a no-op when session-bound)
    assert first.held
    assert await h.api.release(first) is True
    assert not first.held, "a released lease still says held"
    assert first.lost.is_set() is False, "releasing is not losing: lost must not fire"


async def capabilities_agree(h: Harness) -> None:
    """Sync and async lockers declare the same, coherent capabilities."""
    async_locker: Any = multilock.connect_async(h.url)
    try:
        declared = frozenset(async_locker.capabilities)
    finally:
        await async_locker.aclose()
    assert declared == h.capabilities, (
        f"the sync locker declares {sorted(h.capabilities)}, the async one {sorted(declared)}"
    )
    for capability in declared:
        assert isinstance(capability, Capability), f"{capability!r} is not a Capability"
    if Capability.RENEWAL in declared:
        assert Capability.TTL in declared, "RENEWAL is declared without TTL"
    if Capability.CROSS_HOST in declared:
        assert Capability.CROSS_PROCESS in declared, "CROSS_HOST is declared without CROSS_PROCESS"
    if Capability.TICK_CLAIM in declared:
        locker = await h.api.connect()
        assert callable(getattr(locker, "claim_ticks", None)), (
            "TICK_CLAIM is declared but the locker has no claim_ticks()"
        )


async def release_reacquire(h: Harness) -> None:
    """A released name can be taken again, by the same locker and by another."""
    name = h.name("reacquire")
    mine, other = await h.api.connect(), await h.api.connect()
    tokens = set()
    for locker in (mine, mine, other, mine):
        lease = await h.api.try_acquire(locker, name)
        assert lease is not None, f"{name!r} was refused after it had been released"
        tokens.add(lease.token)
        assert await h.api.release(lease) is True, "release() of a held lease must return True"
        assert not lease.held
    assert len(tokens) == 4, "owner tokens were reused across acquisitions"


async def release_idempotent(h: Harness) -> None:
    """A second release returns False without error; extend after release raises LockLost."""
    name = h.name("idempotent")
    locker = await h.api.connect()
    lease = await h.api.try_acquire(locker, name)
    assert lease is not None
    assert await h.api.release(lease) is True
    assert await h.api.release(lease) is False, "a second release() must return False"
    with pytest.raises(LockLost):
        await h.api.extend(lease)
    successor = await h.api.try_acquire(await h.api.connect(), name)
    assert successor is not None, "released name could not be taken by another locker"
    assert await h.api.release(lease) is False
    await h.assert_held(name, "while its new holder has it (an old lease's release freed it)")
    assert await h.api.release(successor) is True


async def release_on_exception(h: Harness) -> None:
    """``with lease:`` that raises releases the lock and lets the exception through."""
    name = h.name("exception")
    lease = await h.api.try_acquire(await h.api.connect(), name)
    assert lease is not None
    with pytest.raises(ValueError, match="job failed"):
        await h.api.unwind(lease, ValueError("job failed"))
    assert not lease.held
    await h.assert_free(name, "after an exception left its `with lease:` block")


async def different_names_independent(h: Harness) -> None:
    """Holding one name never blocks another, however alike their spelling."""
    holder, other = await h.api.connect(), await h.api.connect()
    base = h.name("indep")
    held = [base, base + "-x"]
    leases = [await h.api.try_acquire(holder, name) for name in held]
    assert all(lease is not None for lease in leases)
    for name in (base + "2", base + ":fence", base + "-y", base.upper(), base[:-1]):
        start = time.monotonic()
        lease = await h.api.try_acquire(other, name)
        assert lease is not None, f"{name!r} was refused while only {held} are held"
        assert time.monotonic() - start < TRY_BOUND
        assert await h.api.release(lease) is True
    for lease in leases:
        assert await h.api.release(lease) is True


async def names_awkward(h: Harness) -> None:
    """Awkward names work and stay distinct, or raise InvalidLockName with a message."""
    locker = await h.api.connect()
    accepted: dict[str, Any] = {}
    refused: dict[str, str] = {}
    prefix = h.name("awk") + "-"
    for label, suffix in AWKWARD_NAMES.items():
        for name in (suffix, prefix + suffix) if label == "empty" else (prefix + suffix,):
            try:
                lease = await h.api.try_acquire(locker, name)
            except InvalidLockName as exc:
                refused[name] = str(exc)
                continue
            # Acquired while all the others are held: distinct names map to distinct keys.
            assert lease is not None, (
                f"{label} name {name!r} was refused (None) while no one else holds it:"
                " it collides with another name, or should raise InvalidLockName"
            )
            assert lease.name == name, f"lease.name {lease.name!r} is not the name given {name!r}"
            accepted[name] = lease
    assert accepted, f"every awkward name was refused: {refused}"
    for name, message in refused.items():
        assert message.strip(), f"InvalidLockName for {name[:40]!r} has no message"
    for name in accepted:
        await h.assert_held(name, "while this check holds it")
    for name, lease in accepted.items():
        assert await h.api.release(lease) is True
        await h.assert_free(name, "after it was released")
    for bad in (42, None, b"bytes"):
        with pytest.raises((InvalidLockName, TypeError)):
            await h.api.try_acquire(locker, bad)  # type: ignore[arg-type]


async def try_acquire_many(h: Harness) -> None:
    """A lease or None per name, in order; duplicates refused; nothing held after an error."""
    mine, other = await h.api.connect(), await h.api.connect()
    names = [h.name(f"many-{i}") for i in range(4)]
    blocker = await h.api.try_acquire(other, names[2])
    assert blocker is not None
    result = await h.api.try_acquire_many(mine, names)
    assert list(result) == names, f"results are not keyed by the names in order: {list(result)}"
    assert result[names[2]] is None, "try_acquire_many granted a name held elsewhere"
    for name in names[:2] + names[3:]:
        assert result[name] is not None, f"free name {name!r} was refused by try_acquire_many"
        assert result[name].name == name
        await h.assert_held(name, "after try_acquire_many granted it")
    for lease in result.values():
        if lease is not None:
            assert await h.api.release(lease) is True
    assert await h.api.release(blocker) is True
    fresh = [h.name(f"many-dup-{i}") for i in range(3)]
    with pytest.raises(InvalidLockName):
        await h.api.try_acquire_many(mine, [fresh[0], fresh[1], fresh[0]])
    for name in fresh:
        await h.assert_free(name, "after try_acquire_many refused a duplicate")
    empty = await h.api.try_acquire_many(mine, [])
    assert dict(empty) == {}, "try_acquire_many([]) must return an empty mapping"


async def try_acquire_many_large(h: Harness) -> None:
    """BATCH backends take many names in one call."""
    h.requires(Capability.BATCH)
    locker = await h.api.connect()
    names = [h.name(f"batch-{i}") for i in range(200)]
    result = await h.api.try_acquire_many(locker, names)
    assert list(result) == names
    assert all(lease is not None for lease in result.values()), "free names were refused"
    await h.assert_held(names[-1], "after try_acquire_many granted it")
    for lease in result.values():
        assert await h.api.release(lease) is True


async def introspection(h: Harness) -> None:
    """INTROSPECTION: another locker's ``locks()`` lists a held lock, then no longer."""
    h.requires(Capability.INTROSPECTION)
    name = h.name("introspect")
    holder, viewer = await h.api.connect(), await h.api.connect()
    lease = await h.api.try_acquire(holder, name)
    assert lease is not None

    async def listed() -> bool:
        found = await h.api.locks(viewer)
        for info in found:
            assert isinstance(info, LockInfo), f"locks() gave a {type(info).__name__}"
        return any(info.name == name or info.key == lease.key for info in found)

    assert await listed(), f"locks() does not list {name!r} (key {lease.key!r}) while it is held"
    assert await h.api.release(lease) is True

    async def gone() -> bool:
        return not await listed()

    await eventually(f"{name!r} leaving locks() after its release", gone, 2.0)


async def close_releases(h: Harness) -> None:
    """Closing a locker releases its leases; their later release cannot touch a new holder."""
    names = [h.name("close-a"), h.name("close-b")]
    closing, other = await h.api.connect(), await h.api.connect()
    old = [await h.api.try_acquire(closing, name) for name in names]
    assert all(lease is not None for lease in old)
    await h.api.close(closing)
    new = []
    for name in names:
        lease = await h.api.try_acquire(other, name)
        assert lease is not None, f"{name!r} is still held after its locker was closed"
        new.append(lease)
    for lease in old:
        assert not lease.held, "a lease of a closed locker still says held"
        assert await h.api.release(lease) is False, "release() after close() must return False"
    for name in names:
        await h.assert_held(name, "by its new holder after the closed locker's lease released")
    for lease in new:
        assert await h.api.release(lease) is True
