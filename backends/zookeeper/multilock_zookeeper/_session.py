"""One kazoo session per locker: requests, their meaning, and the session's state.

Everything here is shared by the sync and the async locker. A method either
*sends* requests (returning kazoo ``IAsyncResult`` objects, never blocking) or
*interprets* results that are already ready; the lockers only wait in between
(see ``_bridge``). So the protocol -- one ephemeral create per lock, its czxid
as fencing token, a version-checked delete, what each kazoo error means -- is
written once.

The session's state drives ``lost``: kazoo reports ``SUSPENDED`` when the
connection drops (the session may still live) and ``LOST`` when the session
expired. ``LOST`` always fires ``lost``; ``SUSPENDED`` does too unless the URL
says ``suspended=keep``, and then only once the suspension has lasted
``Config.keep_grace``: kazoo itself only learns of an expiry on reconnecting, so a
holder cut off from every server would otherwise hold on after the server has
expired its session and handed the lock to someone else. Nodes we can no longer
vouch for become *orphans*: deleted as soon as the same session is connected again
(if it expired, the server already deleted them), and never re-created meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from multilock.abc import LockInfo
from multilock.backend import new_token, quote_name
from multilock.errors import LockLost, MultilockError, NotOwner

from ._acl import acl_problem, acl_unreadable
from ._batch import Batch, Create, Node
from ._claims import TICKS
from ._config import Config
from ._errors import OUTCOME_UNKNOWN, shown, unavailable
from ._logs import KazooLog
from ._records import hidden_lock_info, lock_info, node_value
from ._requests import EphemeralCreate, VersionedDelete
from ._watches import Watches

__all__ = ["Session"]

_log = logging.getLogger("multilock.zookeeper")
_PATH_CACHE = 4096


class Session:
    """A kazoo client, the nodes it holds, and what its state changes mean for them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._log = KazooLog(config)
        self.client = KazooClient(
            **config.kazoo_options(),
            logger=self._log,
            # Reconnect promptly after an outage (kazoo's default backs off to an hour),
            # and at once after a dropped connection: with suspended=keep, an expired
            # session is only learnt on reconnecting, and its leases are lost meanwhile.
            # Attempts at least four times within keep's grace (kazoo adds up to 40 %
            # jitter), so that a lease rides an election that ends well within it.
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.01, backoff=2, max_delay=min(1.0, config.keep_grace / 4)
            ),
        )
        self._guard = threading.Lock()
        self._started = False
        self._closed = False
        self._ready = False  # connected, and the chroot's ACL checked: requests may go
        self._live = self.client.handler.async_result()  # set when ready; replaced on each drop
        self._session_id: int | None = None
        self._held: dict[str, Node] = {}
        self._orphans: dict[str, int | None] = {}  # path -> czxid (None: any node of ours)
        self._cleaning: set[str] = set()
        self._grace: threading.Timer | None = None  # suspended=keep: the suspension's bound
        self._acl_checked = config.username is None
        self._acl = config.acl
        self._paths: dict[str, str] = {}
        self.watches = Watches(self.client)  # the waiting acquires' (see _watches)
        self.client.add_listener(self._on_state)

    # --- connecting ------------------------------------------------------------------

    def deadline(self) -> float:
        """When a request sent now has waited long enough (monotonic clock)."""
        return time.monotonic() + self.config.connect_timeout

    def connecting(self) -> Any | None:
        """``None`` when requests may go now; else a result to wait on (connects lazily)."""
        if self._ready:
            return None
        with self._guard:
            if self._closed:
                raise MultilockError(f"the locker of {self.config.url.masked} is closed")
            if not self._started:
                self._started = True
                self.client.start_async()
            elif self._live.ready() and not self._live.successful() and self.client.connected:
                # The chroot's ACL was refused (or could not be read): ask again, so
                # that fixing the ACL needs no new locker.
                self._live = self.client.handler.async_result()
                self.client.get_acls_async(self.config.root).rawlink(self._acl_answer)
            return self._live

    def check_connected(self) -> None:
        """After waiting on :meth:`connecting`: raise unless requests may go now."""
        if self._ready:
            return
        live = self._live
        if live.ready() and not live.successful():
            raise live.exception
        raise unavailable(
            self.config.url,
            f"connecting within {self.config.connect_timeout:g}s",
            last=self._log.last_warning,
        ) from None

    def _on_state(self, state: str) -> None:
        # Called on kazoo's connection thread: never block here, only send.
        if state == KazooState.CONNECTED:
            self._connected()
        elif state == KazooState.SUSPENDED:
            self._dropped(
                "the connection to ZooKeeper was suspended: the lease cannot be confirmed",
                expired=False,
            )
        else:
            self._dropped("the ZooKeeper session expired or was closed", expired=True)

    def _connected(self) -> None:
        self._log.last_warning = None
        client_id = self.client.client_id
        session_id = client_id[0] if client_id else None
        with self._guard:
            self._end_grace()  # the server took our session back: it is alive
            if self._session_id is not None and session_id != self._session_id:
                # A new session we were not told about: the old one's nodes are gone.
                stale = self._forget_all()
            else:
                stale = []
            self._session_id = session_id
            check_acl = not self._acl_checked
        for node in stale:
            node.lease.lost.set("the ZooKeeper session was replaced")
        if check_acl:
            self.client.get_acls_async(self.config.root).rawlink(self._acl_answer)
        else:
            self._set_ready(session_id)

    def _acl_answer(self, result: Any) -> None:
        try:
            acls, _ = result.get_nowait()
        except NoNodeError:
            acls = []  # the first lock creates the root, with our ACL
        except NoAuthError:
            self._live.set_exception(acl_unreadable(self.config))
            return
        except Exception as exc:
            self._live.set_exception(unavailable(self.config.url, "reading the chroot's ACL", exc))
            return
        problem = acl_problem(self.config, acls)
        if problem is not None:
            self._live.set_exception(problem)
            return
        self._acl_checked = True
        client_id = self.client.client_id
        self._set_ready(client_id[0] if client_id else None)

    def _set_ready(self, session_id: int | None) -> None:
        with self._guard:
            if session_id is None or session_id != self._session_id:
                return  # dropped again meanwhile
            self._ready = True
            live = self._live
            orphans = [path for path in self._orphans if path not in self._cleaning]
        live.set(True)
        for path in orphans:
            self._cleanup(path, session_id)

    def _dropped(self, reason: str, *, expired: bool) -> None:
        with self._guard:
            self._ready = False
            if self._live.ready():
                self._live = self.client.handler.async_result()
            if expired:
                self._end_grace()
                lost = self._forget_all()
                self._session_id = None
            elif self.config.suspended == "lost":
                lost = self._give_up_held()
            else:
                lost = []
                if self._grace is None:
                    self._grace = threading.Timer(self.config.keep_grace, self._grace_over)
                    self._grace.daemon = True
                    self._grace.start()
        for node in lost:
            node.lease.lost.set(reason)
        if expired:
            self.watches.forget()  # kazoo drops a dead session's watches

    def _give_up_held(self) -> list[Node]:
        # Under the guard. The session may live on: its nodes become orphans.
        nodes = list(self._held.values())
        self._held.clear()
        for node in nodes:
            self._orphans[node.path] = node.czxid
        return nodes

    def _end_grace(self) -> None:
        # Under the guard.
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _grace_over(self) -> None:
        """``suspended=keep``: still suspended after the grace, the server may expire the
        session any moment now, and give our locks to others; the leases are lost."""
        with self._guard:
            if self._grace is not threading.current_thread():
                return  # reconnected (or dropped and suspended again) meanwhile
            self._grace = None
            lost = self._give_up_held()
        grace = self.config.keep_grace
        for node in lost:
            node.lease.lost.set(
                f"the connection to ZooKeeper was suspended for {grace:g}s"
                " (suspended=keep's grace): the session may expire before it is back"
            )

    def _forget_all(self) -> list[Node]:
        # Under the guard. The session is gone: so are its ephemeral nodes.
        nodes = list(self._held.values())
        self._held.clear()
        self._orphans.clear()
        self._cleaning.clear()
        return nodes

    # --- locking ---------------------------------------------------------------------

    def create(self, names: Iterable[str]) -> Batch:
        """Send one ephemeral create per name, all at once."""
        client_id = self.client.client_id
        session_id = client_id[0] if client_id else 0
        client, acl, orphans = self.client, self._acl, self._orphans
        creates = []
        for name in names:
            path = self._path(name)
            token = new_token()
            if path in orphans:
                result = None  # our own earlier node may still be there: held, as far as we know
            else:
                result = EphemeralCreate(client, path, node_value(token), acl)
            creates.append(Create(name, path, token, result))
        return Batch(self, creates, session_id)

    def lock_path(self, name: str) -> str:
        """The path of lock ``name``'s node."""
        return self._path(name)

    def _path(self, name: str) -> str:
        # Lock names are few (job names) and hot: escape each once.
        path = self._paths.get(name)
        if path is None:
            if len(self._paths) >= _PATH_CACHE:
                self._paths.clear()
            path = self._paths[name] = self.config.node_path(quote_name(name))
        return path

    def hold(self, node: Node) -> None:
        """Track a granted node; if the session changed or dropped meanwhile, it is born lost."""
        with self._guard:
            current = node.session_id == self._session_id
            if current and (self._ready or self.config.suspended == "keep"):
                self._held[node.path] = node
                return
            if current:
                self._orphans[node.path] = node.czxid
        node.lease.lost.set("the connection to ZooKeeper dropped while acquiring")

    def delete(self, node: Node) -> Any | None:
        """Send the version-checked delete of our node; ``None`` when there is nothing to send
        (already released, closed, or lost -- then the session cleans up)."""
        with self._guard:
            if self._held.get(node.path) is not node:
                return None
            del self._held[node.path]
        return VersionedDelete(self.client, node.path, node.version)

    def deleted(self, node: Node, result: Any) -> bool:
        """Whether the delete removed our node; an unanswered one is retried by the session."""
        if not result.ready():
            self.orphan(node.path, node.czxid)
            return False
        try:
            result.get_nowait()
        except (NoNodeError, BadVersionError):
            return False
        except OUTCOME_UNKNOWN:
            self.orphan(node.path, node.czxid)
            return False
        except Exception as exc:  # session expired or closed: the node went with it
            _log.debug("releasing %s: %r", node.path, exc)
            return False
        return True

    def check(self, node: Node) -> Any:
        """Send an ``exists`` of the lease's node (``extend`` confirms the lease with it)."""
        return self.client.exists_async(node.path)

    def checked(self, node: Node, result: Any) -> None:
        """Raise unless the node is still there and still ours; a missing node fires ``lost``."""
        url = self.config.url
        if not result.ready():
            raise unavailable(url, f"confirming the lease on {shown(node.name)}")
        try:
            stat = result.get_nowait()
        except Exception as exc:
            raise unavailable(url, f"confirming the lease on {shown(node.name)}", exc) from None
        if stat is not None and stat.czxid == node.czxid:
            return
        with self._guard:
            if self._held.get(node.path) is node:
                del self._held[node.path]
        reason = f"lock node {shown(node.path)} was deleted"
        node.lease.lost.set(reason)
        if stat is None:
            raise LockLost(reason)
        raise NotOwner(f"{reason}, and {shown(node.name)} is now held by another owner")

    def closing(self) -> list[Any]:
        """Mark every held node released-by-close and return their leases (no I/O)."""
        with self._guard:
            nodes = list(self._held.values())
            self._held.clear()
            self._orphans.clear()
        for node in nodes:
            node.closed = True
        return [node.lease for node in nodes]

    def stop(self) -> None:
        """Close the session (the server deletes all its nodes at once) and the client. Blocks."""
        with self._guard:
            self._closed = True
            self._end_grace()
        try:
            self.client.stop()
        finally:
            self.client.close()

    # --- orphans ---------------------------------------------------------------------

    def orphan(self, path: str, czxid: int | None) -> None:
        """A node of ours that no lease owns (or may exist): delete it once we can."""
        with self._guard:
            if self._session_id is None:
                return  # no session, no node
            self._orphans[path] = czxid
            session_id = self._session_id if self._ready and path not in self._cleaning else None
        if session_id is not None:
            self._cleanup(path, session_id)

    def _cleanup(self, path: str, session_id: int) -> None:
        with self._guard:
            self._cleaning.add(path)
        # Requests of one session are applied in order: this ``exists`` sees the outcome
        # of any create or delete of ours sent before it.
        self.client.exists_async(path).rawlink(partial(self._cleanup_seen, path, session_id))

    def _cleanup_seen(self, path: str, session_id: int, result: Any) -> None:
        try:
            stat = result.get_nowait()
        except OUTCOME_UNKNOWN:
            self._cleanup_retry(path)
            return
        except Exception:
            stat = None  # session gone: so is the node
        with self._guard:
            czxid = self._orphans.get(path, -1)
            ours = (
                stat is not None
                and stat.ephemeralOwner == session_id
                and czxid in (None, stat.czxid)
                and path not in self._held
            )
        if not ours:
            self._cleanup_done(path)
            return
        self.client.delete_async(path, version=stat.version).rawlink(
            partial(self._cleanup_deleted, path)
        )

    def _cleanup_deleted(self, path: str, result: Any) -> None:
        try:
            result.get_nowait()
        except OUTCOME_UNKNOWN:
            self._cleanup_retry(path)
            return
        except Exception:  # gone already, or the session with it
            pass
        self._cleanup_done(path)

    def _cleanup_retry(self, path: str) -> None:
        # The connection dropped mid-cleanup: the orphan stays, and _set_ready retries it.
        with self._guard:
            self._cleaning.discard(path)
            retry = self._ready and path in self._orphans
            session_id = self._session_id
        if retry and session_id is not None:
            self._cleanup(path, session_id)

    def _cleanup_done(self, path: str) -> None:
        with self._guard:
            self._cleaning.discard(path)
            self._orphans.pop(path, None)

    # --- introspection ---------------------------------------------------------------

    def list_locks(self) -> Any:
        """Send the listing of the lock nodes."""
        return self.client.get_children_async(self.config.root)

    def read_locks(self, listing: Any) -> list[tuple[str, Any]]:
        """Interpret the listing and send a read of each node, all at once."""
        if not listing.ready():
            raise unavailable(self.config.url, "listing locks")
        try:
            children = listing.get_nowait()
        except NoNodeError:
            return []
        except Exception as exc:
            raise unavailable(self.config.url, "listing locks", exc) from None
        return [
            (child, self.client.get_async(self.config.node_path(child)))
            for child in sorted(children)
            if child != TICKS  # the tick claims' marks, not a lock
        ]

    def lock_infos(self, reads: list[tuple[str, Any]]) -> list[LockInfo]:
        """Interpret the reads: one :class:`LockInfo` per node still there."""
        infos = []
        for child, result in reads:
            if not result.ready():
                raise unavailable(self.config.url, "reading locks")
            try:
                value, stat = result.get_nowait()
            except NoNodeError:
                continue  # released meanwhile
            except NoAuthError:
                infos.append(hidden_lock_info(self.config.node_path(child), child))
                continue
            except Exception as exc:
                raise unavailable(self.config.url, "reading locks", exc) from None
            infos.append(lock_info(self.config.node_path(child), child, value, stat))
        return infos
