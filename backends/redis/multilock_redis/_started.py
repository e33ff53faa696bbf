"""The async API's hot path: an acquire or a release written on the locker's own
connection at once and answered from its transport, with no task (the core's
``_start_try_acquire``, ``_start_try_acquire_many`` and ``_start_release``).

The task path (``_try_acquire``, ``_try_acquire_many``, ``_release_lease`` in
``_async/_locker.py``, each run in a task of its own by the core for cancellation
safety) costs a task and two event-loop turns per call. Here the ``EVALSHA`` is
written on the link's connection at once, and a protocol put in front of redis-py's
stream protocol for the length of the call (:class:`_Call`) reads the one answer (an
integer; a batch's fences as one bulk string; or an error line) and settles the
core's ``Outcome``. Taken only in the common case: the link's connection open and idle
(its gate free, nothing unread on it), in the process that opened it, on one server
(not a cluster), with no ``WAIT`` for replicas and no health checks asked for, a batch
of one call (at most ``CHUNK`` names). Otherwise ``None``, and the core takes the task
path.

A call is bounded as the task path's are, by the client's socket timeout (a timer of
the loop). Anything unusual -- the server lacking the script, an error answer, the
connection ending, the timeout, an answer not of the kind asked for -- gives redis-py
its protocol back and hands over to the task path's own handling, in a task: the
connection dropped first where it broke (as redis-py drops it), then the locker's
``_acquire_failed`` or ``_release_failed`` (a batch: what it may have set given back,
as ``_try_acquire_many`` gives it back), or, when the server lacked the script (it did
not run), the whole call again on the task path, which loads it.

The mixins are named so that ``scripts/async_to_sync.py`` maps each ``Async`` one to
its ``Sync`` twin, which adds nothing: the sync API waits in the caller's thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, Outcome, settle_in_task

from ._async._lua import AsyncLink
from ._common import CHUNK, expiry
from ._errors import REDIS_ERRORS, translate
from ._scripts import ACQUIRE, ACQUIRE_MANY, RELEASE, Lua
from ._wire import pack

try:  # redis-py's table of error answers to its exceptions (READONLY, NOSCRIPT, ...)
    from redis._parsers.base import BaseParser

    _parse_error: Callable[[str], Any] | None = BaseParser.parse_error
except (ImportError, AttributeError):  # pragma: no cover - a redis-py that moved it
    _parse_error = None

if TYPE_CHECKING:
    from ._async._locker import AsyncRedisLease, AsyncRedisLocker

__all__ = ["AsyncStartedLease", "AsyncStartedLocker", "SyncStartedLease", "SyncStartedLocker"]

T = TypeVar("T")
_CLOSED = "Connection closed by server."  # redis-py's words


class _Call(asyncio.Protocol, Generic[T]):
    """One script call in flight on the link's connection: the transport's protocol
    until the answer is in, then redis-py's again. ``outcome`` is settled with
    ``answered(answer)`` (an ``int``, or the ``bytes`` of a bulk string), or by
    ``recover(error)`` in a task."""

    __slots__ = (
        "_answered",
        "_buffer",
        "_kind",
        "_link",
        "_loop",
        "_recover",
        "_stream",
        "_timer",
        "_transport",
        "outcome",
    )

    def __init__(
        self,
        link: AsyncLink,
        transport: asyncio.Transport,
        kind: bytes,
        answered: Callable[[Any], T],
        recover: Callable[[BaseException], Coroutine[Any, Any, T]],
    ) -> None:
        self._link = link
        self._kind = kind  # the answer asked for: b":" an integer, b"$" a bulk string
        self._transport = transport
        self._stream = transport.get_protocol()
        self._answered = answered
        self._recover = recover
        self._loop = asyncio.get_running_loop()
        self._buffer = b""
        self._timer: asyncio.TimerHandle | None = None
        self.outcome: Outcome[T] = Outcome(loop=self._loop)

    def start(self, command: bytes, timeout: float | None) -> None:
        """Write ``command`` and take in what comes back, for at most ``timeout`` seconds."""
        self._transport.set_protocol(self)
        if timeout is not None:
            self._timer = self._loop.call_later(timeout, self._timed_out, timeout)
        try:
            self._transport.write(command)
        except Exception as exc:
            self._fail(exc, broken=True)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        end = buffer.find(b"\r\n")
        if end < 0:
            self._buffer = buffer
            return
        kind, head = buffer[:1], buffer[1:end]
        if kind == self._kind == b"$" and head.isdigit():  # ACQUIRE_MANY's fences
            start = end + 2
            stop = start + int(head)
            if len(buffer) < stop + 2:
                self._buffer = buffer
                return
            if len(buffer) == stop + 2 and buffer.endswith(b"\r\n"):
                self._settle(buffer[start:stop])
                return
        elif len(buffer) == end + 2:  # one line, and nothing after it
            if kind == self._kind == b":":
                try:
                    value = int(head)
                except ValueError:
                    pass
                else:
                    self._settle(value)
                    return
            elif kind == b"-" and _parse_error is not None:
                error = _parse_error(head.decode("utf-8", "replace"))
                # A replica refusing: redis-py's Sentinel connection drops itself then,
                # to find the new primary when it connects again; so does this call.
                self._fail(error, broken=isinstance(error, ReadOnlyError))
                return
        # Not the answer asked for: nothing else is asked, so the stream is out of step
        # (or the server sent what nobody asked for); the connection goes.
        self._fail(InvalidResponse(f"unexpected answer {buffer[:40]!r}"), broken=True)

    def _settle(self, answer: Any) -> None:
        self._give_back()
        self._link.answered()
        try:
            result = self._answered(answer)
        except BaseException as exc:
            settle_in_task(self.outcome, self._recover(exc), self._loop)
        else:
            self.outcome.set_result(result)

    def eof_received(self) -> bool | None:
        self._fail(RedisConnectionError(_CLOSED), broken=True)  # redis-py's protocol back
        return bool(self._stream.eof_received())  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or RedisConnectionError(_CLOSED), broken=True)
        self._stream.connection_lost(exc)

    def pause_writing(self) -> None:
        self._stream.pause_writing()

    def resume_writing(self) -> None:
        self._stream.resume_writing()

    def _timed_out(self, timeout: float) -> None:
        self._timer = None
        self._fail(RedisTimeoutError(f"no answer within {timeout}s"), broken=True)

    def _give_back(self) -> bool:
        """Hand the transport back to redis-py's protocol; ``False`` if it was already."""
        if self._transport.get_protocol() is not self:
            return False
        self._transport.set_protocol(self._stream)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return True

    def _fail(self, error: BaseException, *, broken: bool) -> None:
        """Hand over to the task path with ``error``, once: the connection dropped first
        if ``broken`` (what is on it is unknown), the gate held until then."""
        if not self._give_back():
            return  # answered or handed over already
        settle_in_task(self.outcome, self._handed_over(error, broken), self._loop)

    async def _handed_over(self, error: BaseException, broken: bool) -> T:
        await self._link.failed(broken)
        return await self._recover(error)


