"""A lock's requests, handed straight to kazoo's connection, each its own result.

kazoo's public ``create_async`` completes the result it returns from a second one, by
a callback on kazoo's completion thread, and every ``rawlink`` callback runs on that
thread too: a create woke its waiter one thread hop late, and an asyncio waiter one
more (docs/decisions.md, "ZooKeeper: requests sent straight to the connection"). A
:class:`Sent` request is its own result: the connection thread completes it, which
wakes a blocked caller at once and runs the one callback of :meth:`Sent.when_ready`
(the asyncio bridge's) right there. :class:`EphemeralCreate` keeps ``makepath``'s
meaning: when the parent is missing (the first lock under a new root), the parent is
made and the create sent again, as kazoo does.

``KazooClient._call`` is the one private name used (kazoo's own test harness uses it);
the ZooKeeper tests fail if it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import AsyncResult
from kazoo.protocol.serialization import Create2, Delete

__all__ = ["EphemeralCreate", "Sent", "VersionedDelete"]

_EPHEMERAL = 1  # ZooKeeper's CreateMode flag
_MAKEPATH_TRIES = 3  # the parent made again if someone deletes it meanwhile, then give up


class Sent(AsyncResult):  # type: ignore[misc]  # kazoo is untyped
    """A request sent on construction, and the result kazoo's connection completes."""

    def __init__(self, client: Any, request: Any) -> None:
        super().__init__(client.handler)
        self._client = client
        self._request = request
        self._on_ready: Callable[[], object] | None = None
        client._call(request, self)

    def when_ready(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once this is ready: at once if it is, else on the thread
        that completes it (kazoo's connection thread: ``callback`` must not block or
        raise). One callback at a time; :meth:`forget` drops it."""
        with self._condition:
            if not self.ready():
                self._on_ready = callback
                return
        callback()

    def forget(self) -> None:
        """Drop the :meth:`when_ready` callback (it may still run once, if the result is
        being completed at this moment)."""
        self._on_ready = None

    def set(self, value: Any = None) -> None:
        """Complete with ``value`` (kazoo's connection calls it), then call back."""
        super().set(value)
        self._call_back()

    def set_exception(self, exception: BaseException) -> None:
        """Complete with ``exception`` (kazoo's connection calls it), then call back."""
        super().set_exception(exception)
        self._call_back()

    def _call_back(self) -> None:
        callback, self._on_ready = self._on_ready, None
        if callback is not None:
            try:
                callback()
            except Exception:  # never into kazoo's connection thread; the waiter times out
                pass


class EphemeralCreate(Sent):
    """An ephemeral ``Create2`` of ``path``, answered with ``(path, stat)``: kazoo's
    ``create_async(..., ephemeral=True, makepath=True, include_data=True)``."""

    def __init__(self, client: Any, path: str, value: bytes, acl: Any) -> None:
        self._tries = _MAKEPATH_TRIES
        super().__init__(client, Create2(path, value, acl, _EPHEMERAL))

    def set_exception(self, exception: BaseException) -> None:
        """Complete with ``exception``, unless it says the parent is missing: then make the
        parent and send the create again."""
        if isinstance(exception, NoNodeError) and self._tries > 1:
            self._tries -= 1
            parent = self._request.path.rpartition("/")[0]
            self._client.ensure_path_async(parent, self._request.acl).rawlink(self._resend)
            return
        super().set_exception(exception)

    def _resend(self, ensured: Any) -> None:
        try:
            ensured.get_nowait()
        except Exception as exc:
            super().set_exception(exc)
            return
        self._client._call(self._request, self)


class VersionedDelete(Sent):
    """A ``Delete`` of ``path`` at ``version``: kazoo's ``delete_async(path, version)``."""

    def __init__(self, client: Any, path: str, version: int) -> None:
        super().__init__(client, Delete(path, version))
