"""The started path: an acquire or a release sent during the call, with no task (the
core's ``_start_try_acquire`` and ``_start_release`` for the async API; for the sync
API, the call handed to the portal's loop, :meth:`Portal.call_started`).

The task path (``_try_acquire``, ``_release``, each run in a task of its own by the core
so that a cancelled caller still learns what the server did) costs a task and its
event-loop turns per call, plus nats-py's ``request`` (a ``wait_for``, one more turn).
Here the request goes out on nats-py's connection at once (:meth:`Client.send`), and
its reply, handed over by nats-py's reader, settles the core's :class:`Outcome`: a
caller cancelled meanwhile has the core wait for that, then release what was granted,
as on the task path. Every request is bounded by the client's timeout.

The sync locker takes this path too, in its portal's loop: one hand-over per call, as
before, but no task there either.

Taken only in the common case: connected, and for a release no renewal of the lease in
flight. Otherwise ``None``, and the core takes the task path. An acquire refused by a
subject's last message goes on in a task (is that message a KV client's marker?), as
the task path would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import nats.js.errors
from nats.aio.msg import Msg

from multilock.backend import Outcome, new_token

from ._client import purged, sequence
from ._errors import NATS_ERRORS, WRONG_LAST_SEQUENCE, translate

if TYPE_CHECKING:
    from ._client import Client
    from ._locker import L, _NatsCommon
    from ._renewal import Renewer

__all__ = ["start_acquire", "start_release"]

T = TypeVar("T")
_going_on: set[asyncio.Task[Any]] = set()  # the loop holds tasks only weakly


def start_acquire(
    locker: _NatsCommon, client: Client, renewer: Renewer, name: str, ttl: float, cls: type[L]
) -> Outcome[L | None] | None:
    """Send the acquire of ``name`` on ``client`` now (in its loop); the outcome of
    ``_try_acquire(name, ttl)``, the lease already renewed by ``renewer``."""
    locker._check_ttl(ttl)
    token = new_token()
    subject = locker._subject(name)
    outcome: Outcome[L | None] = Outcome()
    start = time.monotonic()

    def granted(revision: int | None) -> None:
        lease = None
        if revision is not None:
            span = min(ttl, client.max_age or ttl)
            lease = locker._lease(cls, name, subject, token, revision, ttl, span)
            locker._track(renewer, {name: lease}, start)
        outcome.set_result(lease)

    def settle(reply: Msg | None, error: BaseException | None) -> None:
        try:
            if error is not None:
                raise error
            assert reply is not None
            revision = sequence(reply)
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                _go_on(client.acquire_refused(subject, token.encode(), exc), outcome, granted,
                       lambda exc: translate(exc, locker._url, "acquiring"))  # fmt: skip
            else:
                outcome.set_exception(translate(exc, locker._url, "acquiring"))
        except NATS_ERRORS as exc:
            outcome.set_exception(translate(exc, locker._url, "acquiring"))
        except Exception as exc:
            outcome.set_exception(exc)
        else:
            _settled(outcome, granted, revision)

    if not client.send(subject, token.encode(), settle, create=True):
        return None
    return outcome


def start_release(
    locker: _NatsCommon, client: Client, renewer: Renewer, lease: Any
) -> Outcome[bool] | None:
    """Send the release of ``lease`` on ``client`` now (in its loop); the outcome of
    ``_release()``."""
    if not renewer.take(lease):
        return None  # a renewal in flight: the task path waits for its revision
    outcome: Outcome[bool] = Outcome()

    def settle(reply: Msg | None, error: BaseException | None) -> None:
        renewer.unclaim(lease)
        try:
            if error is not None:
                raise error
            assert reply is not None
            outcome.set_result(purged(reply))
        except NATS_ERRORS as exc:
            if lease.lost.is_set():
                outcome.set_result(False)  # already reported lost: its key expires on its own
            else:
                outcome.set_exception(translate(exc, locker._url, "releasing"))
        except Exception as exc:
            outcome.set_exception(exc)

    if not client.send(*client.purge_request(lease._subject, lease._rev), settle):
        renewer.unclaim(lease)
        return None
    locker._held.discard(lease)
    renewer.discard(lease)
    return outcome


def _settled(outcome: Outcome[Any], then: Callable[[T], None], value: T) -> None:
    """``then(value)``, which settles ``outcome``; or ``outcome`` fails with its error."""
    try:
        then(value)
    except Exception as exc:
        if not outcome.done():
            outcome.set_exception(exc)


def _go_on(
    work: Coroutine[Any, Any, T],
    outcome: Outcome[Any],
    then: Callable[[T], None],
    failed: Callable[[BaseException], BaseException],
) -> None:
    """Finish in a task: ``then(result of work)``, or ``outcome`` fails with ``failed(its
    nats-py error)`` or any other error."""
    task = asyncio.ensure_future(work)
    _going_on.add(task)

    def done(task: asyncio.Task[T]) -> None:
        _going_on.discard(task)
        if task.cancelled():
            outcome.set_exception(asyncio.CancelledError())
            return
        error = task.exception()
        if error is None:
            _settled(outcome, then, task.result())
        else:
            outcome.set_exception(failed(error) if isinstance(error, NATS_ERRORS) else error)

    task.add_done_callback(done)
