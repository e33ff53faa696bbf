"""What the sync and async lockers share: keys, bookkeeping, introspection, hooks."""

from __future__ import annotations

import json
import logging
import math
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from multilock.abc import LockInfo
from multilock.backend import Capability, LockURL, new_token
from multilock.errors import ConfigurationError, LockLost, NotOwner

from ._config import MIN_TTL, EtcdConfig
from ._errors import translate
from ._keeper import Keeper, Slot
from ._sync._gateway import Gateway
from ._watcher import Watcher
from ._wire import BATCH, b64, exists_in_failure, prefix_end, unb64

__all__ = ["CAPABILITIES", "EtcdHooks", "EtcdLockerCommon", "Request", "grant_request"]

_log = logging.getLogger("multilock.etcd")
CAPABILITIES = frozenset(
    {
        Capability.TTL,
        Capability.RENEWAL,
        Capability.FENCING,
        Capability.LOST_SIGNAL,
        Capability.CROSS_PROCESS,
        Capability.CROSS_HOST,
        Capability.BATCH,
        Capability.INTROSPECTION,
    }
)
_REQUEST_BYTES = 512 * 1024
"""Most bytes of keys and values in one batch transaction: etcd refuses requests over
``--max-request-bytes``, 1.5 MiB by default, and base64 adds a third."""
_KEYS_CACHED = 4096
"""Names whose keys (text and base64) a locker keeps, for names locked again and again."""
_LESSOR_TICK = 0.5
"""etcd looks for expired leases every half second: a dead holder's key may outlive its
lease's TTL by that much."""


class Request:
    """The keys of one transaction of an acquire: names, keys (base64), tokens (base64)."""

    __slots__ = ("keys", "names", "tokens", "values")

    def __init__(self, names: list[str], keys: list[str], tokens: list[str]) -> None:
        self.names = names
        self.keys = keys
        self.tokens = tokens
        self.values = [b64(token.encode()) for token in tokens]


def grant_request(ttl: float) -> bytes:
    """A lease of ``ttl`` seconds, rounded up to etcd's whole seconds."""
    return json.dumps({"TTL": str(max(1, math.ceil(ttl)))}).encode()


