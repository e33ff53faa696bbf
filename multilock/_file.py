"""``file:///dir``: ``flock`` on one file per name, for replicas on one host.

``flock`` (not ``fcntl`` record locks, which belong to the whole process and
vanish when any descriptor of the file is closed) locks an *open file
description*: two lockers in one process exclude each other, and the kernel
frees the lock the moment the holder dies, SIGKILL included.

Lock files are never unlinked: deleting one while another process has it open
would let two holders lock two different inodes of the same name. The file
holds the name's fencing counter (first line), bumped under the lock, and a
line describing the current holder, cleared on release.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

from ._base import AsyncLeaseBase, AsyncLockerBase, LeaseBase, LockerBase, LockInfo, new_token
from ._url import LockURL, OptionParser, as_duration, quote_name
from .abc import Capability
from .errors import BackendUnavailable, InvalidURL

__all__ = ["AsyncFileLocker", "FileBackend", "FileLocker", "backend", "default_directory"]

_OPTIONS = OptionParser({"ttl": as_duration}, {"ttl": 30.0})
_MAX_FILENAME = 200  # below NAME_MAX (255) with room for the suffix
_SUFFIX = ".lock"
_HASHED = re.compile(r".{100}~[0-9a-f]{32}")


def default_directory() -> Path:
    """Where ``file://`` (no path) keeps its locks: a private per-user directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "multilock"
    return Path(tempfile.gettempdir()) / f"multilock-{os.getuid()}"


def _filename(name: str) -> str:
    quoted = quote_name(name)
    if len(quoted) + len(_SUFFIX) <= _MAX_FILENAME:
        return quoted + _SUFFIX
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f"{quoted[:100]}~{digest}{_SUFFIX}"


def _name_of(filename: str) -> str | None:
    """The lock name of a lock file, or ``None`` for a hashed (shortened) long name."""
    stem = filename.removesuffix(_SUFFIX)
    if _HASHED.fullmatch(stem):
        return None
    return "" if stem == "%" else unquote(stem)  # "%" is quote_name's empty name


class _FileLockState:
    """What a file lease needs: the open descriptor that holds the flock."""

    def __init__(self, fd: int, fence: int, registry: set[_FileLockState]) -> None:
        self.fd = fd
        self.fence = fence
        self.registry = registry
        registry.add(self)

    def release(self) -> bool:
        fd, self.fd = self.fd, -1
        if fd < 0:
            return False
        self.registry.discard(self)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.fence}\n".encode(), 0)
        except OSError:
            pass  # the counter line is advisory bookkeeping; the unlock below is what matters
        finally:
            os.close(fd)  # closing the last descriptor drops the flock
        return True


class FileLease(LeaseBase):
    """A lease of the ``file://`` backend (sync API)."""

    __slots__ = ("_state",)

    def _release(self) -> bool:
        return self._state.release()  # type: ignore[attr-defined,no-any-return]

    def _extend(self, ttl: float | None) -> float | None:
        return None  # bound to the descriptor: nothing expires


class AsyncFileLease(AsyncLeaseBase):
    """A lease of the ``file://`` backend (async API); flock with LOCK_NB never blocks."""

    __slots__ = ("_state",)

    async def _release(self) -> bool:
        return self._state.release()  # type: ignore[attr-defined,no-any-return]

    async def _extend(self, ttl: float | None) -> float | None:
        return None


