"""What the sync and async lockers share: keys, bookkeeping, introspection, hooks."""

from __future__ import annotations

import contextlib
import logging
import socket
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from multilock.abc import LockInfo
from multilock.backend import Capability, LockURL, new_token
from multilock.errors import (
    BackendUnavailable,
    ConfigurationError,
    LockLost,
    MultilockError,
    NotOwner,
)

from ._config import CLUSTER, MIN_TTL, RedisConfig, admin_client, close_admin, parse_config
from ._errors import REDIS_ERRORS, translate
from ._keys import calls, fence_key, lock_key, name_of, scan_pattern, tick_key
from ._renewal import RenewedLease, Renewer, ttl_ms, unreplicated
from ._scripts import HELD_ELSEWHERE

__all__ = ["CHUNK", "CLAIM_RETENTION", "RedisHooks", "RedisLockerCommon", "expiry"]

_log = logging.getLogger("multilock.redis")
CHUNK = 250
"""Names per ACQUIRE_MANY call of a try_acquire_many: the calls are pipelined, so the
server runs one while the client makes the next or takes in the last one's answer
(1000 names in one call, then in chunks of 500, 250, 125: 10.2, 8.3, 7.5, 7.3 ms on
loopback; 10.6, 8.8, 7.9, 7.9 ms through a proxy adding 0.25 ms each way)."""
CLAIM_RETENTION = 7 * 86400.0
"""Seconds a tick claim's mark lives after the last claim it won (the key's expiry):
far longer than any replica comes late to a tick, and no mark outlives its job long."""
ClaimRequest = tuple[list[int], list[str], list[str | int]]