class AsyncStartedLease:
    """The release of an async Redis lease, written at once when the link is idle (the
    core's ``_start_release``)."""

    __slots__ = ()
    _locker: AsyncRedisLocker

    def _start_release(self) -> Outcome[bool] | None:
        lease: AsyncRedisLease = self  # type: ignore[assignment]
        return self._locker._start_release_lease(lease)


class AsyncStartedLocker:
    """The acquire and release of the async Redis locker, written at once when its link
    is idle (the core's ``_start_try_acquire``)."""

    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None] | None:
        locker: AsyncRedisLocker = self  # type: ignore[assignment]
        if locker._wait is not None:
            return None
        keys, args, tokens = locker._acquire_request([name], ttl)
        start = time.monotonic()
        expires_at = expiry(ttl)

        def answered(fence: int) -> AsyncRedisLease | None:
            if not fence:
                return None
            lease = locker._lease(name, keys[0], tokens[0], fence, ttl, expires_at)
            _track(locker, [lease], start)
            return lease

        async def recover(error: BaseException) -> AsyncRedisLease | None:
            if isinstance(error, _Untracked):
                await error.give_back(locker, ttl)
            if isinstance(error, NoScriptError):  # it did not run: ask again, loading it
                return await locker._try_acquire(name, ttl)  # type: ignore[return-value]
            if isinstance(error, REDIS_ERRORS):
                raise locker._acquire_failed(keys[0], tokens[0], ttl, error) from None
            raise error

        return self._started_call(ACQUIRE, b":", keys, args, answered, recover)

    def _start_try_acquire_many(
        self, names: list[str], ttl: float
    ) -> Outcome[dict[str, AsyncLeaseBase | None]] | None:
        if len(names) == 1:  # the core's default: through _start_try_acquire
            return AsyncLockerBase._start_try_acquire_many(self, names, ttl)  # type: ignore[arg-type]
        locker: AsyncRedisLocker = self  # type: ignore[assignment]
        if locker._wait is not None or not isinstance(locker._link, AsyncLink):
            return None
        if not names or len(names) > CHUNK:
            return None  # nothing to ask; or more than one call, pipelined on the task path
        made: list[tuple[list[str], list[str], list[str]]] = []
        ((keys, args),) = locker._acquire_requests(names, ttl, made)
        tokens = made[0][2]
        start = time.monotonic()
        expires_at = expiry(ttl)

        def answered(answer: bytes) -> dict[str, AsyncLeaseBase | None]:
            result: dict[str, AsyncLeaseBase | None] = dict.fromkeys(names)
            granted: list[AsyncRedisLease] = []
            locker._grant(made[0], answer, ttl, expires_at, result, granted)
            _track(locker, granted, start)
            return result

        async def recover(error: BaseException) -> dict[str, AsyncLeaseBase | None]:
            if isinstance(error, _Untracked):
                await error.give_back(locker, ttl)
            if isinstance(error, NoScriptError):  # it did not run: ask again, loading it
                return await locker._try_acquire_many(names, ttl)
            # Any of them may be set (an answer lost), or none (an error answer): as on
            # the task path, nothing stays held.
            await locker._give_back(keys[::2], tokens, ttl)
            if isinstance(error, REDIS_ERRORS):
                raise translate(error, locker._url, "acquiring") from None
            raise error

        return self._started_call(ACQUIRE_MANY, b"$", keys, args, answered, recover)

    def _start_release_lease(self, lease: AsyncRedisLease) -> Outcome[bool] | None:
        """``lease``'s release, started (see :meth:`_start_try_acquire`)."""
        locker: AsyncRedisLocker = self  # type: ignore[assignment]

        async def recover(error: BaseException) -> bool:
            if isinstance(error, NoScriptError):  # it did not run: ask again, loading it
                return await locker._release_lease(lease)
            if isinstance(error, REDIS_ERRORS):
                return locker._release_failed(lease, error)
            raise error

        started = self._started_call(RELEASE, b":", [lease.key], [lease.token], bool, recover)
        if started is not None:
            locker._untrack(lease)
        return started

    def _started_call(
        self,
        script: Lua,
        kind: bytes,
        keys: list[str],
        args: list[str | int],
        answered: Callable[[Any], T],
        recover: Callable[[BaseException], Coroutine[Any, Any, T]],
    ) -> Outcome[T] | None:
        """``script`` written now on the link's connection, its answer (of ``kind``: see
        :class:`_Call`) to ``answered``; ``None``, with nothing done, when the link cannot
        take it at once."""
        locker: AsyncRedisLocker = self  # type: ignore[assignment]
        link = locker._link
        if not isinstance(link, AsyncLink):
            return None  # a cluster's: a connection per node, through redis-py's client
        transport = link.idle_transport()
        if transport is None:
            return None
        call = _Call(link, transport, kind, answered, recover)
        call.start(pack(("EVALSHA", script.sha, len(keys), *keys, *args)), link.timeout)
        return call.outcome


class _Untracked(Exception):
    """Leases granted, then not tracked (their renewal could not start): given back."""

    def __init__(self, leases: list[AsyncRedisLease], error: BaseException) -> None:
        super().__init__(str(error))
        self.leases = leases
        self.error = error

    async def give_back(self, locker: AsyncRedisLocker, ttl: float) -> NoReturn:
        """Release the leases, then raise what stopped their tracking."""
        await locker._give_back(*locker._given_back(self.leases), ttl)
        raise self.error


def _track(locker: AsyncRedisLocker, leases: list[AsyncRedisLease], start: float) -> None:
    """Hold and renew ``leases``; should that fail, :class:`_Untracked` (see ``_hold``)."""
    try:
        locker._track(leases, start)
    except BaseException as exc:
        raise _Untracked(leases, exc) from exc


class SyncStartedLease:
    """The sync twin of :class:`AsyncStartedLease`: nothing (a sync release just waits)."""

    __slots__ = ()


class SyncStartedLocker:
    """The sync twin of :class:`AsyncStartedLocker`: nothing (a sync acquire just waits)."""
