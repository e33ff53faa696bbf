"""``zookeeper://`` URLs: the ensemble, the chroot, the options, the credentials, ACLs, TLS."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl

from multilock.backend import LockURL, OptionParser, as_duration, as_str
from multilock.errors import InvalidOption, InvalidURL

from ._tls import TLS, TLS_CONVERTERS, parse_tls

__all__ = ["DEFAULT_PORT", "DEFAULT_ROOT", "KEEP_GRACE_SHARE", "Config"]

DEFAULT_PORT = 2181
DEFAULT_ROOT = "/multilock"
"""Where the locks live when the URL names no chroot: never the tree's root, where
``/zookeeper`` is reserved and a lock named "zookeeper" would always look held."""

_SUSPENDED_POLICIES = ("lost", "keep")

KEEP_GRACE_SHARE = 1 / 6
"""``suspended=keep``'s grace, as a share of the session timeout T. kazoo suspends a
connection once its ping has gone unanswered, at most two thirds of T after the last
request the server answered -- so the server, which expires a session T after it last
heard from it, cannot have expired it sooner than T/3 after the suspension. Half of
that is the grace; the other half is margin for a late-running client thread and for
a server that granted a shorter timeout than asked (down to half)."""


def _as_policy(value: object) -> str:
    text = as_str(value).strip().lower()
    if text not in _SUSPENDED_POLICIES:
        raise InvalidOption(f"expected one of {', '.join(_SUSPENDED_POLICIES)}, got {value!r}")
    return text


_OPTIONS = OptionParser(
    {
        "session_timeout": as_duration,
        "connect_timeout": as_duration,
        "suspended": _as_policy,
        "username": as_str,
        "password": as_str,
        "ttl": as_duration,
        **TLS_CONVERTERS,
    },
    {
        # Modest: a crashed holder's lock is free again after this long.
        "session_timeout": 10.0,
        "connect_timeout": 5.0,
        "suspended": "lost",
        "ttl": 30.0,
    },
)

# ZooKeeper refuses these code points in paths; quote_name never produces them,
# but a chroot comes verbatim from the URL.
_BAD_PATH_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")


def _root(url: LockURL) -> str:
    path = url.path.rstrip("/")
    if not path:
        return DEFAULT_ROOT
    segments = path.split("/")[1:]
    for segment in segments:
        if segment in ("", ".", "..") or _BAD_PATH_CHARS.search(segment):
            raise InvalidURL(
                f"invalid chroot {url.path!r} in {url.masked!r}: every segment must be a"
                " non-empty ZooKeeper node name other than '.' and '..', without control"
                " characters"
            )
    if segments[0] == "zookeeper":
        raise InvalidURL(f"chroot {path!r} of {url.masked!r} is inside ZooKeeper's reserved tree")
    return path


@dataclass(frozen=True, repr=False)
class Config:
    """Everything a locker needs from its URL, validated once."""

    url: LockURL
    hosts: str
    """kazoo's connect string: ``host:port,host:port`` (no chroot: paths carry the root)."""
    root: str
    """The parent znode of every lock node, without trailing slash."""
    session_timeout: float
    connect_timeout: float
    suspended: str
    """``lost``: a suspended connection fires ``lost`` at once; ``keep``: an expiry does, or a
    suspension longer than :attr:`keep_grace`."""
    ttl: float
    username: str | None = None
    password: str | None = field(default=None, compare=False)
    tls: TLS | None = None
    """How to speak TLS to the ensemble; ``None``: plain TCP."""

    @classmethod
    def from_url(cls, url: LockURL) -> Config:
        """Validate ``url`` (hosts, chroot, options, credentials)."""
        values, _ = _OPTIONS.parse(url)
        if not url.hosts:
            raise InvalidURL(
                f"{url.masked!r} names no ZooKeeper server: use"
                f" {url.scheme}://host1:2181,host2:2181/chroot"
            )
        hosts = ",".join(
            f"[{host}]:{port or DEFAULT_PORT}" if ":" in host else f"{host}:{port or DEFAULT_PORT}"
            for host, port in url.hosts
        )
        username = values.get("username", url.username)
        password = values.get("password", url.password)
        if (username is None) != (password is None):
            raise InvalidOption(
                f"digest auth needs both a username and a password in {url.masked!r}"
            )
        if username is not None and (not username or ":" in username):
            raise InvalidOption(
                f"invalid ZooKeeper digest username {username!r}: non-empty, without ':'"
            )
        return cls(
            url=url,
            hosts=hosts,
            root=_root(url),
            session_timeout=float(values["session_timeout"]),
            connect_timeout=float(values["connect_timeout"]),
            suspended=str(values["suspended"]),
            ttl=float(values["ttl"]),
            username=username,
            password=password,
            tls=parse_tls(url, values),
        )

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """kazoo's ``auth_data``: the digest credentials, if any."""
        if self.username is None:
            return []
        return [("digest", f"{self.username}:{self.password}")]

    @property
    def acl(self) -> list[ACL]:
        """The ACL of lock nodes and of the parents we create.

        With credentials: everything for our digest identity, nothing for anyone
        else -- not even reading, since a lock node records its holder's host, pid
        and token. ZooKeeper checks DELETE (and CREATE) on the *parent*, so the
        parent's ACL is what stops a client without our credentials from deleting
        our locks. Without credentials the tree is open, as ZooKeeper's default.
        """
        if self.username is None or self.password is None:
            return list(OPEN_ACL_UNSAFE)
        return [make_digest_acl(self.username, self.password, all=True)]

    @property
    def keep_grace(self) -> float:
        """How long ``suspended=keep`` keeps leases through a suspension: a sixth of the
        session timeout (see :data:`KEEP_GRACE_SHARE`)."""
        return self.session_timeout * KEEP_GRACE_SHARE

    def node_path(self, quoted: str) -> str:
        """The znode of a lock whose name was escaped by ``quote_name``."""
        return f"{self.root}/{quoted}"

    def kazoo_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`kazoo.client.KazooClient` (credentials included)."""
        return {
            **self.connection_options(),
            "auth_data": self.auth_data or None,
            "default_acl": self.acl,
        }

    def connection_options(self) -> dict[str, Any]:
        """kazoo's keyword arguments that reach the ensemble: its hosts, timeout and TLS
        (also what another client attaching to our session needs)."""
        return {
            "hosts": self.hosts,
            "timeout": self.session_timeout,
            **(self.tls.kazoo_options() if self.tls else {}),
        }

    def __repr__(self) -> str:
        return f"Config({self.url.masked!r})"