class EtcdLockerCommon:
    """Mixed into both lockers: everything that does no I/O of its own."""

    capabilities = CAPABILITIES
    # etcd takes requests up to --max-request-bytes (1.5 MiB by default); batches are cut
    # to fit (see _requests).
    max_name_length: int | None = 32 * 1024
    _url: LockURL

    def _setup(self, url: LockURL) -> float:
        self._config = EtcdConfig.from_url(url)
        self._held: set[Any] = set()
        self._keeper = Keeper(self._config, self._lost)
        self._watcher = Watcher(self._config, self._lost)
        self._keys: dict[str, tuple[str, str]] = {}
        return self._config.ttl

    @property
    def prefix(self) -> str:
        """The prefix of this locker's etcd keys."""
        return self._config.prefix.decode("utf-8", "surrogateescape")

    def _check_ttl(self, ttl: float) -> None:
        if ttl < MIN_TTL:
            raise ConfigurationError(f"ttl {ttl}s is too short for etcd (at least {MIN_TTL}s)")

    def _key(self, name: str) -> bytes:
        return self._config.prefix + name.encode("utf-8")

    def _keys_of(self, name: str) -> tuple[str, str]:
        """``name``'s key as text and in base64 (kept for the next acquire of ``name``)."""
        keys = self._keys.get(name)
        if keys is None:
            if len(self._keys) >= _KEYS_CACHED:
                self._keys.clear()
            key = self._key(name)
            keys = self._keys[name] = (key.decode("utf-8"), b64(key))
        return keys

    def _requests(self, names: list[str]) -> Iterator[Request]:
        """The transactions of an acquire of ``names``: at most :data:`BATCH` keys and
        about :data:`_REQUEST_BYTES` each."""
        batch = new_token()
        if len(names) == 1:
            yield Request(names, [self._keys_of(names[0])[1]], [batch])
            return
        start, size = 0, 0
        for i, name in enumerate(names):
            size += len(name) * 4 + 64  # UTF-8 at worst, twice in base64, and a token
            if i + 1 - start == BATCH or size > _REQUEST_BYTES or i + 1 == len(names):
                chunk = names[start : i + 1]
                keys = [self._keys_of(each)[1] for each in chunk]
                yield Request(chunk, keys, [f"{batch}.{j:x}" for j in range(start, i + 1)])
                start, size = i + 1, 0

    def _track(self, leases: list[Any], slot: Slot) -> None:
        """Hold, keep alive and watch freshly acquired ``leases`` (on ``slot``)."""
        if not leases:
            return
        self._held.update(leases)
        if not self._keeper.hold(slot, leases):
            for lease in leases:
                self._lost(lease, "its etcd lease ended while it was being acquired")
            return
        self._watcher.hold(leases)

    def _untrack(self, lease: Any) -> None:
        self._held.discard(lease)
        self._keeper.discard(lease)
        self._watcher.discard(lease)

    def _lost(self, lease: Any, reason: str) -> None:
        self._untrack(lease)
        lease.lost.set(reason)

    def _slot_gone(self, slot: Slot) -> None:
        """etcd answered that ``slot``'s lease does not exist: its locks are lost."""
        for lease in self._keeper.forget(slot):
            self._lost(lease, f"its etcd lease {slot.id:x} expired or was revoked")

    def _checked(self, lease: Any, answer: dict[str, Any]) -> None:
        """Raise for a failed ownership check of ``lease`` (and report it lost)."""
        if answer.get("succeeded"):
            return
        if exists_in_failure(answer):
            reason = f"lock {lease.key!r} is held by another owner"
            self._lost(lease, reason)
            raise NotOwner(f"cannot extend {lease.name!r}: {reason}")
        reason = f"lock {lease.key!r} expired or was deleted on the server"
        self._lost(lease, reason)
        raise LockLost(f"cannot extend {lease.name!r}: {reason}")

    def _drop_all(self) -> tuple[list[Any], list[int]]:
        """Stop keeping and watching; the leases still held (now released) and the ids of
        the etcd leases to revoke, which deletes every key on them."""
        ids = self._keeper.stop()
        self._watcher.stop()
        leases = list(self._held)
        self._held.clear()
        for lease in leases:
            lease._released = True
        return leases, ids

    def _close_failed(self, exc: BaseException, count: int) -> None:
        _log.warning(
            "%s; %d lock(s) stay until their ttl runs out",
            translate(exc, self._url, "revoking leases on close"),
            count,
        )

    def locks(self) -> list[LockInfo]:
        """Every lock held under this locker's prefix, by any holder, with its expiry."""
        prefix = self._config.prefix
        gateway = Gateway(self._config)
        try:
            request = {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
            answer = gateway.call("/v3/kv/range", json.dumps(request).encode(), "listing locks")
            kvs = answer.get("kvs", [])
            ttls: dict[str, int] = {}
            for lease_id in {kv["lease"] for kv in kvs if kv.get("lease")}:
                alive = gateway.call(
                    "/v3/lease/timetolive", json.dumps({"ID": lease_id}).encode(), "listing locks"
                )
                ttls[lease_id] = int(alive.get("TTL", -1))
        finally:
            gateway.close()
        now = datetime.now(UTC)
        found = []
        for kv in kvs:
            key = unb64(kv["key"])
            ttl = ttls.get(kv.get("lease", ""), -1)
            found.append(
                LockInfo(
                    key=key.decode("utf-8", "surrogateescape"),
                    name=key[len(prefix) :].decode("utf-8", "replace"),
                    holder=unb64(kv.get("value", "")).decode("utf-8", "replace"),
                    expires_at=now + timedelta(seconds=ttl) if ttl >= 0 else None,
                    details={
                        "fencing_token": int(kv["create_revision"]),
                        "lease": int(kv.get("lease", 0)),
                    },
                )
            )
        return found


class EtcdHooks:
    """Conformance hooks of the etcd backend."""

    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        """A dead holder's keys go with its etcd lease: after the TTL etcd grants for
        ``ttl`` (whole seconds, at least its shortest), and its next look for expiries."""
        gateway = Gateway(EtcdConfig.from_url(url))
        try:
            answer = gateway.call("/v3/lease/grant", grant_request(ttl), "granting a lease")
            gateway.call("/v3/lease/revoke", json.dumps({"ID": answer["ID"]}).encode(), "revoking")
        finally:
            gateway.close()
        return float(answer["TTL"]) + _LESSOR_TICK

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        """Delete the lease's key from another client; the holder's watch sees it go."""
        gateway = Gateway(EtcdConfig.from_url(url))
        try:
            key = b64(lease.key.encode())  # type: ignore[attr-defined]
            gateway.call("/v3/kv/deleterange", json.dumps({"key": key}).encode(), "deleting")
        finally:
            gateway.close()

    def unreachable_url(self, url: LockURL) -> str | None:
        """An etcd:// URL on a local port nobody listens on (refused at once)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        return f"etcd://127.0.0.1:{port}/unreachable"
