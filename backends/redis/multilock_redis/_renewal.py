"""Automatic renewal: one thread per locker, with its own connection, renewing in batches.

A thread, not a task: an event loop blocked by ``time.sleep`` or a CPU-bound sync
job cannot starve it (CPython hands the GIL over every few milliseconds). Every
lease of the locker shares the thread and its connection; the leases due at one
wake-up are renewed by one script call, whatever their number.

A lease is renewed every third of its ttl (a little earlier, to batch it with
others). When Redis says the key is gone or taken, ``lost`` fires at once; when
Redis cannot be asked, the renewal is retried until the lease's last confirmed
expiry, and ``lost`` fires when that passes unconfirmed -- a little before it (see
:func:`guard`), so that the holder is told before Redis can give the name away.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from multilock.backend import LostSignal

from ._config import CLUSTER, RedisConfig
from ._errors import REDIS_ERRORS, translate
from ._keys import calls
from ._scripts import EXTEND, HELD_ELSEWHERE, RELEASE_MANY
from ._sync._cluster import SyncClusterLink, new_link
from ._sync._lua import SyncLink

__all__ = ["Renewer", "ttl_ms", "unreplicated"]

_log = logging.getLogger("multilock.redis")
_RETRY_CAP = 1.0  # the longest pause between two attempts while Redis is unreachable
_MIN_TIMEOUT = 0.005
_GUARD_CAP = 0.25


def guard(ttl: float) -> float:
    """How long before a lease's confirmed expiry an unconfirmed lease is reported
    lost: a twentieth of its ttl, at most 250 ms. The confirmed expiry is measured
    from when the renewal was sent, so Redis's own expiry is later still; but the
    renewal thread may wake a few milliseconds late and the two clocks may run at
    slightly different rates, and without a margin another replica polling the name
    could take it a moment before its holder is told."""
    return min(ttl / 20, _GUARD_CAP)


class RenewedLease(Protocol):
    """What the renewer needs of a lease."""

    key: str
    token: str
    lost: LostSignal
    _released: bool
    _ttl: float

    def _set_expiry(self, ttl: float | None) -> None: ...


def unreplicated(config: RedisConfig, acked: int) -> str:
    """Why a write counts as failed under ``wait_replicas``: ``acked`` replicas (or -1:
    not known) acknowledged it."""
    wanted = f"{config.wait_replicas} replica(s) asked for (wait_replicas)"
    if acked < 0:
        return (
            f"the write could not be checked against the {wanted}:"
            " a slot moved or the script was reloaded midway"
        )
    return f"only {acked} of the {wanted} acknowledged the write within {config.wait_timeout:g}s"


def ttl_ms(seconds: float) -> int:
    """A ttl as Redis takes it: whole milliseconds, at least one."""
    return max(1, round(seconds * 1000))


class _Pending:
    """A release that could not reach Redis, tried again until its key has expired."""

    __slots__ = ("deadline", "due", "retry")

    def __init__(self, deadline: float, retry: float) -> None:
        self.deadline = deadline  # the key's expiry at the latest (monotonic clock)
        self.retry = retry
        self.due = time.monotonic() + retry


class _Schedule:
    __slots__ = ("deadline", "due")

    def __init__(self, ttl: float, start: float) -> None:
        # When it must be reported lost unless confirmed again: the expiry Redis last
        # confirmed (monotonic clock), less the guard.
        self.deadline = start + ttl - guard(ttl)
        self.due = start + ttl / 3


class Renewer:
    """Renews the TTL leases of one locker until they are released or lost.

    ``on_lost(lease, reason)`` is called (from the renewal thread) for a lease
    that is gone; it must fire the lease's ``lost`` signal.
    """

    def __init__(self, config: RedisConfig, on_lost: Callable[[RenewedLease, str], None]) -> None:
        self._config = config
        self._on_lost = on_lost
        # An idle thread wakes up as often as a lease of the default ttl would need
        # it: then acquiring such a lease never has to wake the thread early.
        self._idle = config.ttl / 3
        self._cond = threading.Condition(threading.Lock())
        self._leases: dict[RenewedLease, _Schedule] = {}
        self._releases: dict[tuple[str, str], _Pending] = {}  # (key, token) to free
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None
        self._stopping = False

    def add(self, leases: Iterable[RenewedLease], start: float) -> None:
        """Renew ``leases``, acquired at monotonic time ``start``, from now on."""
        with self._cond:
            for lease in leases:
                schedule = self._leases[lease] = _Schedule(lease._ttl, start)
                self._wake(schedule.due)
            self._start()

    def release_later(self, locks: Iterable[tuple[str, str, float]]) -> None:
        """Try again and again to free ``locks`` (key, token, ttl), whose release could
        not reach Redis (down, or failing over), until they would have expired anyway.

        A compare-and-delete, so harmless to whoever holds a name by then: it frees
        the name as soon as Redis answers, instead of at the key's expiry.
        """
        now = time.monotonic()
        with self._cond:
            if self._stopping:
                return
            for key, token, ttl in locks:
                pending = _Pending(now + ttl, min(ttl / 10, _RETRY_CAP))
                self._releases[(key, token)] = pending
                self._wake(pending.due)
            self._start()

    def _wake(self, due: float) -> None:
        """Have the thread wake up by monotonic time ``due`` (holding the condition)."""
        if due < self._wake_at:
            self._wake_at = due
            self._cond.notify()

    def _start(self) -> None:
        """Start the thread if it has not been (holding the condition)."""
        if self._thread is None and not self._stopping:
            self._thread = threading.Thread(
                target=self._run, name="multilock-redis-renewal", daemon=True
            )
            self._thread.start()

    def extended(self, lease: RenewedLease, start: float) -> None:
        """``lease`` was extended to its ``_ttl`` at monotonic time ``start``."""
        self.add([lease], start)

    def discard(self, lease: RenewedLease) -> None:
        """Stop renewing ``lease`` (released, or lost)."""
        with self._cond:
            self._leases.pop(lease, None)

    def stop(self) -> None:
        """Stop the thread; it closes its connection on its way out. Does not block."""
        with self._cond:
            self._stopping = True
            self._leases.clear()
            self._releases.clear()
            self._cond.notify()

    def _run(self) -> None:
        link: SyncLink | SyncClusterLink | None = None
        timeout = math.inf
        try:
            while True:
                with self._cond:
                    due = self._next_batch()
                if due is None:
                    return
                batch, releases, budget = due
                if link is None or not timeout <= budget <= 4 * timeout:
                    # Never wait on a socket past the budget (see _next_batch). (A
                    # new client is a new connection: not for every small change.)
                    if link is not None:
                        link.close()
                    link, timeout = new_link(self._config, budget), budget
                try:
                    if batch:
                        self._renew(link, batch)
                    if releases:
                        self._release(link, releases)
                except Exception:  # a bug must not stop renewal silently: report, retry
                    _log.exception("renewing %d lease(s) failed", len(batch))
                    self._failed(batch, "the renewal thread hit an unexpected error")
        finally:
            if link is not None:
                link.close()

    def _next_batch(
        self,
    ) -> tuple[list[RenewedLease], list[tuple[str, str]], float] | None:
        """Wait (holding the condition) until some lease or release is due; ``None``
        to stop.

        Returns the leases to renew now, the releases to try again, and how long a
        call may take.
        """
        while not self._stopping:
            now = time.monotonic()
            dues = [s.due for s in self._leases.values()]
            dues += [pending.due for pending in self._releases.values()]
            wake = min(dues, default=now + self._idle)
            if wake <= now:
                self._wake_at = -math.inf  # adds during the round need no wake-up
                batch = []
                # The shortest ttl of all leases, not of this batch: a budget that
                # stays put keeps the connection.
                ttls = [held._ttl / 3 for held in self._leases]
                budget = min([self._config.socket_timeout, *ttls])
                for lease, schedule in self._leases.items():
                    # No call waits on a socket past any lease's deadline, be it of
                    # this batch or not (a retried release): each must be reported
                    # lost by then, whatever the server does.
                    budget = min(budget, schedule.deadline - now)
                    if schedule.due <= now + lease._ttl / 6:
                        batch.append(lease)
                releases = []
                for release, pending in list(self._releases.items()):
                    if pending.deadline <= now:
                        del self._releases[release]  # expired: nothing left to free
                    elif pending.due <= now:
                        releases.append(release)
                        pending.due = now + pending.retry
                return batch, releases, max(_MIN_TIMEOUT, budget)
            self._wake_at = wake
            self._cond.wait(wake - now)
        return None

    def _release(self, link: SyncLink | SyncClusterLink, releases: list[tuple[str, str]]) -> None:
        """Try the releases again; those that reach Redis are done."""
        keys, tokens = [key for key, _ in releases], [token for _, token in releases]
        for positions in calls(keys, len(keys), self._config.topology == CLUSTER):
            try:
                link.run(RELEASE_MANY, [keys[i] for i in positions], [tokens[i] for i in positions])
            except REDIS_ERRORS:
                continue  # still unreachable: the next try is due in a while
            with self._cond:
                for i in positions:
                    self._releases.pop(releases[i], None)

    def _renew(self, link: SyncLink | SyncClusterLink, batch: list[RenewedLease]) -> None:
        ttls = [lease._ttl for lease in batch]
        keys = [lease.key for lease in batch]
        requests: list[tuple[list[str], list[str | int]]] = []
        for positions in calls(keys, len(batch), self._config.topology == CLUSTER):
            args: list[str | int] = []
            for i in positions:
                args += (batch[i].token, ttl_ms(ttls[i]))
            requests.append(([keys[i] for i in positions], args))
        sent = time.monotonic()
        answers, acked, error = self._extend(link, requests)
        why = "renewing leases failed"
        if error is not None:
            why = str(translate(error, self._config.url, "renewing leases"))
        elif acked < self._config.wait_replicas:
            # Extended on the primary only: a failover could bring back the expiry before.
            why = f"renewing leases: {unreplicated(self._config, acked)}"
        unconfirmed = []
        for i, (lease, ttl) in enumerate(zip(batch, ttls, strict=True)):
            answer = answers.get(i)
            if answer == 1 and acked >= self._config.wait_replicas:
                with self._cond:
                    schedule = self._leases.get(lease)
                    if schedule is not None and schedule.deadline < sent + ttl - guard(ttl):
                        schedule.deadline, schedule.due = sent + ttl - guard(ttl), sent + ttl / 3
                lease._set_expiry(ttl)
            elif answer == 1 or answer is None:  # not replicated, or not answered
                unconfirmed.append(lease)
            elif answer == HELD_ELSEWHERE:
                self._lose(lease, f"lock {lease.key!r} was taken by another holder")
            else:
                self._lose(lease, f"lock {lease.key!r} expired or was deleted on the server")
        if unconfirmed:
            self._failed(unconfirmed, why)

    def _extend(
        self, link: SyncLink | SyncClusterLink, requests: list[tuple[list[str], list[str | int]]]
    ) -> tuple[dict[int, int], int, BaseException | None]:
        """Run EXTEND for ``requests``: each lease's answer by its position in the batch
        (none where a request failed: on a cluster, the others' primaries may have
        answered), how many replicas acknowledged (``wait_replicas`` when not asked),
        and the first error."""
        answers: dict[int, int] = {}
        starts = [0]
        for keys, _ in requests:
            starts.append(starts[-1] + len(keys))

        def answered(i: int, reply: list[int]) -> None:
            for j, answer in enumerate(reply):
                answers[starts[i] + j] = answer

        wanted, timeout = self._config.wait_replicas, self._config.wait_timeout
        try:
            if wanted:
                replies, acked = link.run_waited(EXTEND, requests, (wanted, timeout))
                for i, reply in enumerate(replies):
                    if not isinstance(reply, BaseException):
                        answered(i, reply)
                error = next((r for r in replies if isinstance(r, BaseException)), None)
                return answers, acked, error
            if len(requests) == 1:
                answered(0, link.run(EXTEND, *requests[0]))
            else:
                link.run_pipelined(EXTEND, requests, answered)
        except REDIS_ERRORS as exc:
            return answers, wanted, exc
        return answers, wanted, None

    def _failed(self, batch: list[RenewedLease], reason: str) -> None:
        now = time.monotonic()
        expired = []
        with self._cond:
            for lease in batch:
                schedule = self._leases.get(lease)
                if schedule is None:
                    continue
                if schedule.deadline <= now:
                    expired.append(lease)
                else:
                    retry = now + min(lease._ttl / 10, _RETRY_CAP)
                    schedule.due = min(retry, schedule.deadline)
        _log.warning("%s; retrying until the leases expire", reason)
        for lease in expired:
            self._lose(lease, f"lease could not be renewed before its expiry: {reason}")

    def _lose(self, lease: RenewedLease, reason: str) -> None:
        self.discard(lease)
        if not lease._released:
            _log.warning("lease %r lost: %s", lease.key, reason)
            self._on_lost(lease, reason)
