"""The async API's hot path: acquire and release started at once, awaited with no task.

kazoo sends a request the moment it is called (its own thread does the I/O), so
the core needs no task to drive an async acquire or release: the locker and
lease send the request and hand the core the outcome of what its answer means
(``async_outcome``), which the core awaits as it is. The answer is interpreted
by the same ``Session``/``Batch`` methods as on the task path, so the lost
signal and the errors raised are the same. The task path (``_try_acquire``,
``_release`` in ``_async/locker.py``) stays for an acquire that has to wait for
the session to connect first, and for ``try_acquire_many``.

The mixins are named so that ``scripts/async_to_sync.py`` maps each ``Async`` one to its
``Sync`` twin, which adds nothing: the sync API waits in the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multilock.backend import Outcome

from ._bridge import async_outcome

if TYPE_CHECKING:
    from ._batch import Node
    from ._session import Session

__all__ = ["AsyncStartedLease", "AsyncStartedLocker", "SyncStartedLease", "SyncStartedLocker"]


class AsyncStartedLease:
    """The release of an async ``zookeeper://`` lease, sent at once (the core's
    ``_start_release``)."""

    __slots__ = ()
    _session: Session
    _node: Node

    def _start_release(self) -> Outcome[bool]:
        session, node = self._session, self._node
        request = session.delete(node)
        if request is None:  # nothing to send: see Session.delete
            return async_outcome([], 0.0, lambda: node.closed)
        return async_outcome([request], session.deadline(), lambda: session.deleted(node, request))


class AsyncStartedLocker:
    """The acquire of the async ``zookeeper://`` locker, sent at once when the session is
    connected (the core's ``_start_try_acquire``)."""

    _session: Session
    _lease: Callable[[Node], Any]

    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[Any] | None:
        session = self._session
        if session.connecting() is not None:
            return None  # the task path waits for the connection first
        batch = session.create([name])
        return async_outcome(batch.pending, batch.deadline, lambda: batch.finish(self._lease)[name])


class SyncStartedLease:
    """The sync twin of :class:`AsyncStartedLease`: nothing (a sync release just waits)."""

    __slots__ = ()


class SyncStartedLocker:
    """The sync twin of :class:`AsyncStartedLocker`: nothing (a sync acquire just waits)."""
