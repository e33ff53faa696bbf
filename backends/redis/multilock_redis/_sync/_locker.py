# Generated from backends/redis/multilock_redis/_async/_locker.py
# by scripts/async_to_sync.py: do not edit; change that file and rerun.
"""The Redis locker and lease: the source of truth for both APIs.

The sync API in ``_sync/`` is generated from this module by
``scripts/async_to_sync.py``; change this file, then rerun the script.
"""

from __future__ import annotations

import time
from datetime import datetime
from types import TracebackType
from typing import Any

from multilock.backend import LeaseBase, LockerBase, LockURL, ReleaseWatch

from .._common import RedisLockerCommon, expiry
from .._config import SENTINEL, SyncClient
from .._errors import REDIS_ERRORS, translate
from .._keys import lock_key
from .._pubsub import sync_close_pubsub
from .._scripts import (
    ACQUIRE,
    ACQUIRE_MANY,
    CLAIM,
    EXTEND,
    RELEASE,
    RELEASE_MANY,
    parse_fences,
)
from .._started import SyncStartedLease, SyncStartedLocker
from ._cluster import new_link
from ._lua import SyncLink

__all__ = ["RedisLease", "RedisLocker", "RedisWatch"]


class RedisLease(SyncStartedLease, LeaseBase):
    """A lease on a Redis lock, renewed in the background while held."""

    __slots__ = ("_locker", "_ttl")
    key: str

    def __init__(
        self,
        locker: RedisLocker,
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

    def _release(self) -> bool:
        return self._locker._release_lease(self)

    def _extend(self, ttl: float | None) -> float:
        return self._locker._extend_lease(self, self._ttl if ttl is None else ttl)


class RedisLocker(SyncStartedLocker, RedisLockerCommon, LockerBase):
    """A locker on one Redis server (``redis://``, ``rediss://``, ``unix://``), a Redis
    Cluster (``redis+cluster://``) or the primary Sentinel names (``redis+sentinel://``)."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))
        self._link = new_link(self._config)

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        keys, args, tokens = self._acquire_request([name], ttl)
        start, expires_at = time.monotonic(), expiry(ttl)
        try:
            if self._wait is None:
                fence = self._link.run(ACQUIRE, keys, args)
            else:
                answers, acked = self._link.run_waited(ACQUIRE, [(keys, args)], self._wait)
                fence = self._answer(answers[0])
        except REDIS_ERRORS as exc:
            raise self._acquire_failed(keys[0], tokens[0], ttl, exc) from None
        if not fence:
            return None
        lease = self._lease(name, keys[0], tokens[0], fence, ttl, expires_at)
        if self._wait is not None and acked < self._wait[0]:
            self._give_back(*self._given_back([lease]), ttl)
            raise self._unreplicated("acquiring", acked)
        self._hold([lease], start)
        return lease

    def _lease(
        self, name: str, key: str, token: str, fence: int, ttl: float, expires_at: datetime
    ) -> RedisLease:
        """The lease an acquire was granted (not tracked yet)."""
        return RedisLease(self, name, key, token, fence, ttl, expires_at)

    def _grant(
        self,
        made: tuple[list[str], list[str], list[str]],
        answer: bytes | str,
        ttl: float,
        expires_at: datetime,
        result: dict[str, LeaseBase | None],
        granted: list[RedisLease],
    ) -> None:
        """The leases one ACQUIRE_MANY call's ``answer`` grants, its names, keys and
        tokens ``made`` (see ``_acquire_requests``): each to ``granted``, and to
        ``result`` under its name."""
        chunk, keys, tokens = made
        for j, fence in enumerate(parse_fences(answer)):
            if fence:
                lease = RedisLease(self, chunk[j], keys[2 * j], tokens[j], fence, ttl, expires_at)
                granted.append(lease)
                result[chunk[j]] = lease

    def _try_acquire_many(self, names: list[str], ttl: float) -> dict[str, LeaseBase | None]:
        if not names:
            return {}
        made: list[tuple[list[str], list[str], list[str]]] = []
        requests = self._acquire_requests(names, ttl, made)
        result: dict[str, LeaseBase | None] = dict.fromkeys(names)
        granted: list[RedisLease] = []
        start, expires_at = time.monotonic(), expiry(ttl)

        answered_calls: set[int] = set()

        def answered(i: int, answer: bytes | str) -> None:
            answered_calls.add(i)
            self._grant(made[i], answer, ttl, expires_at, result, granted)

        try:
            if self._wait is None:
                self._link.run_pipelined(ACQUIRE_MANY, requests, answered)
            else:
                answers, acked = self._link.run_waited(ACQUIRE_MANY, list(requests), self._wait)
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
            self._give_back(keys, tokens, ttl)
            if isinstance(exc, REDIS_ERRORS):
                raise translate(exc, self._url, "acquiring") from None
            raise
        self._hold(granted, start)
        return result

    def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        """One CLAIM script call (on a cluster, one per slot, pipelined)."""
        requests = self._claim_requests(names, fires)
        won = [False] * len(names)

        def answered(i: int, answer: bytes | str) -> None:
            self._claimed(requests[i], answer, won)

        try:
            if len(requests) == 1:
                answered(0, self._link.run(CLAIM, requests[0][1], requests[0][2]))
            else:
                calls = [(keys, args) for _, keys, args in requests]
                self._link.run_pipelined(CLAIM, calls, answered)
        except REDIS_ERRORS as exc:
            raise translate(exc, self._url, "claiming ticks") from None
        return won

    def _hold(self, leases: list[RedisLease], start: float) -> None:
        """Track and renew ``leases``, granted at monotonic ``start``; should that fail,
        release them before the error is raised: a granted lock is never orphaned."""
        try:
            self._track(leases, start)
        except BaseException:
            self._give_back(*self._given_back(leases), max(lease._ttl for lease in leases))
            raise

    def _give_back(self, keys: list[str], tokens: list[str], ttl: float) -> None:
        """Compare-and-delete ``keys`` under ``tokens``: set, or maybe set, by a call that
        then failed. What Redis cannot be asked now is tried again in the background
        until those keys (of ``ttl``) would have expired anyway."""
        try:
            self._release_all(keys, tokens)
        except REDIS_ERRORS:
            self._renewer.release_later(
                (key, token, ttl) for key, token in zip(keys, tokens, strict=True)
            )

    def _release_all(self, keys: list[str], tokens: list[str]) -> None:
        """Compare-and-delete ``keys`` held under ``tokens``: one script call (on a
        cluster, one per slot, pipelined)."""
        requests = self._release_requests(keys, tokens)
        if len(requests) == 1:
            self._link.run(RELEASE_MANY, *requests[0])
        elif requests:
            self._link.run_pipelined(RELEASE_MANY, requests, _ignore)

    def _release_lease(self, lease: RedisLease) -> bool:
        self._untrack(lease)
        try:
            freed = self._link.run(RELEASE, [lease.key], [lease.token])
        except REDIS_ERRORS as exc:
            return self._release_failed(lease, exc)
        return bool(freed)

    def _release_leases(self, leases: list[LeaseBase]) -> None:
        """Free ``leases`` in one script call (compare-and-delete each)."""
        mine = [lease for lease in leases if isinstance(lease, RedisLease)]
        keys, tokens = self._given_back(mine)
        try:
            self._release_all(keys, tokens)
        except REDIS_ERRORS as exc:
            self._renewer.release_later((lease.key, lease.token, lease._ttl) for lease in mine)
            if all(lease.lost.is_set() for lease in mine):
                return  # already reported lost: their keys expire on their own
            raise translate(exc, self._url, "releasing") from None

    def _extend_lease(self, lease: RedisLease, ttl: float) -> float:
        start = time.monotonic()
        request: tuple[list[str], list[str | int]] = ([lease.key], [lease.token, self._ttl_ms(ttl)])
        try:
            if self._wait is None:
                answers = self._link.run(EXTEND, *request)
            else:
                replies, acked = self._link.run_waited(EXTEND, [request], self._wait)
                answers = self._answer(replies[0])
                if answers[0] == 1 and acked < self._wait[0]:
                    # Extended on the primary only: its confirmed expiry stays put.
                    raise self._unreplicated("extending", acked)
        except REDIS_ERRORS as exc:
            raise translate(exc, self._url, "extending") from None
        return self._extended(lease, answers[0], ttl, start)

    def watch_released(self, name: str) -> ReleaseWatch:
        """A watch woken by the release announced on the name's channel (a cluster's and
        Sentinel's only sleep: their waiters poll)."""
        # A cluster's waiters poll (see RELEASE); so do Sentinel's: closing a pub/sub
        # connection of its managed pool took seconds a wait.
        if not isinstance(self._link, SyncLink) or self._config.topology == SENTINEL:
            return ReleaseWatch()
        return RedisWatch(self._link.client, lock_key(name, self.prefix))

    def _close(self) -> None:
        keys, tokens = self._drop_all()
        try:
            self._release_all(keys, tokens)
        except REDIS_ERRORS as exc:
            self._close_failed(exc, len(keys))
        finally:
            self._link.close()


class RedisWatch(ReleaseWatch):
    """A waiting acquire's watch: subscribed to the lock key's channel, on which the
    release scripts publish.

    The subscription is made at the first wait, after a failed try (an acquire of a
    free name costs nothing more), and that wait returns at once: the next try, made
    subscribed, sees any release the subscription could have missed. A pub/sub
    connection of the client's pool, for the wait only; should it fail (an ACL without
    pub/sub, a dropped connection), the acquire polls instead: the tries themselves
    report a Redis that cannot be asked.
    """

    def __init__(self, client: SyncClient, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._pubsub: Any = None  # None: not subscribed yet

    def wait(self, seconds: float) -> None:
        """Until a release is published on the channel, or ``seconds`` have passed."""
        if self._pubsub is None:
            # redis-py types the async pubsub(), not the sync one.
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
            try:
                self._pubsub.subscribe(self._channel)
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
                if self._pubsub.get_message(timeout=left) is not None:
                    return
            except REDIS_ERRORS:
                self.wakes = False
        left = until - time.monotonic()
        if left > 0:
            super().wait(left)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pubsub is not None:
            sync_close_pubsub(self._pubsub)


def _ignore(i: int, answer: object) -> None:
    """An answer nobody needs (how many locks a release freed)."""
