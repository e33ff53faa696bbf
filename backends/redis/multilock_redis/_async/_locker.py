"""The Redis locker and lease: the source of truth for both APIs.

The sync API in ``_sync/`` is generated from this module by
``scripts/async_to_sync.py``; change this file, then rerun the script.
"""

from __future__ import annotations

import time
from datetime import datetime
from types import TracebackType
from typing import Any

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, AsyncReleaseWatch, LockURL

from .._common import RedisLockerCommon, expiry
from .._config import SENTINEL, AsyncClient
from .._errors import REDIS_ERRORS, translate
from .._keys import lock_key
from .._pubsub import async_close_pubsub
from .._scripts import (
    ACQUIRE,
    ACQUIRE_MANY,
    CLAIM,
    EXTEND,
    RELEASE,
    RELEASE_MANY,
    parse_fences,
)
from .._started import AsyncStartedLease, AsyncStartedLocker
from ._cluster import new_link
from ._lua import AsyncLink

__all__ = ["AsyncRedisLease", "AsyncRedisLocker", "AsyncRedisWatch"]


class AsyncRedisLease(AsyncStartedLease, AsyncLeaseBase):
    """A lease on a Redis lock, renewed in the background while held."""

    __slots__ = ("_locker", "_ttl")
    key: str

    def __init__(
        self,
        locker: AsyncRedisLocker,
        name: str,
        key: str,
        token: str,
        fencing_token: int,
        ttl: float,
        expires_at: datetime | None = None,
    ) -> None:
        super().__init__(name, key, token, fencing_token, ttl, expires_at=expires_at)
        self._locker = locker
        self._ttl = ttl

    async def _release(self) -> bool:
        return await self._locker._release_lease(self)

    async def _extend(self, ttl: float | None) -> float:
        return await self._locker._extend_lease(self, self._ttl if ttl is None else ttl)


