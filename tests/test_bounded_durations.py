"""A ttl that cannot be represented is refused before any server is asked, on every
backend, sync and async, single and many and extend -- and leaves nothing behind."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest

import multilock
from multilock import Capability
from multilock.backend import MAX_DURATION
from multilock.errors import ConfigurationError

BACKENDS = ["memory", "file", "postgres", "redis", "zookeeper"]
# Past the 100-year maximum, each in another form: a float (the Redis key of issue 16
# lived ~30,000 years), a huge int, an int past the largest float, the largest
# timedelta, a string of days.
TOO_LONG: list[object] = [
    1e12,
    10**30,
    10**400,
    timedelta.max,
    f"{int(MAX_DURATION // 86400) + 1}d",
]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest) -> str:
    """The URL of each backend in turn (a server backend skips when it is down)."""
    return str(request.getfixturevalue(f"{request.param}_url"))


def _name() -> str:
    return f"bounded-{uuid.uuid4().hex}"


def _nothing_left(url: str, names: list[str]) -> None:
    """Prove from an independent locker that no lock on ``names`` is held by anyone."""
    with multilock.connect(url) as other:
        if Capability.INTROSPECTION in other.capabilities:
            listed = {info.name for info in other.locks()}  # type: ignore[attr-defined]
            assert not listed & set(names)
        leases = other.try_acquire_many(names)
        assert all(lease is not None for lease in leases.values()), leases
        for lease in leases.values():
            assert lease is not None
            lease.release()


@pytest.mark.parametrize("ttl", TOO_LONG, ids=repr)
def test_sync_calls_refuse_a_ttl_past_the_maximum(url: str, ttl: object) -> None:
    one, many = _name(), [_name(), _name()]
    with multilock.connect(url) as locker:
        with pytest.raises(ConfigurationError, match="maximum"):
            locker.try_acquire(one, ttl=ttl)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="maximum"):
            locker.try_acquire_many(many, ttl=ttl)  # type: ignore[arg-type]
        _nothing_left(url, [one, *many])
        lease = locker.try_acquire(one)
        assert lease is not None
        with pytest.raises(ConfigurationError, match="maximum"):
            lease.extend(ttl)  # type: ignore[arg-type]
        assert lease.held  # a refused extend changed nothing
        assert lease.release() is True
    _nothing_left(url, [one])


@pytest.mark.parametrize("ttl", TOO_LONG, ids=repr)
def test_async_calls_refuse_a_ttl_past_the_maximum(url: str, ttl: object) -> None:
    one, many = _name(), [_name(), _name()]

    async def main() -> None:
        async with multilock.connect_async(url) as locker:
            with pytest.raises(ConfigurationError, match="maximum"):
                await locker.try_acquire(one, ttl=ttl)  # type: ignore[arg-type]
            with pytest.raises(ConfigurationError, match="maximum"):
                await locker.try_acquire_many(many, ttl=ttl)  # type: ignore[arg-type]
            await asyncio.to_thread(_nothing_left, url, [one, *many])
            lease = await locker.try_acquire(one)
            assert lease is not None
            with pytest.raises(ConfigurationError, match="maximum"):
                await lease.extend(ttl)  # type: ignore[arg-type]
            assert lease.held
            assert await lease.release() is True

    asyncio.run(main())
    _nothing_left(url, [one])


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "soon", True])
def test_other_bad_ttls_are_refused_the_same_way(url: str, ttl: Any) -> None:
    name = _name()
    with multilock.connect(url) as locker:
        with pytest.raises(ConfigurationError, match="invalid ttl"):
            locker.try_acquire(name, ttl=ttl)
        with pytest.raises(ConfigurationError, match="invalid ttl"):
            locker.try_acquire_many([name], ttl=ttl)
    _nothing_left(url, [name])


def test_the_maximum_itself_is_accepted(url: str) -> None:
    name = _name()
    with multilock.connect(url) as locker:
        lease = locker.try_acquire(name, ttl=MAX_DURATION)
        assert lease is not None
        lease.extend(MAX_DURATION)
        assert lease.release() is True
    _nothing_left(url, [name])


def test_a_ttl_option_past_the_maximum_is_refused(url: str) -> None:
    separator = "&" if "?" in url else "?"
    with pytest.raises(ConfigurationError, match="maximum"):
        multilock.connect(f"{url}{separator}ttl=1e12")


@pytest.mark.parametrize(
    "option", ["skew_tolerance", "misfire_grace", "stop_timeout", "lease_ttl", "leader_poll"]
)
def test_scheduler_durations_past_the_maximum_are_refused(memory_url: str, option: str) -> None:
    options: dict[str, Any] = {option: 10**30}
    if option == "leader_poll":
        options["coordination"] = "leader"
    with pytest.raises(ConfigurationError, match=f"invalid {option}: .* maximum"):
        multilock.Scheduler(lock=memory_url, **options)


def test_job_durations_past_the_maximum_are_refused(memory_url: str) -> None:
    scheduler = multilock.Scheduler(lock=memory_url, metrics=False)
    with pytest.raises(ConfigurationError, match=r"invalid timeout: .* maximum"):
        scheduler.add_job(lambda: None, multilock.every(minutes=1), timeout=1e12)
    with pytest.raises(ConfigurationError, match=r"invalid misfire_grace: .* maximum"):
        scheduler.add_job(lambda: None, multilock.every(minutes=1), misfire_grace=1e12)
    for interval in ("1e12", 10**30):
        with pytest.raises(ConfigurationError, match="maximum"):
            multilock.every(interval)
