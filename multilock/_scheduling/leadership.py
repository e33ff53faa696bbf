"""Keeping leases: renewal where the backend does not renew, and leader election."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from .._locks.outcome import finish_shielded
from .._masking import masked_line
from ..abc import AsyncDistributedLock, AsyncLease, Capability
from ..errors import BackendUnavailable, LockLost
from .clock import Clock

__all__ = ["Leadership", "keep_alive", "needs_keep_alive"]

log = logging.getLogger("multilock.scheduler")


def keep_alive(
    locker: AsyncDistributedLock,
    lease: AsyncLease,
    ttl: float,
    clock: Clock,
    unanswered: Callable[[str, str], bool] = lambda problem, what: True,
) -> asyncio.Task[None] | None:
    """Extend ``lease`` every ``ttl / 3`` while held, if the backend has TTL leases it
    does not renew itself; ``None`` (nothing to do) otherwise. Cancel the task to stop.
    An unreachable backend is reported to ``unanswered`` (logged only if it says it is
    news)."""
    if not needs_keep_alive(locker):
        return None
    return asyncio.ensure_future(_extend_periodically(lease, ttl, clock, unanswered))


def needs_keep_alive(locker: AsyncDistributedLock) -> bool:
    """Whether ``locker``'s leases expire unless extended: TTL leases the backend does
    not renew itself (session-bound leases and self-renewing backends need nothing)."""
    caps: frozenset[Capability] = getattr(locker, "capabilities", frozenset())
    return Capability.TTL in caps and Capability.RENEWAL not in caps


async def _extend_periodically(
    lease: AsyncLease, ttl: float, clock: Clock, unanswered: Callable[[str, str], bool]
) -> None:
    period = ttl / 3
    while True:
        # At the next multiple of ttl/3 on the clock, not ttl/3 after this task began: a
        # lease handed from run to run (the next tick taking over the hold), each run
        # with a renewal of its own, is still extended every ttl/3 however often the
        # runs change (restarting the wait at each one, it expired).
        now = clock.now()
        deadline = (math.floor(now / period) + 1) * period
        while deadline <= now:  # float rounding, near a multiple
            deadline += period
        await clock.sleep_until(deadline)
        if not lease.held:  # released (maybe still in flight) or lost meanwhile
            return
        try:
            # Finished even if this renewal is cancelled meanwhile (the next tick took the
            # lease over and starts its own): a dropped extension, tick after tick, let it
            # expire.
            await finish_shielded(lease.extend(ttl))
        except BackendUnavailable as exc:  # its lost signal tells the holder
            if unanswered(masked_line(exc), "extends failed"):
                log.warning("extending the lease on %s failed: %s", lease.name, masked_line(exc))
            return
        except LockLost as exc:  # lost: its holder reports that, once
            log.debug("extending the lease on %s failed: %s", lease.name, masked_line(exc))
            return
        except Exception:
            log.warning("extending the lease on %s failed", lease.name, exc_info=True)
            return


class Leadership:
    """Leader mode: one renewed lease on ``name``; who holds it runs the distributed jobs."""

    def __init__(
        self,
        locker: AsyncDistributedLock,
        name: str,
        *,
        ttl: float,
        poll: float,
        clock: Clock,
        replica_id: str,
        answered: Callable[[], object] = lambda: None,
        unanswered: Callable[[str, str], bool] = lambda problem, what: True,
    ) -> None:
        self.locker = locker
        self._answered = answered  # the backend answered
        self._unanswered = unanswered  # it did not: True if that is news to log
        self.name = name
        self.ttl = ttl
        self.poll = poll
        self.clock = clock
        self.replica_id = replica_id
        self.lease: AsyncLease | None = None
        self.since = 0.0
        """When (by the clock) this replica last became leader."""

    @property
    def held(self) -> bool:
        """Whether this replica leads now."""
        return self.lease is not None and self.lease.held

    async def run(self) -> None:
        """Compete for the lead until cancelled: try every ``poll``, hold while it lasts."""
        while True:
            try:
                lease = await self.locker.try_acquire(self.name, ttl=self.ttl)
            except BackendUnavailable as exc:  # one outage, reported once with the others'
                problem = masked_line(exc)
                if self._unanswered(problem, "leader polls failed"):
                    log.warning("leader election: the lock could not be asked: %s", problem)
                lease = None
            except Exception:
                log.warning("leader election: the lock could not be asked", exc_info=True)
                lease = None
            else:
                self._answered()
            if lease is None:
                await self.clock.sleep_until(self.clock.now() + self.poll)
                continue
            self.lease, self.since = lease, self.clock.now()
            log.info("this replica leads", extra={"replica_id": self.replica_id})
            renewal = keep_alive(self.locker, lease, self.ttl, self.clock)
            try:
                reason = await lease.lost
            finally:
                if renewal is not None:
                    renewal.cancel()
            self.lease = None
            log.warning("leadership lost: %s", reason, extra={"replica_id": self.replica_id})
            # Back off one poll before competing again, so that a flapping leader yields.
            await self.clock.sleep_until(self.clock.now() + self.poll)

    async def release(self) -> None:
        """Step down (at shutdown)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.release()
