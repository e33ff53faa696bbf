"""What the ``zookeeper://`` backend promises (checked by the conformance suite)."""

from __future__ import annotations

from multilock.backend import Capability

__all__ = ["CAPABILITIES"]

CAPABILITIES = frozenset(
    {
        Capability.FENCING,
        Capability.SESSION,
        Capability.CROSS_PROCESS,
        Capability.CROSS_HOST,
        Capability.LOST_SIGNAL,
        Capability.INTROSPECTION,
        Capability.BATCH,
        Capability.TICK_CLAIM,
    }
)