class RedisLockerCommon:
    """Mixed into both lockers: everything that does no I/O of its own."""

    capabilities = frozenset(
        {
            Capability.TTL,
            Capability.RENEWAL,
            Capability.FENCING,
            Capability.LOST_SIGNAL,
            Capability.CROSS_PROCESS,
            Capability.CROSS_HOST,
            Capability.BATCH,
            Capability.INTROSPECTION,
            Capability.TICK_CLAIM,
        }
    )
    claim_retention: float | None = CLAIM_RETENTION
    _url: LockURL

    def _setup(self, url: LockURL) -> float:
        self._config: RedisConfig = parse_config(url)
        self._per_slot = self._config.topology == CLUSTER
        config = self._config
        self._wait = (config.wait_replicas, config.wait_timeout) if config.wait_replicas else None
        self._held: set[Any] = set()
        self._renewer = Renewer(self._config, self._lost)
        return self._config.ttl

    @property
    def prefix(self) -> str:
        """The prefix of this locker's Redis keys."""
        return self._config.prefix

    def _acquire_request(
        self, names: list[str], ttl: float
    ) -> tuple[list[str], list[str | int], list[str]]:
        """Keys and arguments of the ACQUIRE script for ``names``, and their tokens."""
        keys = self._keys(names)
        tokens = _tokens(new_token(), range(len(names)))
        return keys, [self._ttl_ms(ttl), *tokens], tokens

    def _acquire_requests(
        self, names: list[str], ttl: float, made: list[tuple[list[str], list[str], list[str]]]
    ) -> Iterator[tuple[list[str], list[str | int]]]:
        """ACQUIRE_MANY requests for ``names``, :data:`CHUNK` names each (on a
        cluster, of one slot each), made as they are sent (see ``run_pipelined``);
        each one's names, keys and tokens go to ``made``."""
        ttl_ms = self._ttl_ms(ttl)  # checked now, before anything is sent
        batch = new_token()
        prefix = self._config.prefix
        slotted = [lock_key(name, prefix) for name in names] if self._per_slot else names

        def requests() -> Iterator[tuple[list[str], list[str | int]]]:
            for positions in calls(slotted, CHUNK, self._per_slot):
                chunk = [names[i] for i in positions]
                keys, tokens = self._keys(chunk), _tokens(batch, positions)
                made.append((chunk, keys, tokens))
                yield keys, [ttl_ms, *tokens]

        return requests()

    def _claim_requests(self, names: list[str], fires: list[int]) -> list[ClaimRequest]:
        """CLAIM requests for ``names`` at ``fires``: each one's positions, keys and
        arguments; :data:`CHUNK` names a call (on a cluster, of one slot each)."""
        keys = [tick_key(name, self._config.prefix) for name in names]
        retention = round(CLAIM_RETENTION * 1000)
        return [
            (positions, [keys[i] for i in positions], [retention, *(fires[i] for i in positions)])
            for positions in calls(keys, CHUNK, self._per_slot)
        ]

    @staticmethod
    def _claimed(request: ClaimRequest, answer: bytes | str, won: list[bool]) -> None:
        """Note in ``won`` the claims a CLAIM answer says were won."""
        flags = answer.decode() if isinstance(answer, bytes) else answer
        for i, flag in zip(request[0], flags, strict=True):
            won[i] = flag == "1"

    def _release_requests(
        self, keys: list[str], tokens: list[str]
    ) -> list[tuple[list[str], list[str | int]]]:
        """RELEASE_MANY requests freeing ``keys`` held under ``tokens``: one, or on a
        cluster one per slot."""
        return [
            ([keys[i] for i in positions], [tokens[i] for i in positions])
            for positions in calls(keys, max(1, len(keys)), self._per_slot)
        ]

    @staticmethod
    def _answer(answer: Any) -> Any:
        """One answer of a pipeline: itself, or raised if it is an error."""
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _unreplicated(self, doing: str, acked: int) -> BackendUnavailable:
        """The error of a write that fewer replicas than ``wait_replicas`` acknowledged."""
        return BackendUnavailable(
            f"redis at {self._url.masked} failed while {doing}: {unreplicated(self._config, acked)}"
            + (
                "; released, as a failover could have lost it"
                if doing == "acquiring"
                else "; the lease keeps the expiry last replicated"
            )
        )

    def _keys(self, names: list[str]) -> list[str]:
        """The lock and fence key of each of ``names``, in turn."""
        prefix = self._config.prefix
        keys: list[str] = []
        for name in names:
            keys += (lock_key(name, prefix), fence_key(name, prefix))
        return keys

    def _ttl_ms(self, ttl: float) -> int:
        """``ttl`` in milliseconds, once checked against what renewal can keep up with."""
        if ttl < MIN_TTL:
            raise ConfigurationError(f"ttl {ttl}s is too short for redis (at least {MIN_TTL}s)")
        return ttl_ms(ttl)

    def _track(self, leases: list[Any], start: float) -> None:
        """Hold and renew freshly acquired ``leases`` (acquired at monotonic ``start``)."""
        if leases:
            self._held.update(leases)
            self._renewer.add(leases, start)

    def _given_back(self, leases: list[Any]) -> tuple[list[str], list[str]]:
        """Stop holding ``leases`` (granted by a call that failed after all); their keys
        and tokens, to release."""
        for lease in leases:
            self._untrack(lease)
            lease._released = True
        return [lease.key for lease in leases], [lease.token for lease in leases]

    def _untrack(self, lease: Any) -> None:
        self._held.discard(lease)
        self._renewer.discard(lease)

    def _lost(self, lease: RenewedLease, reason: str) -> None:
        self._untrack(lease)
        lease.lost.set(reason)

    def _acquire_failed(
        self, key: str, token: str, ttl: float, exc: BaseException
    ) -> MultilockError:
        """The error of an acquire of ``key`` under ``token`` that failed with ``exc``. It
        may have run (its answer lost): the lock is freed once Redis answers."""
        self._renewer.release_later([(key, token, ttl)])
        return translate(exc, self._url, "acquiring")

    def _release_failed(self, lease: Any, exc: BaseException) -> bool:
        """``False`` for the release of ``lease`` that failed with ``exc`` when the lease
        was already reported lost (its key expires on its own), else the error raised.
        Either way, the release is tried again in the background."""
        self._renewer.release_later([(lease.key, lease.token, lease._ttl)])
        if lease.lost.is_set():
            return False
        raise translate(exc, self._url, "releasing") from None

    def _extended(self, lease: Any, answer: int, ttl: float, start: float) -> float:
        """Apply EXTEND's ``answer`` for ``lease``: the new ttl, or the error to raise."""
        if answer == 1:
            lease._ttl = ttl
            self._renewer.extended(lease, start)
            return ttl
        if answer == HELD_ELSEWHERE:
            reason = f"lock {lease.key!r} is held by another owner"
            self._lost(lease, reason)
            raise NotOwner(f"cannot extend {lease.name!r}: {reason}")
        reason = f"lock {lease.key!r} expired or was deleted on the server"
        self._lost(lease, reason)
        raise LockLost(f"cannot extend {lease.name!r}: {reason}")

    def _drop_all(self) -> tuple[list[str], list[str]]:
        """Stop renewing; the keys and tokens of the leases still held, now released."""
        self._renewer.stop()
        leases = list(self._held)
        self._held.clear()
        for lease in leases:
            lease._released = True
        return [lease.key for lease in leases], [lease.token for lease in leases]

    def _close_failed(self, exc: BaseException, count: int) -> None:
        _log.warning(
            "%s; %d lease(s) stay until their ttl runs out",
            translate(exc, self._url, "releasing leases on close"),
            count,
        )

    def locks(self) -> list[LockInfo]:
        """Every lock held under this locker's prefix and db, by any holder (SCAN; on a
        cluster, of every primary)."""
        prefix = self._config.prefix
        client = None
        try:
            client = admin_client(self._config)
            keys = [
                key.decode("utf-8", "surrogateescape")
                for key in client.scan_iter(match=scan_pattern(prefix), count=500)
            ]
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
                pipe.get(key + ":fence")
            answers = pipe.execute()
        except REDIS_ERRORS as exc:
            raise translate(exc, self._url, "listing locks") from None
        finally:
            if client is not None:
                close_admin(client)
        now = datetime.now(UTC)
        found = []
        for i, key in enumerate(keys):
            token, pttl, fence = answers[3 * i : 3 * i + 3]
            if token is None:
                continue  # released between SCAN and GET
            found.append(
                LockInfo(
                    key=key,
                    name=name_of(key, prefix),
                    holder=token.decode("utf-8", "replace"),
                    expires_at=now + timedelta(milliseconds=pttl) if pttl >= 0 else None,
                    details={"fencing_token": int(fence)} if fence is not None else {},
                )
            )
        return found


