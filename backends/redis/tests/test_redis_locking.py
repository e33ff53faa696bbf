"""The Redis mechanism against a real server: round trips, ownership, renewal."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import multilock
from multilock.backend import LockURL
from multilock.errors import ConfigurationError, LockLost, MultilockError, NotOwner
from multilock.testing import poll
from multilock_redis import (
    AsyncRedisLease,
    AsyncRedisLocker,
    RedisLease,
    RedisLocker,
    fence_key,
    lock_key,
)
from multilock_redis._async._lua import AsyncLink
from multilock_redis._common import CHUNK
from multilock_redis._scripts import ACQUIRE, ACQUIRE_MANY
from multilock_redis._sync._lua import SyncLink

TTL = 0.3  # short, so that expiry and loss show within a second
# Renewal tests need the renewal thread scheduled within 2/3 of a ttl on a loaded
# shared machine: a little more room than TTL gives.
RENEW_TTL = 0.6


@pytest.fixture
def locker(redis_url: str) -> Iterator[RedisLocker]:
    """A sync locker on the shared server."""
    with multilock.connect(redis_url) as made:
        assert isinstance(made, RedisLocker)
        yield made


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the same db, to look at the keys from outside."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _held(lease: object) -> RedisLease:
    assert isinstance(lease, RedisLease), f"expected a lease, got {lease!r}"
    return lease


def _held_async(lease: object) -> AsyncRedisLease:
    assert isinstance(lease, AsyncRedisLease), f"expected a lease, got {lease!r}"
    return lease


def _link(locker: RedisLocker | AsyncRedisLocker) -> Any:
    """The locker's link to its one server (not a cluster's)."""
    link = locker._link
    assert isinstance(link, SyncLink | AsyncLink), link
    return link


def _count_round_trips(locker: RedisLocker) -> list[str]:
    """Record the name of every command ``locker`` sends, on its own connection
    or through its client's pool."""
    sent: list[str] = []
    client = _link(locker)._client
    connection: Any = _link(locker)._socket.connection
    connection.connect()  # the handshake (HELLO, SELECT...) is once per connection, not per call
    execute: Any = client.execute_command
    send: Any = connection.send_packed_command

    def executing(*args: Any, **options: Any) -> Any:
        sent.append(args[0])
        return execute(*args, **options)

    def sending(command: list[bytes], check_health: bool = True) -> None:
        sent.append(command[0].split(b"\r\n")[2].decode())  # *N, $len, then the name
        send(command, check_health)

    client.execute_command = executing
    connection.send_packed_command = sending
    return sent


def test_acquire_and_release_are_one_round_trip_each(locker: RedisLocker, name: str) -> None:
    sent = _count_round_trips(locker)
    lease = _held(locker.try_acquire(name))
    assert sent == ["EVALSHA"]
    assert lease.release()
    assert sent == ["EVALSHA", "EVALSHA"]


def test_try_acquire_many_is_one_round_trip(locker: RedisLocker, name: str) -> None:
    names = [f"{name}-{i}" for i in range(50)]
    held = locker.try_acquire(names[7])
    sent = _count_round_trips(locker)
    leases = locker.try_acquire_many(names)
    assert len(sent) == 1
    assert list(leases) == names
    assert leases[names[7]] is None
    assert all(leases[n] is not None for n in names if n != names[7])
    assert held is not None


