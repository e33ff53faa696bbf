"""Tick claims in the scheduler: how a distributed tick is won where the backend can claim.

Every replica computes the same fire time F for a tick from the trigger alone. On a
backend declaring ``Capability.TICK_CLAIM`` the scheduler *claims* (job, F) -- an atomic
"raise the job's mark from below F to F" -- before it takes the job's lock: the replica
whose claim wins runs the tick, every other one finds the mark at F or beyond and skips,
however early or late its clock. The lock still guards the run while it runs (runs of a
job never overlap across replicas), and is released as soon as the run ends: there is no
hold, so no skew tolerance to respect. Elsewhere (or when the backend refuses this
locker its claims: :class:`~multilock.errors.ClaimsUnavailable`) the scheduler holds
the lock past the tick, as before. See docs/scheduler.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from .._masking import masked_line
from ..abc import AsyncDistributedLock, Capability, SupportsClaimTicksStarted
from ..errors import ClaimsUnavailable

__all__ = ["TickClaims", "TickPath", "claim_grace"]

log = logging.getLogger("multilock.scheduler")

TickPath = Literal["claim", "hold"]
"""How a scheduler in lock mode makes a tick run once: by claiming it, or by holding the
job's lock past it."""


class TickClaims:
    """Whether a scheduler's locker claims ticks, and the claiming itself."""

    def __init__(self, locker: AsyncDistributedLock, wanted: bool = True) -> None:
        self._locker = locker
        # Asked once, not per tick: a locker's capabilities and methods do not change.
        self.declared = Capability.TICK_CLAIM in locker.capabilities and callable(
            getattr(locker, "claim_ticks", None)
        )
        """Whether the backend declares ``TICK_CLAIM``."""
        self._start = (
            locker.claim_ticks_started if isinstance(locker, SupportsClaimTicksStarted) else None
        )
        self.active = wanted and self.declared
        """Whether ticks are claimed (wanted, declared, and not refused)."""
        self.refused: str | None = None
        """Why the backend refused this locker its claims (then the hold path is used)."""

    @property
    def path(self) -> TickPath:
        """``"claim"`` or ``"hold"``."""
        return "claim" if self.active else "hold"

    def started(self, ticks: dict[str, datetime]) -> asyncio.Future[Mapping[str, bool]] | None:
        """:meth:`claim` started now, without a task, where the locker can
        (:class:`~multilock.abc.SupportsClaimTicksStarted`); else ``None``, nothing done."""
        start = self._start
        return None if start is None else start(ticks)

    async def claim(self, ticks: dict[str, datetime]) -> Mapping[str, bool]:
        """Claim each job's tick (name to fire time), in one call: whether each was won."""
        claim_ticks = self._locker.claim_ticks  # type: ignore[attr-defined]
        won: Mapping[str, bool] = await claim_ticks(ticks)
        return won

    def refuse(self, error: ClaimsUnavailable) -> None:
        """The backend cannot claim for this locker: fall back to holds, and say so once."""
        self.refused = masked_line(error)
        self.active = False
        log.warning(
            "tick claims unavailable, holding each tick's lock instead (exactly once only"
            " while every clock is within skew_tolerance): %s",
            self.refused,
        )


def claim_grace(misfire_grace: float, fire: datetime, following: datetime | None) -> float:
    """How late (by this replica's clock) a tick may be and still be claimed: its
    misfire grace plus the interval to the next fire time.

    This clock cannot tell a tick that is late from a clock that jumped forward; a claim
    won proves that no replica has run the tick, nor any later one of the job. A replica
    whose clock jumped forward by up to an interval is then the only one that can still
    run the ticks it jumped over (the others find the mark past them): it claims and
    runs them. Later ticks are missed, as without claims.
    """
    if following is None:
        return misfire_grace
    return misfire_grace + max(0.0, (following - fire).total_seconds())
