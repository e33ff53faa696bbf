"""A batch of lock-node creates in flight, and the nodes it wins."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kazoo.exceptions import NodeExistsError

from multilock.backend import LostSignal
from multilock.errors import MultilockError

from ._errors import OUTCOME_UNKNOWN, shown, unavailable

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["Batch", "Create", "Node"]


class _Lease(Protocol):
    @property
    def lost(self) -> LostSignal: ...


L = TypeVar("L", bound=_Lease)


@dataclass(eq=False, slots=True)
class Node:
    """A lock node we created: what releasing or checking it needs."""

    name: str
    path: str
    token: str
    czxid: int
    """The creating transaction's zxid: the lease's fencing token."""
    version: int
    session_id: int
    lease: Any = None
    closed: bool = False
    """Released by closing the session (which deletes every ephemeral node at once)."""


class Create:
    """One create in flight: the name, its node path, the owner token, kazoo's result."""

    __slots__ = ("name", "path", "result", "token")

    def __init__(self, name: str, path: str, token: str, result: Any) -> None:
        self.name = name
        self.path = path
        self.token = token
        self.result = result  # None: refused locally (an orphan of ours still sits there)


class Batch:
    """Creates sent together (one round trip's worth of latency), to be awaited, then finished."""

    __slots__ = ("_creates", "_session", "_session_id", "deadline")

    def __init__(self, session: Session, creates: list[Create], session_id: int) -> None:
        self._session = session
        self._creates = creates
        self._session_id = session_id
        self.deadline = session.deadline()

    @property
    def pending(self) -> list[Any]:
        """The kazoo results to wait for."""
        return [create.result for create in self._creates if create.result is not None]

    def abandon(self) -> None:
        """The caller stops waiting (cancelled): whatever the server grants is undone."""
        for create in self._creates:
            if create.result is not None:
                self._session.orphan(create.path, None)

    def finish(self, make: Callable[[Node], L]) -> dict[str, L | None]:
        """Leases (made by ``make``) for the creates that won, ``None`` where the node existed.

        Raises :class:`BackendUnavailable` if any create failed or did not answer
        by the deadline; then nothing stays held (what was granted is deleted).
        """
        session = self._session
        url = session.config.url
        results: dict[str, L | None] = {}
        granted: list[Node] = []
        failure: MultilockError | None = None
        for create in self._creates:
            results[create.name] = None
            if create.result is None:
                continue
            if not create.result.ready():
                failure = failure or unavailable(url, f"acquiring {shown(create.name)}")
                session.orphan(create.path, None)
                continue
            try:
                _, stat = create.result.get_nowait()
            except NodeExistsError:
                continue
            except OUTCOME_UNKNOWN as exc:
                failure = failure or unavailable(url, f"acquiring {shown(create.name)}", exc)
                session.orphan(create.path, None)
                continue
            except Exception as exc:
                failure = failure or unavailable(url, f"acquiring {shown(create.name)}", exc)
                continue
            node = Node(
                create.name, create.path, create.token, stat.czxid, stat.version, self._session_id
            )
            granted.append(node)
        if failure is not None:
            for node in granted:
                session.orphan(node.path, node.czxid)
            raise failure
        for node in granted:
            lease = make(node)
            node.lease = lease
            results[node.name] = lease
            session.hold(node)
        return results