def test_release_many_is_one_round_trip_and_spares_another_holder(
    redis_url: str, locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    names = [f"{name}-{i}" for i in range(40)]
    stale = _held(locker.try_acquire(names[0], ttl=TTL))
    _stale(locker, stale)  # its key expires and another locker takes the name
    # A long ttl: no renewal of these is sent while the round trips are counted.
    leases = [stale] + [_held(lease) for lease in locker.try_acquire_many(names[1:]).values()]
    with multilock.connect(redis_url) as other:
        poll("the name free", lambda: other.try_acquire(names[0], ttl=10) is not None, TTL * 5)
        sent = _count_round_trips(locker)
        locker.release_many(leases)  # the scheduler's, when lease holds end together
        assert sent == ["EVALSHA"]
        assert not any(lease.held for lease in leases)
        assert admin.exists(*(lease.key for lease in leases[1:])) == 0
        assert admin.get(stale.key) is not None  # the new holder's: untouched


def test_try_acquire_many_beyond_one_chunk_is_pipelined(locker: RedisLocker, name: str) -> None:
    names = [f"{name}-{i}" for i in range(2 * CHUNK + 10)]
    held = _held(locker.try_acquire(names[CHUNK + 3]))
    sent = _count_round_trips(locker)
    leases = locker.try_acquire_many(names)
    assert sent == ["EVALSHA"] * 3  # sent back to back, then the three answers read
    assert list(leases) == names
    assert leases[names[CHUNK + 3]] is None
    granted = [_held(leases[n]) for n in names if n != names[CHUNK + 3]]
    assert len({lease.token for lease in granted} | {held.token}) == len(names)
    assert all(lease.fencing_token == 1 for lease in granted)


def test_a_failing_chunk_leaves_nothing_held(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    names = [f"{name}-{i}" for i in range(2 * CHUNK + 10)]
    failing = names[CHUNK + 5]
    # INCR fails on a counter that is not a number: the second chunk's script errs
    # at its sixth name, after setting the five before it.
    admin.set(fence_key(failing, locker.prefix), "not a number")
    with pytest.raises(MultilockError, match="not an integer"):
        locker.try_acquire_many(names, ttl=60)
    assert not locker._held
    # The first and third chunks were granted, then released; the failing script
    # deleted what it had set, its own name's lock included.
    assert admin.exists(*[lock_key(n, locker.prefix) for n in names]) == 0
    admin.delete(fence_key(failing, locker.prefix))


@pytest.mark.parametrize("wrong", ["list", "string", "at-the-limit"])
def test_a_failing_fence_step_leaves_the_lock_unset(
    locker: RedisLocker, admin: redis.Redis, name: str, wrong: str
) -> None:
    fence = fence_key(name, locker.prefix)
    if wrong == "list":
        admin.rpush(fence, "x")
    elif wrong == "string":
        admin.set(fence, "x")
    else:
        admin.set(fence, 2**63 - 1)  # INCR would overflow
    with pytest.raises(MultilockError, match=r"WRONGTYPE|not an integer|overflow"):
        locker.try_acquire(name, ttl=60)
    assert admin.exists(lock_key(name, locker.prefix)) == 0
    with pytest.raises(MultilockError):
        locker.try_acquire_many([f"{name}-before", name, f"{name}-after"], ttl=60)
    assert admin.exists(*[lock_key(n, locker.prefix) for n in (name, f"{name}-before")]) == 0
    assert not locker._held
    admin.delete(fence)
    _held(locker.try_acquire(name)).release()  # and the name is free


def test_async_failing_fence_step_leaves_the_lock_unset(
    redis_url: str, admin: redis.Redis, name: str
) -> None:
    async def main() -> None:
        async with multilock.connect_async(redis_url) as locker:
            assert isinstance(locker, AsyncRedisLocker)
            admin.rpush(fence_key(name, locker.prefix), "x")
            with pytest.raises(MultilockError, match="WRONGTYPE"):
                await locker.try_acquire(name, ttl=60)
            with pytest.raises(MultilockError, match="WRONGTYPE"):
                await locker.try_acquire_many([f"{name}-before", name], ttl=60)
            assert (
                admin.exists(*[lock_key(n, locker.prefix) for n in (name, f"{name}-before")]) == 0
            )
            assert not locker._held
            admin.delete(fence_key(name, locker.prefix))

    asyncio.run(main())


def _refuse_to_hold(*_: object) -> None:
    raise RuntimeError("can't start new thread")


def test_an_error_after_the_grant_releases_the_lock(
    locker: RedisLocker, admin: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server granted the lock, then holding it failed (no thread for renewal, say):
    # the lock is released before the error is raised, never left to its ttl.
    monkeypatch.setattr(locker._renewer, "add", _refuse_to_hold)
    names = [name, *[f"{name}-{i}" for i in range(CHUNK + 1)]]
    with pytest.raises(RuntimeError, match="new thread"):
        locker.try_acquire(name, ttl=60)
    with pytest.raises(RuntimeError, match="new thread"):
        locker.try_acquire_many(names, ttl=60)
    assert admin.exists(*[lock_key(n, locker.prefix) for n in names]) == 0
    assert not locker._held


def test_async_error_after_the_grant_releases_the_lock(
    redis_url: str, admin: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with multilock.connect_async(redis_url) as locker:
            assert isinstance(locker, AsyncRedisLocker)
            monkeypatch.setattr(locker._renewer, "add", _refuse_to_hold)
            with pytest.raises(RuntimeError, match="new thread"):
                await locker.try_acquire(name, ttl=60)
            with pytest.raises(RuntimeError, match="new thread"):
                await locker.try_acquire_many([name, f"{name}-2"], ttl=60)
            assert admin.exists(lock_key(name, locker.prefix), lock_key(f"{name}-2")) == 0
            assert not locker._held

    asyncio.run(main())


def test_a_ttl_past_the_maximum_sets_nothing(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    # Issue 16: ttl=1e12 set the key for ~30,000 years, then raised a bare OverflowError.
    for ttl in (1e12, 10**30):
        with pytest.raises(ConfigurationError, match="maximum"):
            locker.try_acquire(name, ttl=ttl)
        assert admin.exists(lock_key(name, locker.prefix)) == 0
    lease = _held(locker.try_acquire(name, ttl=60))
    before = admin.pttl(lease.key)
    with pytest.raises(ConfigurationError, match="maximum"):
        lease.extend(1e12)
    assert 0 < admin.pttl(lease.key) <= before  # not pushed out by the refused extend
    lease.release()


def test_try_acquire_many_gives_large_fencing_tokens_whole(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    # The batch answers in one string: Lua would print 10^14 and above as 1e+14.
    admin.set(fence_key(name, locker.prefix), 123_456_789_012_345)
    leases = locker.try_acquire_many([name, f"{name}-other"])
    assert _held(leases[name]).fencing_token == 123_456_789_012_346
    assert _held(leases[f"{name}-other"]).fencing_token == 1


def test_an_acquire_sent_twice_answers_its_own_fencing_token_again(
    admin: redis.Redis, name: str
) -> None:
    # redis-py's cluster pipeline sends a command again after a connection error,
    # though the first may have run: that must not read as "held elsewhere".
    keys = [lock_key(name), fence_key(name)]
    first = admin.eval(ACQUIRE.source, 2, *keys, 10_000, "token-1")
    assert first == 1
    assert admin.eval(ACQUIRE.source, 2, *keys, 10_000, "token-1") == first
    assert admin.eval(ACQUIRE.source, 2, *keys, 10_000, "token-2") == 0  # someone else
    other = [lock_key(f"{name}-b"), fence_key(f"{name}-b")]
    batch: list[str | int] = [*keys, *other, 10_000, "token-1", "token-3"]
    assert admin.eval(ACQUIRE_MANY.source, 4, *batch) == b"1 1"  # ours again, and a new one
    assert admin.eval(ACQUIRE_MANY.source, 4, *batch) == b"1 1"
    assert admin.get(fence_key(f"{name}-b")) == b"1"  # the replay bumped nothing


def test_try_acquire_many_of_nothing_asks_nothing(locker: RedisLocker) -> None:
    sent = _count_round_trips(locker)
    assert locker.try_acquire_many([]) == {}
    assert sent == []


def test_a_call_finding_the_connection_busy_goes_through_the_pool(
    locker: RedisLocker, name: str
) -> None:
    sent = _count_round_trips(locker)
    assert _link(locker)._gate.enter()  # as if another thread were awaiting a reply on it
    try:
        lease = _held(locker.try_acquire(name))
        assert lease.release()
    finally:
        _link(locker)._gate.leave()
    assert sent == ["EVALSHA", "EVALSHA"]  # both through execute_command, none on the socket
    assert locker.try_acquire(name) is not None  # and the connection is used again


def test_max_connections_bounds_the_pool_not_the_lockers_own_connection(
    redis_url: str, name: str
) -> None:
    with multilock.connect(redis_url, max_connections=1) as locker:
        assert isinstance(locker, RedisLocker)
        lease = _held(locker.try_acquire(name))  # on the locker's own connection
        assert _link(locker)._gate.enter()
        try:
            assert locker.try_acquire(name) is None  # through the pool's one connection
        finally:
            _link(locker)._gate.leave()
        assert lease.release()


def test_concurrent_async_calls_share_the_connection_and_the_pool(
    redis_url: str, name: str
) -> None:
    async def main() -> None:
        async with multilock.connect_async(redis_url) as locker:
            assert isinstance(locker, AsyncRedisLocker)
            names = [f"{name}-{i}" for i in range(20)]
            leases = await asyncio.gather(*(locker.try_acquire(n) for n in names))
            held = [_held_async(lease) for lease in leases]
            assert all(lease.fencing_token for lease in held)
            assert await asyncio.gather(*(lease.release() for lease in held)) == [True] * 20
            assert not _link(locker)._gate._busy

    asyncio.run(main())


def test_fencing_token_is_the_counter_and_increases(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    tokens: list[int] = []
    for _ in range(3):
        lease = _held(locker.try_acquire(name))
        assert lease.fencing_token is not None
        tokens.append(lease.fencing_token)
        lease.release()
    assert tokens == sorted(set(tokens))
    assert int(admin.get(fence_key(name)) or 0) == tokens[-1]


def _stale(locker: RedisLocker | AsyncRedisLocker, lease: Any) -> None:
    """Make ``lease`` a stale holder: like a paused process, it stops renewing."""
    locker._renewer.discard(lease)


def test_stale_release_and_extend_never_touch_the_new_holder(
    redis_url: str, admin: redis.Redis, name: str
) -> None:
    with RedisLocker(LockURL.parse(redis_url)) as a, multilock.connect(redis_url) as b:
        stale = _held(a.try_acquire(name, ttl=TTL))
        _stale(a, stale)
        new = _held(poll("the name taken", lambda: b.try_acquire(name, ttl=10), TTL * 5))
        with pytest.raises(NotOwner):
            stale.extend()
        assert stale.lost.is_set()
        assert stale.release() is False
        assert admin.get(stale.key) == new.token.encode()
        assert 0 < admin.pttl(new.key) <= 10_000
        assert new.release()


def test_extend_after_expiry_is_lock_lost(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    lease = _held(locker.try_acquire(name, ttl=TTL))
    _stale(locker, lease)
    poll("the key gone", lambda: not admin.exists(lease.key), TTL * 5)
    with pytest.raises(LockLost) as info:
        lease.extend()
    assert not isinstance(info.value, NotOwner)
    assert lease.lost.is_set()


def test_extend_sets_the_new_ttl(locker: RedisLocker, admin: redis.Redis, name: str) -> None:
    lease = _held(locker.try_acquire(name, ttl=5))
    lease.extend(60)
    assert 55_000 < admin.pttl(lease.key) <= 60_000
    lease.release()
    assert not admin.exists(lease.key)


def test_lost_fires_when_the_key_is_deleted(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    lease = _held(locker.try_acquire(name, ttl=TTL))
    fired: list[str] = []
    lease.lost.add_callback(fired.append)
    admin.delete(lease.key)
    assert lease.lost.wait(TTL)  # found at the next renewal, a third of a ttl later
    assert fired
    assert "deleted" in fired[0]
    assert not lease.held
    assert lease.release() is False


def test_lost_fires_when_another_holder_has_the_key(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    lease = _held(locker.try_acquire(name, ttl=TTL))
    admin.set(lease.key, "someone-else")
    assert lease.lost.wait(TTL)
    assert "another holder" in (lease.lost.reason or "")
    assert admin.get(lease.key) == b"someone-else"  # a lost lease's release leaves it alone
    lease.release()
    assert admin.get(lease.key) == b"someone-else"


def _contender(redis_url: str, name: str, stop: threading.Event) -> Callable[[], int]:
    """Start a thread that keeps trying to take ``name``; returns how often it got it."""
    wins = [0]

    def run() -> None:
        with multilock.connect(redis_url) as other:
            while not stop.is_set():
                lease = other.try_acquire(name, ttl=RENEW_TTL)
                if lease is not None:
                    wins[0] += 1
                    lease.release()
                time.sleep(0.01)

    thread = threading.Thread(target=run)
    thread.start()

    def result() -> int:
        stop.set()
        thread.join(10)
        return wins[0]

    return result


def test_renewal_survives_a_blocked_event_loop(
    redis_url: str, admin: redis.Redis, name: str
) -> None:
    async def job() -> None:
        async with multilock.connect_async(redis_url) as locker:
            lease = _held_async(await locker.try_acquire(name, ttl=RENEW_TTL))
            wins = _contender(redis_url, name, threading.Event())
            time.sleep(RENEW_TTL * 2.5)  # noqa: ASYNC251  (the point: block the event loop)
            assert wins() == 0
            assert lease.held
            assert admin.get(lease.key) == lease.token.encode()
            assert await lease.release()

    asyncio.run(job())


def test_renewal_survives_a_cpu_bound_sync_job(
    locker: RedisLocker, admin: redis.Redis, name: str
) -> None:
    lease = _held(locker.try_acquire(name, ttl=RENEW_TTL))
    wins = _contender(redis_url=locker._config.client_url, name=name, stop=threading.Event())
    deadline = time.monotonic() + RENEW_TTL * 2.5
    total = 0
    while time.monotonic() < deadline:  # pure Python work holding the GIL
        total += sum(i * i for i in range(2000))
    assert wins() == 0
    assert lease.held
    assert admin.get(lease.key) == lease.token.encode()
    assert total > 0
    assert lease.release()


def test_many_leases_renew_in_one_round_trip_per_wake(locker: RedisLocker, name: str) -> None:
    leases = locker.try_acquire_many([f"{name}-{i}" for i in range(40)], ttl=RENEW_TTL)
    rounds: list[int] = []
    original: Any = locker._renewer._renew

    def counting(link: Any, batch: list[Any]) -> None:
        rounds.append(len(batch))
        original(link, batch)

    locker._renewer._renew = counting  # type: ignore[method-assign]
    time.sleep(RENEW_TTL * 2)  # let several renewal rounds happen
    assert all(lease is not None and lease.held for lease in leases.values())
    assert 3 <= len(rounds) <= 10  # about three per ttl, each carrying every lease
    assert max(rounds) == 40


def test_close_releases_everything_and_stops_the_thread(redis_url: str, name: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    locker = multilock.connect(redis_url)
    assert isinstance(locker, RedisLocker)
    leases = locker.try_acquire_many([f"{name}-a", f"{name}-b"], ttl=TTL)
    thread = locker._renewer._thread
    assert thread is not None
    assert thread.is_alive()
    locker.close()
    assert not any(admin.exists(_held(lease).key) for lease in leases.values())
    thread.join(TTL * 2)
    assert not thread.is_alive()
    admin.close()


def test_locks_lists_the_holders(locker: RedisLocker, name: str) -> None:
    weird = name + "{}%/ ü"
    lease = _held(locker.try_acquire(weird, ttl=10))
    found = {info.name: info for info in locker.locks()}
    assert found[weird].holder == lease.token
    assert found[weird].details["fencing_token"] == lease.fencing_token
    assert found[weird].expires_at is not None


def test_async_api_end_to_end(redis_url: str, name: str) -> None:
    async def main() -> None:
        async with multilock.connect_async(redis_url) as a, multilock.connect_async(redis_url) as b:
            lease = _held_async(await a.try_acquire(name, ttl=TTL))
            assert await b.try_acquire(name) is None
            many = await b.try_acquire_many([name, name + "-x"])
            assert many[name] is None
            assert many[name + "-x"] is not None
            await lease.extend(5)
            assert await lease.release()
            assert not await lease.release()
            again = _held_async(await b.try_acquire(name))
            assert again.fencing_token is not None
            assert lease.fencing_token is not None
            assert again.fencing_token > lease.fencing_token

    asyncio.run(main())
