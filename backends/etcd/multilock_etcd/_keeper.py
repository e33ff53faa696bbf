"""Keeping a locker's etcd leases alive: one thread per locker, with its own connection.

A locker does not grant an etcd lease per lock: that would cost a write per acquire.
It keeps one etcd lease per ttl in use (a *slot*), shared by its locks of that ttl,
granted on the first acquire of that ttl and kept alive every third of the ttl. An
acquire is then one transaction. A slot nobody holds a lock on for a minute is revoked.

A thread, not a task: an event loop blocked by ``time.sleep`` or a CPU-bound job cannot
starve it. When etcd says a slot's lease is gone (its TTL answered as 0), every lock on
it is lost at once; when etcd cannot be asked, the keepalive is retried until the ttl
passes unconfirmed, and then its locks are lost. The keys of a crashed locker go when
etcd expires its leases, after their ttl (rounded up to whole seconds, and at least
etcd's shortest lease: 1.5 election timeouts).

The thread also deletes *orphans*: keys of acquires whose answer was lost (a timeout
after the request was sent), which may have been granted: compare-and-delete on the
owner token, until it is done or their lease is gone.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from multilock.backend import LostSignal

from ._config import EtcdConfig
from ._errors import TRANSPORT_ERRORS, GatewayError, translate
from ._sync._gateway import Gateway

__all__ = ["IDLE_SLOT", "Keeper", "KeptLease", "Slot"]

_log = logging.getLogger("multilock.etcd")
IDLE_SLOT = 60.0
"""Seconds a slot nobody holds a lock on is kept alive before it is revoked."""
_RETRY_CAP = 1.0  # the longest pause between two attempts while etcd is unreachable
_MIN_TIMEOUT = 0.005


class KeptLease(Protocol):
    """What the keeper needs of a lock's lease."""

    key: str
    name: str
    lost: LostSignal
    _released: bool

    def _set_expiry(self, ttl: float | None) -> None: ...


class Slot:
    """One etcd lease of a locker, shared by its locks of one ttl."""

    __slots__ = ("deadline", "due", "granted", "holders", "id", "idle_since", "ttl")

    def __init__(self, lease_id: int, ttl: float, granted: int, start: float) -> None:
        self.id = lease_id
        self.ttl = ttl
        self.granted = granted  # the TTL etcd gave it, in whole seconds
        self.holders: set[Any] = set()
        self.idle_since: float | None = start
        self.confirm(start)

    def confirm(self, start: float) -> None:
        """etcd confirmed the lease alive for a request sent at monotonic ``start``."""
        self.deadline = start + min(self.ttl, self.granted)
        self.due = start + self.ttl / 3