class AsyncRedisLocker(AsyncStartedLocker, RedisLockerCommon, AsyncLockerBase):
    """A locker on one Redis server (``redis://``, ``rediss://``, ``unix://``), a Redis
    Cluster (``redis+cluster://``) or the primary Sentinel names (``redis+sentinel://``)."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))
        self._link = new_link(self._config)

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        keys, args, tokens = self._acquire_request([name], ttl)
        start, expires_at = time.monotonic(), expiry(ttl)
        try:
            if self._wait is None:
                fence = await self._link.run(ACQUIRE, keys, args)
            else:
                answers, acked = await self._link.run_waited(ACQUIRE, [(keys, args)], self._wait)
                fence = self._answer(answers[0])
        except REDIS_ERRORS as exc:
            raise self._acquire_failed(keys[0], tokens[0], ttl, exc) from None
        if not fence:
            return None
        lease = self._lease(name, keys[0], tokens[0], fence, ttl, expires_at)
        if self._wait is not None and acked < self._wait[0]:
            await self._give_back(*self._given_back([lease]), ttl)
            raise self._unreplicated("acquiring", acked)
        await self._hold([lease], start)
        return lease

    def _lease(
        self, name: str, key: str, token: str, fence: int, ttl: float, expires_at: datetime
    ) -> AsyncRedisLease:
        """The lease an acquire was granted (not tracked yet)."""
        return AsyncRedisLease(self, name, key, token, fence, ttl, expires_at)

    def _grant(
        self,
        made: tuple[list[str], list[str], list[str]],
        answer: bytes | str,
        ttl: float,
        expires_at: datetime,
        result: dict[str, AsyncLeaseBase | None],
        granted: list[AsyncRedisLease],
    ) -> None:
        """The leases one ACQUIRE_MANY call's ``answer`` grants, its names, keys and
        tokens ``made`` (see ``_acquire_requests``): each to ``granted``, and to
        ``result`` under its name."""
        chunk, keys, tokens = made
        for j, fence in enumerate(parse_fences(answer)):
            if fence:
                lease = AsyncRedisLease(
                    self, chunk[j], keys[2 * j], tokens[j], fence, ttl, expires_at
                )
                granted.append(lease)
                result[chunk[j]] = lease

    async def _try_acquire_many(
        self, names: list[str], ttl: float
    ) -> dict[str, AsyncLeaseBase | None]:
        if not names:
            return {}
        made: list[tuple[list[str], list[str], list[str]]] = []
        requests = self._acquire_requests(names, ttl, made)
        result: dict[str, AsyncLeaseBase | None] = dict.fromkeys(names)
        granted: list[AsyncRedisLease] = []
        start, expires_at = time.monotonic(), expiry(ttl)

        answered_calls: set[int] = set()

        def answered(i: int, answer: bytes | str) -> None:
            answered_calls.add(i)
            self._grant(made[i], answer, ttl, expires_at, result, granted)

        try:
            if self._wait is None:
                await self._link.run_pipelined(ACQUIRE_MANY, requests, answered)
            else:
                answers, acked = await self._link.run_waited(
                    ACQUIRE_MANY, list(requests), self._wait
                )
                for i, answer in enumerate(answers):
                    answered(i, self._answer(answer))
                if granted and acked < self._wait[0]:
                    raise self._unreplicated("acquiring", acked)
        except BaseException as exc:
            # A call may have been answered before another failed, and one whose
            # answer was lost may have run: nothing stays held.
            keys, tokens = self._given_back(granted)
            for i, (_, made_keys, made_tokens) in enumerate(made):
                if i not in answered_calls:
                    keys += made_keys[::2]
                    tokens += made_tokens
            await self._give_back(keys, tokens, ttl)
            if isinstance(exc, REDIS_ERRORS):
                raise translate(exc, self._url, "acquiring") from None
            raise
        await self._hold(granted, start)
        return result

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        """One CLAIM script call (on a cluster, one per slot, pipelined)."""
        requests = self._claim_requests(names, fires)
        won = [False] * len(names)

        def answered(i: int, answer: bytes | str) -> None:
            self._claimed(requests[i], answer, won)

        try:
            if len(requests) == 1:
                answered(0, await self._link.run(CLAIM, requests[0][1], requests[0][2]))
            else:
                calls = [(keys, args) for _, keys, args in requests]
                await self._link.run_pipelined(CLAIM, calls, answered)
        except REDIS_ERRORS as exc:
            raise translate(exc, self._url, "claiming ticks") from None
        return won

    async def _hold(self, leases: list[AsyncRedisLease], start: float) -> None:
        """Track and renew ``leases``, granted at monotonic ``start``; should that fail,
        release them before the error is raised: a granted lock is never orphaned."""
        try:
            self._track(leases, start)
        except BaseException:
            await self._give_back(*self._given_back(leases), max(lease._ttl for lease in leases))
            raise

    async def _give_back(self, keys: list[str], tokens: list[str], ttl: float) -> None:
        """Compare-and-delete ``keys`` under ``tokens``: set, or maybe set, by a call that
        then failed. What Redis cannot be asked now is tried again in the background
        until those keys (of ``ttl``) would have expired anyway."""
        try:
            await self._release_all(keys, tokens)
        except REDIS_ERRORS:
            self._renewer.release_later(
                (key, token, ttl) for key, token in zip(keys, tokens, strict=True)
            )

    async def _release_all(self, keys: list[str], tokens: list[str]) -> None:
        """Compare-and-delete ``keys`` held under ``tokens``: one script call (on a
        cluster, one per slot, pipelined)."""
        requests = self._release_requests(keys, tokens)
        if len(requests) == 1:
            await self._link.run(RELEASE_MANY, *requests[0])
        elif requests:
            await self._link.run_pipelined(RELEASE_MANY, requests, _ignore)

    async def _release_lease(self, lease: AsyncRedisLease) -> bool:
        self._untrack(lease)
        try:
            freed = await self._link.run(RELEASE, [lease.key], [lease.token])
        except REDIS_ERRORS as exc:
            return self._release_failed(lease, exc)
        return bool(freed)

    async def _release_leases(self, leases: list[AsyncLeaseBase]) -> None:
        """Free ``leases`` in one script call (compare-and-delete each)."""
        mine = [lease for lease in leases if isinstance(lease, AsyncRedisLease)]
        keys, tokens = self._given_back(mine)
        try:
            await self._release_all(keys, tokens)
        except REDIS_ERRORS as exc:
            self._renewer.release_later((lease.key, lease.token, lease._ttl) for lease in mine)
            if all(lease.lost.is_set() for lease in mine):
                return  # already reported lost: their keys expire on their own
            raise translate(exc, self._url, "releasing") from None

    async def _extend_lease(self, lease: AsyncRedisLease, ttl: float) -> float:
        start = time.monotonic()
        request: tuple[list[str], list[str | int]] = ([lease.key], [lease.token, self._ttl_ms(ttl)])
        try:
            if self._wait is None:
                answers = await self._link.run(EXTEND, *request)
            else:
                replies, acked = await self._link.run_waited(EXTEND, [request], self._wait)
                answers = self._answer(replies[0])
                if answers[0] == 1 and acked < self._wait[0]:
                    # Extended on the primary only: its confirmed expiry stays put.
                    raise self._unreplicated("extending", acked)
        except REDIS_ERRORS as exc:
            raise translate(exc, self._url, "extending") from None
        return self._extended(lease, answers[0], ttl, start)

    def watch_released(self, name: str) -> AsyncReleaseWatch:
        """A watch woken by the release announced on the name's channel (a cluster's and
        Sentinel's only sleep: their waiters poll)."""
        # A cluster's waiters poll (see RELEASE); so do Sentinel's: closing a pub/sub
        # connection of its managed pool took seconds a wait.
        if not isinstance(self._link, AsyncLink) or self._config.topology == SENTINEL:
            return AsyncReleaseWatch()
        return AsyncRedisWatch(self._link.client, lock_key(name, self.prefix))

    async def _close(self) -> None:
        keys, tokens = self._drop_all()
        try:
            await self._release_all(keys, tokens)
        except REDIS_ERRORS as exc:
            self._close_failed(exc, len(keys))
        finally:
            await self._link.aclose()