class _FileCommon:
    capabilities = frozenset(
        {Capability.FENCING, Capability.SESSION, Capability.CROSS_PROCESS, Capability.INTROSPECTION}
    )

    def _setup(self, url: LockURL) -> float:
        if url.host not in (None, "", "localhost"):
            raise InvalidURL(
                f"file:// URLs name a local directory, not host {url.host!r}: "
                "use file:///absolute/dir"
            )
        values, _ = _OPTIONS.parse(url)
        self.directory = Path(url.path) if url.path not in ("", "/") else default_directory()
        self._made = False
        self._open: set[_FileLockState] = set()
        return float(values["ttl"])

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, _filename(name))

    def _lock(self, name: str, cls: type[LeaseBase] | type[AsyncLeaseBase]) -> object | None:
        path = self._path(name)
        try:
            fd = self._open_file(path)
        except OSError as exc:
            raise BackendUnavailable(f"cannot open lock file {path!r}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:
            os.close(fd)
            raise BackendUnavailable(f"cannot flock {path!r}: {exc.strerror}") from None
        try:
            first = os.pread(fd, 64, 0).split(b"\n", 1)[0]
            fence = (int(first) if first.strip().isdigit() else 0) + 1
            token = new_token()
            since = datetime.now(UTC).isoformat()
            record = f"{fence}\n{os.getpid()} {socket.gethostname()} {token} {since}\n"
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        lease = cls(name, path, token, fence)
        lease._state = _FileLockState(fd, fence, self._open)  # type: ignore[union-attr]
        lease._state.lease = lease  # type: ignore[union-attr]
        return lease

    def _open_file(self, path: str) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            return os.open(path, flags, 0o600)
        except FileNotFoundError:
            # First use, or the directory was removed: make it (private) and retry once.
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            return os.open(path, flags, 0o600)

    def _release_all(self) -> None:
        for state in list(self._open):
            state.lease._released = True  # type: ignore[attr-defined]  # closed: no longer held
            state.release()

    def _scan(self) -> list[os.DirEntry[str]]:
        try:
            return list(os.scandir(self.directory))
        except FileNotFoundError:
            # As the first acquire does: make the directory; one that cannot be made fails.
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            return []

    def locks(self) -> list[LockInfo]:
        """The locks held in this directory, by any process, with their holders."""
        held_inodes = _flock_inodes()
        found: list[LockInfo] = []
        try:
            entries = sorted(self._scan(), key=lambda e: e.name)
        except OSError as exc:
            message = f"cannot list lock directory {str(self.directory)!r}: {exc.strerror}"
            raise BackendUnavailable(message) from None
        for entry in entries:
            if not entry.name.endswith(_SUFFIX):
                continue
            try:
                text = Path(entry.path).read_text(errors="replace")
                inode = entry.inode()
            except OSError:
                continue
            lines = text.splitlines()
            if len(lines) < 2 or (held_inodes is not None and inode not in held_inodes):
                continue  # no holder line, or the kernel says nobody holds it (crashed holder)
            pid, host, token, since = [*lines[1].split(" "), "", "", ""][:4]
            found.append(
                LockInfo(
                    key=entry.path,
                    name=_name_of(entry.name),
                    holder=f"pid {pid} on {host}",
                    since=datetime.fromisoformat(since) if since else None,
                    details={"token": token, "fencing_token": int(lines[0] or 0)},
                )
            )
        return found


def _flock_inodes() -> set[int] | None:
    """Inodes that have a FLOCK lock, from /proc/locks (Linux); ``None`` elsewhere."""
    try:
        with open("/proc/locks") as fh:
            rows = fh.read().splitlines()
    except OSError:
        return None
    inodes = set()
    for row in rows:
        parts = row.split()
        if len(parts) > 5 and "FLOCK" in parts:
            try:
                inodes.add(int(parts[5].rsplit(":", 1)[1]))
            except (IndexError, ValueError):
                continue
    return inodes


class FileLocker(_FileCommon, LockerBase):
    """Sync locker of ``file://``."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        return self._lock(name, FileLease)  # type: ignore[return-value]

    def _close(self) -> None:
        self._release_all()


class AsyncFileLocker(_FileCommon, AsyncLockerBase):
    """Async locker of ``file://``."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        return self._lock(name, AsyncFileLease)  # type: ignore[return-value]

    async def _close(self) -> None:
        self._release_all()


class _FileHooks:
    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        return 0.0  # the kernel drops the flock with the holder's last descriptor

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        raise NotImplementedError("a flock cannot be taken from a live holder")

    def unreachable_url(self, url: LockURL) -> str | None:
        return "file:///proc/multilock-unreachable"  # a directory nobody can create


class FileBackend:
    """The ``file://`` backend (registered through the entry-point group)."""

    conformance = _FileHooks()

    def connect(self, url: LockURL) -> FileLocker:
        """A sync locker."""
        return FileLocker(url)

    def connect_async(self, url: LockURL) -> AsyncFileLocker:
        """An async locker."""
        return AsyncFileLocker(url)


backend = FileBackend()
