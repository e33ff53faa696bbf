"""A watch for the deletion of a locker's keys: how a lock taken away is noticed at once.

Keeping a lease alive says nothing of its keys: another client may delete a lock's
key (an operator, a misbehaving tool), and etcd deletes every key of a lease that
expires or is revoked. One thread per locker holding locks keeps a watch on the
locker's key prefix, for deletions only, and fires ``lost`` for a held key deleted
after it was created. Our own releases are deleted from the watch's view before they
are sent, so they are not reported.

The watch is a stream, opened once locks have been held for :data:`SETTLE` seconds and
closed when none is: a lock released at once costs no watch. It is reopened, from the
revision after the last one seen, whenever it has been quiet for :data:`IDLE` seconds,
and when a lock acquired before the stream's first revision comes to be held.
Deletions already streamed are remembered, so that a lock registered just after its own
deletion went by is not missed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ._config import EtcdConfig
from ._errors import TRANSPORT_ERRORS, GatewayError
from ._sync._gateway import Gateway
from ._wire import b64, prefix_end, unb64

__all__ = ["IDLE", "Watcher"]

_log = logging.getLogger("multilock.etcd")
IDLE = 2.0
"""Seconds a quiet watch stream stays open before it is reopened."""
SETTLE = 0.2
"""Seconds a locker holds locks before its watch opens. A watch costs a request, and the
thread's work on every deletion under the prefix (releases included): a lock released
sooner never needs one. A deletion meanwhile is not missed -- the watch starts at the
revision after the oldest lock's -- only noticed up to this much later."""
_IDLE_THREAD = 60.0  # seconds the thread waits with nothing held before it ends
_REMEMBERED = 4096  # deletions kept for locks registered after their deletion streamed by
_RETRY = 0.5  # seconds between attempts while etcd cannot be reached