def expiry(ttl: float) -> datetime:
    """When a lease of ``ttl`` granted from now expires: taken before the request is
    sent, so that the server's expiry is never earlier than the one reported."""
    return datetime.now(UTC) + timedelta(seconds=ttl)


def _tokens(batch: str, positions: Iterable[int]) -> list[str]:
    """Owner tokens of the names at ``positions`` in a request: one new_token() per
    request, made unique per lease by its position, as PostgreSQL's batches do (a
    new_token() per name costs as much again)."""
    return [f"{batch}.{i:x}" for i in positions]


_PAUSE_MS = 5000  # at most this long, should the hook's own UNPAUSE never come


def _with(url: LockURL, *, query: str = "", userinfo: str | None = None) -> str:
    """``url`` with ``query`` added and, when given, its userinfo replaced."""
    parts = urlsplit(url.raw)
    netloc = parts.netloc
    if userinfo is not None:
        netloc = f"{userinfo}@{netloc.rpartition('@')[2]}"
    joined = "&".join(part for part in (parts.query, query) if part)
    return urlunsplit(parts._replace(netloc=netloc, query=joined))


class RedisHooks:
    """Conformance hooks of the Redis backend."""

    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        """A dead holder's key expires after its ttl; nothing frees it sooner."""
        return ttl

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        """Delete the lease's key from another connection; its renewal then fires ``lost``."""
        client = admin_client(parse_config(url))
        try:
            client.delete(lease.key)  # type: ignore[attr-defined]
        finally:
            close_admin(client)

    @contextlib.contextmanager
    def degraded(self, url: LockURL, state: str) -> Iterator[str | None]:
        """On a plain ``redis://`` server: ``busy`` pauses its writes (``CLIENT PAUSE
        WRITE``; the acquire script waits past a short ``socket_timeout``), ``refusing``
        names a disabled ACL user (the server refuses the login); both undone at the
        end. ``read-only`` (a replica) and the cluster and Sentinel topologies: none."""
        if url.scheme != "redis" or state not in ("busy", "refusing"):
            yield None
            return
        client = admin_client(parse_config(url))
        user = f"multilock-refused-{uuid.uuid4().hex[:12]}"
        try:
            if state == "busy":
                client.client_pause(_PAUSE_MS, all=False)  # writes only
                yield _with(url, query="socket_timeout=0.5s")
            else:
                client.acl_setuser(user, enabled=False)
                yield _with(url, userinfo=f"{user}:refused")
        finally:
            try:
                client.client_unpause()
                client.acl_deluser(user)
            finally:
                close_admin(client)

    def unreachable_url(self, url: LockURL) -> str | None:
        """A URL of the same topology naming a local port nobody listens on (refused
        at once)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if url.scheme == "redis+cluster":
            return f"redis+cluster://127.0.0.1:{port}/"
        if url.scheme == "redis+sentinel":
            return f"redis+sentinel://127.0.0.1:{port}/mymaster"
        return f"redis://127.0.0.1:{port}/0"
