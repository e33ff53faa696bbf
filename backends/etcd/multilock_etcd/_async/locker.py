"""The etcd locker and lease: the source of truth for both APIs.

The sync API in ``_sync/`` is generated from this module by ``scripts/async_to_sync.py``;
change this file, then rerun the script.

An acquire is one transaction (``_wire.acquire_request``) on the locker's etcd lease for
that ttl, granted on the first acquire of a ttl; a batch is one transaction of nested
ones per :data:`~multilock_etcd._wire.BATCH` names. Release is a compare-and-delete on
the key's create revision; extend confirms that revision, moves the key to the lease of
the new ttl if it differs, and keeps that lease alive at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, TypeVar

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, LockURL, Outcome
from multilock.errors import LockLost

from .._common import EtcdLockerCommon, Request, grant_request
from .._errors import NOT_SENT, TRANSPORT_ERRORS, GatewayError, translate
from .._keeper import Slot
from .._wire import (
    BATCH,
    acquire_many_request,
    acquire_request,
    check_request,
    granted,
    header_revision,
    release_many_request,
    release_request,
)
from ._gateway import AsyncGateway

__all__ = ["AsyncEtcdLease", "AsyncEtcdLocker"]

# async-only
T = TypeVar("T")
# async-only: the tasks of _follow, kept alive (the loop holds tasks only weakly)
_following: set[asyncio.Future[Any]] = set()


# async-only: the started path
def _follow(outcome: Outcome[T], work: Coroutine[Any, Any, T]) -> None:
    """Settle ``outcome`` as ``work``, run in a task (the task path, after a started
    request met what only it handles)."""
    task = asyncio.ensure_future(work)
    _following.add(task)

    def settle(done: asyncio.Future[T]) -> None:
        _following.discard(done)
        if done.cancelled():
            outcome.set_exception(asyncio.CancelledError())
        elif (error := done.exception()) is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(done.result())

    task.add_done_callback(settle)


class AsyncEtcdLease(AsyncLeaseBase):
    """A lease on an etcd lock: a key on the locker's etcd lease, kept alive while held.

    ``fencing_token`` is the key's create revision.
    """

    __slots__ = ("_locker", "_slot", "_ttl", "_value", "_wire_key")
    key: str
    fencing_token: int

    def __init__(
        self,
        locker: AsyncEtcdLocker,
        name: str,
        request: Request,
        i: int,
        revision: int,
        slot: Slot,
        ttl: float,
        expires_at: datetime | None = None,
    ) -> None:
        key = locker._keys_of(name)[0]
        super().__init__(name, key, request.tokens[i], revision, ttl, expires_at=expires_at)
        self._locker = locker
        self._wire_key = request.keys[i]
        self._value = request.values[i]
        self._slot = slot
        self._ttl = ttl

    async def _release(self) -> bool:
        return await self._locker._release_lease(self)

    # async-only: the started path
    def _start_release(self) -> Outcome[bool] | None:
        return self._locker._start_release_lease(self)

    async def _extend(self, ttl: float | None) -> float:
        return await self._locker._extend_lease(self, self._ttl if ttl is None else ttl)


class AsyncEtcdLocker(EtcdLockerCommon, AsyncLockerBase):
    """A locker on one etcd cluster (``etcd://host:2379,host:2379/prefix``)."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))
        self._gateway = AsyncGateway(self._config)

    async def _slot(self, ttl: float) -> Slot:
        """The etcd lease of this locker's locks of ``ttl``, granted if there is none."""
        slot = self._keeper.slot(ttl)
        if slot is not None:
            return slot
        start = time.monotonic()
        answer = await self._gateway.call("/v3/lease/grant", grant_request(ttl), "granting a lease")
        slot, extra = self._keeper.adopt(ttl, int(answer["ID"]), int(answer["TTL"]), start)
        if extra is not None:  # another acquire of this ttl granted one first
            try:
                await self._revoke([extra])
            except (GatewayError, *TRANSPORT_ERRORS):
                pass  # unused, it expires after its ttl
        return slot

    async def _revoke(self, ids: list[int]) -> None:
        for lease_id in ids:
            body = json.dumps({"ID": str(lease_id)}).encode()
            await self._gateway.request("/v3/lease/revoke", body)

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        return (await self._acquire([name], ttl))[name]

    async def _try_acquire_many(
        self, names: list[str], ttl: float
    ) -> dict[str, AsyncLeaseBase | None]:
        if not names:
            return {}
        return await self._acquire(names, ttl)

    async def _acquire(self, names: list[str], ttl: float) -> dict[str, AsyncLeaseBase | None]:
        self._check_ttl(ttl)
        result: dict[str, AsyncLeaseBase | None] = dict.fromkeys(names)
        slot = await self._slot(ttl)
        request: Request | None = None
        try:
            for request in self._requests(names):
                try:
                    answer = await self._send_acquire(request, slot)
                except GatewayError as exc:
                    if not exc.lease_not_found or any(result.values()):
                        raise
                    # The lease expired unseen (a long pause): nothing was granted on it.
                    self._slot_gone(slot)
                    slot = await self._slot(ttl)
                    answer = await self._send_acquire(request, slot)
                self._granted(result, request, answer, slot, ttl)
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            if request is not None:
                self._unanswered(request, slot, exc)
            await self._give_back([lease for lease in result.values() if lease is not None])
            raise translate(exc, self._url, "acquiring") from None
        return result

    # async-only: the started path
    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None] | None:
        """The acquire sent now on an idle connection, its outcome settled when etcd
        answers (see ``AsyncGateway.start``); ``None`` when there is no etcd lease of
        ``ttl`` yet or no idle connection: the task path (``_try_acquire``) goes then.
        An answer that asks for more than a grant (the etcd lease gone, a token to
        renew) hands the acquire to the task path, which asks again."""
        self._check_ttl(ttl)
        slot = self._keeper.slot(ttl)
        if slot is None:
            return None
        connection = self._gateway.ready()
        if connection is None:
            return None
        (request,) = self._requests([name])
        outcome: Outcome[AsyncLeaseBase | None] = Outcome(loop=asyncio.get_running_loop())

        def done(answer: dict[str, Any] | None, error: BaseException | None) -> None:
            try:
                if answer is not None:
                    result: dict[str, AsyncLeaseBase | None] = {name: None}
                    self._granted(result, request, answer, slot, ttl)
                    outcome.set_result(result[name])
                elif isinstance(error, GatewayError) and (
                    error.lease_not_found or error.auth_expired
                ):  # refused, nothing applied
                    if error.lease_not_found:
                        self._slot_gone(slot)
                    _follow(outcome, self._try_acquire(name, ttl))
                else:
                    assert error is not None
                    self._unanswered(request, slot, error)
                    outcome.set_exception(translate(error, self._url, "acquiring"))
            except Exception as exc:  # never into the protocol's data_received
                if not outcome.done():
                    outcome.set_exception(exc)

        body = acquire_request(request.keys[0], request.values[0], slot.id)
        self._gateway.start(connection, b"/v3/kv/txn", body, done)
        return outcome

    def _unanswered(self, request: Request, slot: Slot, exc: BaseException) -> None:
        """An acquire of ``request`` failed with ``exc``: if its answer was lost (not an
        error answer, and it was sent), its keys may be ours: have them deleted if so."""
        if not isinstance(exc, (GatewayError, *NOT_SENT)):
            for key, value in zip(request.keys, request.values, strict=True):
                self._keeper.orphan(key, value, slot.id)

    async def _send_acquire(self, request: Request, slot: Slot) -> dict[str, Any]:
        if len(request.keys) == 1:
            body = acquire_request(request.keys[0], request.values[0], slot.id)
        else:
            body = acquire_many_request(request.keys, request.values, slot.id)
        return await self._gateway.request("/v3/kv/txn", body)

    def _granted(
        self,
        result: dict[str, AsyncLeaseBase | None],
        request: Request,
        answer: dict[str, Any],
        slot: Slot,
        ttl: float,
    ) -> None:
        """Put in ``result`` a lease per name that one transaction granted."""
        revision = header_revision(answer)
        single = len(request.names) == 1
        grants = [bool(answer.get("succeeded"))] if single else granted(answer)
        leases = []
        expires_at = None
        for i, name in enumerate(request.names):
            if grants[i]:
                lease = AsyncEtcdLease(self, name, request, i, revision, slot, ttl, expires_at)
                expires_at = lease.expires_at  # one transaction granted them all: one expiry
                leases.append(lease)
                result[name] = lease
        self._track(leases, slot)

    async def _give_back(self, leases: list[Any]) -> None:
        """Release ``leases``, granted by a call that failed after all (best effort)."""
        for lease in leases:
            self._untrack(lease)
            lease._released = True
        try:
            await self._release_all(leases)
        except (GatewayError, *TRANSPORT_ERRORS):
            for lease in leases:
                self._keeper.orphan(lease._wire_key, lease._value, lease._slot.id)

    async def _release_lease(self, lease: AsyncEtcdLease) -> bool:
        self._untrack(lease)
        try:
            answer = await self._gateway.request(
                "/v3/kv/txn", release_request(lease._wire_key, lease.fencing_token)
            )
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            return self._release_failed(lease, exc)
        return bool(answer.get("succeeded"))

    # async-only: the started path
    def _start_release_lease(self, lease: AsyncEtcdLease) -> Outcome[bool] | None:
        """``lease``'s release sent now on an idle connection (see
        :meth:`_start_try_acquire`); ``None``, with nothing done, when there is none."""
        connection = self._gateway.ready()
        if connection is None:
            return None
        self._untrack(lease)  # before it is sent: the watch must not report our own delete
        outcome: Outcome[bool] = Outcome(loop=asyncio.get_running_loop())

        def done(answer: dict[str, Any] | None, error: BaseException | None) -> None:
            try:
                if answer is not None:
                    outcome.set_result(bool(answer.get("succeeded")))
                elif isinstance(error, GatewayError) and error.auth_expired:
                    _follow(outcome, self._release_lease(lease))  # refused, nothing applied
                else:
                    assert error is not None
                    outcome.set_result(self._release_failed(lease, error))
            except Exception as exc:  # never into the protocol's data_received
                if not outcome.done():
                    outcome.set_exception(exc)

        body = release_request(lease._wire_key, lease.fencing_token)
        self._gateway.start(connection, b"/v3/kv/txn", body, done)
        return outcome

    def _release_failed(self, lease: AsyncEtcdLease, exc: BaseException) -> bool:
        """``False`` for a lease already reported lost (its key goes with its etcd
        lease); else the error of the release."""
        if lease.lost.is_set():
            return False
        raise translate(exc, self._url, "releasing") from None

    async def _release_leases(self, leases: list[AsyncLeaseBase]) -> None:
        """Free ``leases`` in one transaction per batch (compare-and-delete each)."""
        mine = [lease for lease in leases if isinstance(lease, AsyncEtcdLease)]
        for lease in mine:
            self._untrack(lease)
        try:
            await self._release_all(mine)
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            if all(lease.lost.is_set() for lease in mine):
                return  # already reported lost: their keys go with their etcd lease
            raise translate(exc, self._url, "releasing") from None

    async def _release_all(self, leases: list[AsyncEtcdLease]) -> None:
        for start in range(0, len(leases), BATCH):
            chunk = leases[start : start + BATCH]
            body = release_many_request(
                [lease._wire_key for lease in chunk], [lease.fencing_token for lease in chunk]
            )
            await self._gateway.request("/v3/kv/txn", body)

    async def _extend_lease(self, lease: AsyncEtcdLease, ttl: float) -> float:
        self._check_ttl(ttl)
        slot = await self._slot(ttl)
        moving = slot is not lease._slot
        body = check_request(
            lease._wire_key, lease.fencing_token, lease._value if moving else None, slot.id
        )
        start = time.monotonic()
        try:
            answer = await self._gateway.request("/v3/kv/txn", body)
            self._checked(lease, answer)
            keepalive = json.dumps({"ID": str(slot.id)}).encode()
            alive = await self._gateway.request("/v3/lease/keepalive", keepalive)
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            raise translate(exc, self._url, "extending") from None
        if int(alive.get("result", {}).get("TTL", 0)) <= 0:
            self._slot_gone(slot)
            self._lost(lease, "its etcd lease expired or was revoked")
            raise LockLost(f"cannot extend {lease.name!r}: its etcd lease expired or was revoked")
        if moving:
            self._keeper.move(lease, slot)
            lease._slot = slot
        self._keeper.confirmed(slot, start)
        lease._ttl = ttl
        return ttl

    async def _close(self) -> None:
        leases, ids = self._drop_all()
        try:
            await self._revoke(ids)  # deletes every key on them: ours, orphans too
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            self._close_failed(exc, len(leases))
        finally:
            await self._gateway.aclose()
