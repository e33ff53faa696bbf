"""Tick claims on ZooKeeper: each name's mark is the data of a persistent node, raised
with a version-checked write.

The marks live under ``<root>/%ticks`` (``%t`` is never the start of an escaped lock
name, which ``%`` begins only before two hex digits, so no lock node can be there).
A claim reads the mark node; if the node is missing it creates it holding the fire
time, if the mark is below the fire time it sets the data *at the version it read*.
A create that finds the node made meanwhile, or a set that finds the version moved
on, reads again: of concurrent claimers of one tick, the one whose write lands first
wins, and the others read a mark at the tick. Mark nodes are never deleted.

Like :class:`~multilock_zookeeper._batch.Batch`, a round sends every request of the
batch before any is waited for (the lockers wait in between, see ``_bridge``).
"""

from __future__ import annotations

from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from multilock.backend import quote_name
from multilock.errors import BackendUnavailable

from ._errors import unavailable

__all__ = ["TICKS", "TickClaims"]

TICKS = "%ticks"
"""The child of the root under which the marks live (never a lock node's name)."""
_ROUNDS = 50  # reads and writes per claim before giving up: contention never lasts that long
_READ, _CREATE, _SET = "read", "create", "set"


class TickClaims:
    """One ``claim_ticks`` call: per name, the step it is at, until each is decided."""

    def __init__(self, session: Any, names: list[str], fires: list[int]) -> None:
        self._session = session
        root = f"{session.config.root}/{TICKS}"
        self._paths = [f"{root}/{quote_name(name)}" for name in names]
        self._fires = fires
        self.won: list[bool | None] = [None] * len(names)
        self._steps: list[tuple[str, int]] = [(_READ, 0)] * len(names)  # (step, read version)
        self._sent: list[tuple[int, Any]] = []
        self._rounds = 0

    def send(self) -> list[Any]:
        """Send the next step of every claim not yet decided; the requests to wait on
        (none: every claim is decided)."""
        self._rounds += 1
        if self._rounds > _ROUNDS and any(won is None for won in self.won):
            raise BackendUnavailable(
                f"claiming ticks on ZooKeeper at {self._session.config.url.masked}: the marks"
                f" kept changing for {_ROUNDS} reads"
            )
        client, acl = self._session.client, self._session.config.acl
        self._sent = []
        for i, won in enumerate(self.won):
            if won is not None:
                continue
            step, version = self._steps[i]
            path, value = self._paths[i], str(self._fires[i]).encode()
            if step == _READ:
                request = client.get_async(path)
            elif step == _CREATE:
                request = client.create_async(path, value, acl=acl, makepath=True)
            else:
                request = client.set_async(path, value, version=version)
            self._sent.append((i, request))
        return [request for _, request in self._sent]

    def interpret(self) -> None:
        """Read the answers of the last :meth:`send`: decide claims, or set their next step."""
        url = self._session.config.url
        for i, request in self._sent:
            if not request.ready():
                raise unavailable(url, "claiming ticks")
            step, _ = self._steps[i]
            try:
                answer = request.get_nowait()
            except NoNodeError:
                self._steps[i] = (_CREATE, 0)  # no mark yet (or, for a set, deleted by hand)
                continue
            except (NodeExistsError, BadVersionError):
                self._steps[i] = (_READ, 0)  # another claimer wrote first: look again
                continue
            except Exception as exc:
                raise unavailable(url, "claiming ticks", exc) from None
            if step != _READ:
                self.won[i] = True
                continue
            data, stat = answer
            try:
                mark = int(data) if data else None
            except ValueError:
                raise BackendUnavailable(
                    f"claiming ticks on ZooKeeper at {url.masked}: the mark node"
                    f" {self._paths[i][:80]!r} holds {data[:20]!r}, not a fire time"
                ) from None
            if mark is not None and mark >= self._fires[i]:
                self.won[i] = False
            else:
                self._steps[i] = (_SET, stat.version)

    def result(self) -> list[bool]:
        """Whether each claim was won (once :meth:`send` has nothing left to send)."""
        return [bool(won) for won in self.won]