class Watcher:
    """Watches one locker's prefix for deletions of the keys it holds.

    ``on_lost(lease, reason)`` is called (from the watch thread, or from :meth:`hold`)
    for a held lock whose key was deleted; it must fire the lease's ``lost`` signal.
    A lease must have ``_wire_key`` (its key, base64) and ``fencing_token`` (the
    key's create revision).
    """

    def __init__(self, config: EtcdConfig, on_lost: Callable[[Any, str], None]) -> None:
        self._config = config
        self._on_lost = on_lost
        self._lock = threading.Lock()  # hold and discard take it directly: no Python calls
        self._cond = threading.Condition(self._lock)
        self._held: dict[str, Any] = {}
        self._next: int | None = None  # the revision the next stream starts at
        self._covered: int | None = None  # deletions from this revision on are known
        self._seen: dict[str, int] = {}  # key -> revision of its last deletion streamed
        self._restart = False
        self._stopping = False
        self._open_at = 0.0  # monotonic time from which the watch may open
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()

    def hold(self, leases: list[Any]) -> None:
        """Watch the keys of ``leases``, just acquired."""
        gone = []
        with self._lock:
            if not self._held:  # the thread notices within SETTLE: no need to wake it
                self._open_at = time.monotonic() + SETTLE
            for lease in leases:
                fence = int(lease.fencing_token)
                deleted = self._seen.get(lease._wire_key)
                if self._covered is not None and fence + 1 >= self._covered:
                    if deleted is not None and deleted > fence:
                        gone.append((lease, deleted))
                        continue
                else:  # created before what the stream has covered: watch again from it
                    self._next = fence + 1 if self._next is None else min(self._next, fence + 1)
                    self._restart = self._covered is not None
                self._held[lease._wire_key] = lease
            if self._thread is None and not self._stopping and self._held:
                self._thread = threading.Thread(
                    target=self._run, name="multilock-etcd-watch", daemon=True
                )
                self._thread.start()
        for lease, revision in gone:
            self._on_lost(lease, _reason(revision))

    def discard(self, lease: Any) -> None:
        """Stop watching ``lease``'s key (released, or lost)."""
        key = lease._wire_key
        with self._lock:
            if self._held.get(key) is lease:
                del self._held[key]

    def stop(self) -> None:
        """Stop the thread; it closes its connection within :data:`IDLE` seconds."""
        with self._cond:
            self._stopping = True
            self._held.clear()
            self._cond.notify()
        self._stop_event.set()

    def _run(self) -> None:
        gateway = Gateway(self._config)
        try:
            while True:
                with self._cond:
                    idle_until = time.monotonic() + _IDLE_THREAD
                    while not self._stopping:
                        if not self._held:
                            # Nothing to watch: what was streamed no longer covers what comes.
                            self._covered = self._next = None
                            self._seen.clear()
                            if time.monotonic() > idle_until:
                                self._thread = None  # the next hold() starts another
                                return
                            self._cond.wait(SETTLE)
                        elif (settling := self._open_at - time.monotonic()) > 0:
                            self._cond.wait(settling)
                        else:
                            break
                    if self._stopping:
                        return
                    start = self._next
                    if start is not None:  # deletions from it on are streamed from now
                        covered = self._covered
                        self._covered = start if covered is None else min(covered, start)
                    self._restart = False
                try:
                    self._stream(gateway, start)
                except TRANSPORT_ERRORS:
                    pass  # quiet for IDLE seconds, or etcd is away: open it again
                except GatewayError as exc:
                    _log.warning("watching %s for deletions failed: %s", self._config.url, exc)
                    self._stop_event.wait(_RETRY)
        finally:
            gateway.close()

    def _stream(self, gateway: Gateway, start: int | None) -> None:
        prefix = self._config.prefix
        request: dict[str, Any] = {
            "key": b64(prefix),
            "range_end": b64(prefix_end(prefix)),
            "filters": ["NOPUT"],
        }
        if start is not None:
            request["start_revision"] = str(start)
        body = json.dumps({"create_request": request}).encode()
        for message in gateway.lines("/v3/watch", body, IDLE):
            revision = int(message.get("header", {}).get("revision", 0))
            if message.get("canceled"):
                self._compacted(gateway, message)
                return
            gone = []
            with self._cond:
                if self._covered is None:  # a stream from etcd's current revision
                    self._covered = revision + 1
                for event in message.get("events", ()):
                    if event.get("type") != "DELETE":
                        continue
                    key, deleted = event["kv"]["key"], int(event["kv"]["mod_revision"])
                    self._remember(key, deleted)
                    lease = self._held.get(key)
                    if lease is not None and deleted > int(lease.fencing_token):
                        del self._held[key]
                        gone.append((lease, deleted))
                if revision:
                    self._next = revision + 1
                done = self._restart or self._stopping or not self._held
            for lease, deleted in gone:
                self._on_lost(lease, _reason(deleted))
            if done:
                return

    def _remember(self, key: str, revision: int) -> None:
        self._seen.pop(key, None)
        self._seen[key] = revision
        if len(self._seen) > _REMEMBERED:
            oldest = next(iter(self._seen))
            self._covered = self._seen.pop(oldest) + 1

    def _compacted(self, gateway: Gateway, message: dict[str, Any]) -> None:
        """The watch began before etcd's compacted revision: events are missing. Check each
        held key as it is now, then watch on from there."""
        with self._cond:
            held = list(self._held.items())
        ranges = [{"request_range": {"key": key, "keys_only": True}} for key, _ in held]
        answer = gateway.request("/v3/kv/txn", json.dumps({"success": ranges}).encode())
        revision = int(answer["header"]["revision"])
        gone = []
        for (_, lease), response in zip(held, answer.get("responses", ()), strict=False):
            kvs = response.get("response_range", {}).get("kvs", ())
            alive = any(int(kv.get("create_revision", 0)) == int(lease.fencing_token) for kv in kvs)
            if not alive:
                gone.append(lease)
                self.discard(lease)
        with self._cond:
            self._next, self._covered = revision + 1, revision + 1
            self._seen.clear()
        for lease in gone:
            self._on_lost(
                lease, f"key {unb64(lease._wire_key)!r} is gone (found after a compaction)"
            )


def _reason(revision: int) -> str:
    return (
        f"its key was deleted on the server at revision {revision}"
        " (by another client, or with its etcd lease)"
    )