class Keeper:
    """Keeps the slots of one locker alive until they are idle, gone or the locker closes.

    ``on_lost(lease, reason)`` is called (from the keeper's thread) for a lock whose slot
    is gone; it must fire the lease's ``lost`` signal.
    """

    def __init__(self, config: EtcdConfig, on_lost: Callable[[Any, str], None]) -> None:
        self._config = config
        self._on_lost = on_lost
        # The hot calls (slot, hold, discard) take the lock itself: a `with` on the
        # condition is two Python calls more each.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._slots: dict[float, Slot] = {}
        # When to try next, key, value (base64), lease id.
        self._orphans: list[tuple[float, str, str, int]] = []
        self._thread: threading.Thread | None = None
        self._stopping = False

    # --- what the lockers call -------------------------------------------------------

    def slot(self, ttl: float) -> Slot | None:
        """The live slot of ``ttl``, if there is one."""
        with self._lock:
            return self._slots.get(ttl)

    def adopt(
        self, ttl: float, lease_id: int, granted: int, start: float
    ) -> tuple[Slot, int | None]:
        """Keep a lease just granted for ``ttl`` (at monotonic ``start``) as its slot.

        If another call made a slot of that ttl meanwhile, that one is kept: the second
        value returned is then the id of the new lease, which the caller revokes.
        """
        with self._cond:
            existing = self._slots.get(ttl)
            if existing is not None:
                return existing, lease_id
            slot = self._slots[ttl] = Slot(lease_id, ttl, granted, start)
            self._wake(slot.due)
            return slot, None

    def hold(self, slot: Slot, leases: list[Any]) -> bool:
        """Count ``leases`` on ``slot``; ``False`` if the slot was dropped meanwhile."""
        with self._lock:
            if self._slots.get(slot.ttl) is not slot:
                return False
            slot.holders.update(leases)
            slot.idle_since = None
            return True

    def move(self, lease: Any, slot: Slot) -> None:
        """``lease`` now lives on ``slot`` (an extend with another ttl)."""
        with self._cond:
            for other in self._slots.values():
                self._drop_holder(other, lease)
            slot.holders.add(lease)
            slot.idle_since = None

    def discard(self, lease: Any) -> None:
        """Stop keeping ``lease`` (released, or lost)."""
        with self._lock:
            for slot in self._slots.values():
                self._drop_holder(slot, lease)

    def _drop_holder(self, slot: Slot, lease: Any) -> None:
        if lease in slot.holders:
            slot.holders.discard(lease)
            if not slot.holders:
                slot.idle_since = time.monotonic()

    def confirmed(self, slot: Slot, start: float) -> None:
        """A keepalive of ``slot`` sent at monotonic ``start`` by the locker succeeded."""
        with self._cond:
            if slot.deadline < start + min(slot.ttl, slot.granted):
                slot.confirm(start)

    def forget(self, slot: Slot) -> list[Any]:
        """``slot``'s lease is gone (etcd said so to the locker): drop it; its holders,
        which the caller reports lost."""
        with self._cond:
            if self._slots.get(slot.ttl) is slot:
                del self._slots[slot.ttl]
            holders = list(slot.holders)
            slot.holders.clear()
            return holders

    def orphan(self, key: str, value: str, lease_id: int) -> None:
        """An acquire of ``key`` by ``value`` may have been granted unseen: delete it if so."""
        with self._cond:
            self._orphans.append((time.monotonic(), key, value, lease_id))
            self._wake(time.monotonic())

    def stop(self) -> list[int]:
        """Stop the thread (it closes its connection on its way out; this does not block).
        The ids of the slots' leases, which the locker revokes."""
        with self._cond:
            self._stopping = True
            ids = [slot.id for slot in self._slots.values()]
            self._slots.clear()
            self._cond.notify()
            return ids

    def _wake(self, when: float) -> None:
        """Make sure the thread runs and wakes by ``when`` (holding the condition)."""
        self._cond.notify()
        if self._thread is None and not self._stopping:
            self._thread = threading.Thread(
                target=self._run, name="multilock-etcd-keeper", daemon=True
            )
            self._thread.start()

    # --- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        gateway: Gateway | None = None
        timeout = math.inf
        try:
            while True:
                with self._cond:
                    work = self._next_round()
                if work is None:
                    return
                due, idle, orphans, budget = work
                if gateway is None or not timeout <= budget <= 4 * timeout:
                    # Never wait on a socket past a slot's confirmed deadline: its locks
                    # must be reported lost by then, whatever the server does.
                    if gateway is not None:
                        gateway.close()
                    gateway, timeout = Gateway(self._config, budget), budget
                try:
                    for slot in due:
                        self._keep(gateway, slot)
                    for slot in idle:
                        self._revoke(gateway, slot)
                    self._clean(gateway, orphans)
                except Exception:  # a bug must not stop keepalives silently: report, retry
                    _log.exception("keeping %d etcd lease(s) alive failed", len(due))
                    for slot in due:
                        self._failed(slot, "the keeper thread hit an unexpected error")
        finally:
            if gateway is not None:
                gateway.close()

    def _next_round(
        self,
    ) -> tuple[list[Slot], list[Slot], list[tuple[float, str, str, int]], float] | None:
        """Wait (holding the condition) until something is due; ``None`` to stop."""
        while not self._stopping:
            now = time.monotonic()
            wake = min((slot.due for slot in self._slots.values()), default=now + IDLE_SLOT)
            wake = min([wake, *(orphan[0] for orphan in self._orphans)])
            if wake <= now:
                due = [slot for slot in self._slots.values() if slot.due <= now + slot.ttl / 6]
                idle = [
                    slot
                    for slot in self._slots.values()
                    if slot.idle_since is not None and now - slot.idle_since > IDLE_SLOT
                ]
                for slot in idle:
                    del self._slots[slot.ttl]
                due = [slot for slot in due if slot not in idle]
                orphans = [orphan for orphan in self._orphans if orphan[0] <= now]
                self._orphans = [orphan for orphan in self._orphans if orphan[0] > now]
                budget = min(
                    [
                        self._config.timeout,
                        *(s.deadline - now for s in due),
                        *(s.ttl / 3 for s in due),
                    ]
                )
                return due, idle, orphans, max(_MIN_TIMEOUT, budget)
            self._cond.wait(wake - now)
        return None

    def _keep(self, gateway: Gateway, slot: Slot) -> None:
        sent = time.monotonic()
        body = json.dumps({"ID": str(slot.id)}).encode()
        try:
            answer = gateway.request("/v3/lease/keepalive", body)
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            self._failed(slot, str(translate(exc, self._config.url, "keeping a lease alive")))
            return
        ttl = int(answer.get("result", answer).get("TTL", 0))
        if ttl <= 0:
            self._lose(slot, f"etcd lease {slot.id:x} expired or was revoked on the server")
            return
        with self._cond:
            slot.granted = ttl
            slot.confirm(sent)
            holders = list(slot.holders)
        for lease in holders:
            lease._set_expiry(slot.ttl)

    def _failed(self, slot: Slot, reason: str) -> None:
        now = time.monotonic()
        with self._cond:
            if now < slot.deadline:
                slot.due = min(now + min(slot.ttl / 10, _RETRY_CAP), slot.deadline)
                _log.warning("%s; retrying until the lease's ttl runs out", reason)
                return
        self._lose(slot, f"etcd lease could not be kept alive before its ttl ran out: {reason}")

    def _lose(self, slot: Slot, reason: str) -> None:
        for lease in self.forget(slot):
            if not lease._released:
                _log.warning("lease %r lost: %s", lease.name, reason)
                self._on_lost(lease, reason)

    def _revoke(self, gateway: Gateway, slot: Slot) -> None:
        with self._cond:
            if slot.holders:  # taken again between the round's choice and now
                self._slots.setdefault(slot.ttl, slot)
                slot.idle_since = None
                return
        try:
            gateway.request("/v3/lease/revoke", json.dumps({"ID": str(slot.id)}).encode())
        except (GatewayError, *TRANSPORT_ERRORS):
            pass  # it expires after its ttl anyway

    def _clean(self, gateway: Gateway, orphans: list[tuple[float, str, str, int]]) -> None:
        retry = []
        for _, key, value, lease_id in orphans:
            txn = {
                "compare": [{"key": key, "target": "VALUE", "result": "EQUAL", "value": value}],
                "success": [{"request_delete_range": {"key": key}}],
            }
            try:
                gateway.request("/v3/kv/txn", json.dumps(txn).encode())
            except (GatewayError, *TRANSPORT_ERRORS):
                retry.append((time.monotonic() + _RETRY_CAP, key, value, lease_id))
        with self._cond:
            live = {slot.id for slot in self._slots.values()}
            # One whose lease is gone went with it.
            self._orphans.extend(orphan for orphan in retry if orphan[3] in live)