class AsyncRedisWatch(AsyncReleaseWatch):
    """A waiting acquire's watch: subscribed to the lock key's channel, on which the
    release scripts publish.

    The subscription is made at the first wait, after a failed try (an acquire of a
    free name costs nothing more), and that wait returns at once: the next try, made
    subscribed, sees any release the subscription could have missed. A pub/sub
    connection of the client's pool, for the wait only; should it fail (an ACL without
    pub/sub, a dropped connection), the acquire polls instead: the tries themselves
    report a Redis that cannot be asked.
    """

    def __init__(self, client: AsyncClient, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._pubsub: Any = None  # None: not subscribed yet

    async def wait(self, seconds: float) -> None:
        """Until a release is published on the channel, or ``seconds`` have passed."""
        if self._pubsub is None:
            # redis-py types the async pubsub(), not the sync one.
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
            try:
                await self._pubsub.subscribe(self._channel)
            except REDIS_ERRORS:
                pass  # self.wakes stays False: poll
            else:
                self.wakes = True
                return  # try again now, subscribed
        until = time.monotonic() + seconds
        while self.wakes and (left := until - time.monotonic()) > 0:
            try:
                # None: the time is up, or a message that is not a publication (the
                # subscription's confirmation), which does not end the wait.
                if await self._pubsub.get_message(timeout=left) is not None:
                    return
            except REDIS_ERRORS:
                self.wakes = False
        left = until - time.monotonic()
        if left > 0:
            await super().wait(left)

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pubsub is not None:
            await async_close_pubsub(self._pubsub)


def _ignore(i: int, answer: object) -> None:
    """An answer nobody needs (how many locks a release freed)."""
