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

import errno
import fcntl
import hashlib
import os
import re
import socket
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from stat import S_IMODE, S_ISDIR, S_ISREG
from urllib.parse import unquote

from .._url import LockURL, OptionParser, as_duration, quote_name
from ..abc import Capability
from ..errors import BackendUnavailable, InvalidURL
from .base import AsyncLeaseBase, AsyncLockerBase, LeaseBase, LockerBase, LockInfo, new_token

__all__ = ["AsyncFileLocker", "FileBackend", "FileLocker", "backend", "default_directory"]

_OPTIONS = OptionParser({"ttl": as_duration}, {"ttl": 30.0})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening (or reading) a FIFO or a device planted as a lock file never waits.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_READ = 4096  # a lock file holds two short lines
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

    # Generated from AsyncFileLease by scripts/async_to_sync.py: edit that class and rerun.
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
        return None  # bound to the descriptor: nothing expires


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
        self._open: set[_FileLockState] = set()
        return float(values["ttl"])

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, _filename(name))

    def _lock(self, name: str, cls: type[LeaseBase] | type[AsyncLeaseBase]) -> object | None:
        filename = _filename(name)
        fd = self._open_lock_file(filename)
        path = self._path(name)
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

    def _open_lock_file(self, filename: str) -> int:
        """The lock file ``filename``, opened (made if missing) in the verified directory:
        never through a symbolic link, and only a regular file of ours."""
        directory = open_directory(self.directory, create=True)
        path = os.path.join(self.directory, filename)
        try:
            fd = os.open(filename, _LOCK_FLAGS, 0o600, dir_fd=directory)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BackendUnavailable(
                    f"lock file {path!r} is a symbolic link: refusing to follow it"
                ) from None
            raise BackendUnavailable(f"cannot open lock file {path!r}: {exc.strerror}") from None
        finally:
            os.close(directory)
        problem = _not_ours(os.fstat(fd), "lock file")
        if problem is not None:
            os.close(fd)
            raise BackendUnavailable(f"{problem.format(path=path)}: refusing to use it")
        return fd

    def _release_all(self) -> None:
        for state in list(self._open):
            state.lease._released = True  # type: ignore[attr-defined]  # closed: no longer held
            state.release()

    def locks(self) -> list[LockInfo]:
        """The locks held in this directory, by any process, with their holders.

        Only regular files of ours are read, at most a few KiB each, never through a
        link or blocking on a FIFO; a file whose content does not parse is skipped.
        """
        # Made when missing, as the first acquire would: one that cannot be made fails.
        directory = open_directory(self.directory, create=True)
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(_SUFFIX))
            held_inodes = _flock_inodes()
            found = []
            for filename in names:
                info = _read_lock_file(directory, filename, held_inodes)
                if info is not None:
                    holder, since, details = info
                    found.append(
                        LockInfo(
                            key=os.path.join(self.directory, filename),
                            name=_name_of(filename),
                            holder=holder,
                            since=since,
                            details=details,
                        )
                    )
            return found
        finally:
            os.close(directory)


_LockRecord = tuple[str, datetime | None, dict[str, object]]


def _read_lock_file(directory: int, filename: str, held: set[int] | None) -> _LockRecord | None:
    """(holder, since, details) of a held lock file, or ``None``: not a regular
    file of ours, not held (a crashed holder's), or not what a holder writes."""
    try:
        fd = os.open(filename, _READ_FLAGS, dir_fd=directory)
    except OSError:
        return None  # a link (ELOOP), gone, or not ours to read
    try:
        stat = os.fstat(fd)
        if _not_ours(stat, "") is not None or (held is not None and stat.st_ino not in held):
            return None
        data = os.pread(fd, _MAX_READ, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = data.decode("utf-8", "replace").splitlines()
    if len(lines) < 2:
        return None  # no holder line: released
    fields = lines[1].split(" ")
    try:
        fence = int(lines[0])
        since = datetime.fromisoformat(fields[3]) if len(fields) > 3 else None
    except ValueError:
        return None
    pid, host, token = [*fields, "", "", ""][:3]
    return f"pid {pid} on {host}", since, {"token": token, "fencing_token": fence}


def open_directory(path: Path, *, create: bool) -> int:
    """A descriptor of the lock directory ``path``, verified: not a symbolic link, a
    directory, owned by this process's user, writable by no one else. Made (0700,
    whatever the umask) when missing and ``create``; ``FileNotFoundError`` otherwise.
    Anything else is refused with :class:`BackendUnavailable` naming the problem."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            raise
        _make_private(path)
        return open_directory(path, create=False)
    except OSError as exc:
        # O_NOFOLLOW | O_DIRECTORY on a link to a directory fails with ENOTDIR, not ELOOP.
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(path)):
            why = "is a symbolic link: refusing to follow it"
        else:
            why = f"cannot be opened: {exc.strerror}"
        raise BackendUnavailable(f"lock directory {str(path)!r} {why}") from None
    problem = _not_ours(os.fstat(fd), "lock directory")
    if problem is not None:
        os.close(fd)
        raise BackendUnavailable(
            f"{problem.format(path=str(path))}: refusing to use it (another user could plant"
            " links there or take its names); use a directory of yours with mode 0700"
        )
    return fd


def _not_ours(stat: os.stat_result, what: str) -> str | None:
    """Why a file or directory is not safe to use (a template with ``{path!r}``), or
    ``None``: it must be of its kind, owned by us, and writable by no one else."""
    kind = "a directory" if what == "lock directory" else "a regular file"
    is_kind = S_ISDIR(stat.st_mode) if what == "lock directory" else S_ISREG(stat.st_mode)
    if not is_kind:
        return f"{what} {{path!r}} is not {kind}"
    if stat.st_uid != os.geteuid():
        return f"{what} {{path!r}} is owned by uid {stat.st_uid}, not by uid {os.geteuid()}"
    if stat.st_mode & 0o022:
        return f"{what} {{path!r}} is writable by group or others (mode {S_IMODE(stat.st_mode):o})"
    return None


def _make_private(path: Path) -> None:
    """Make ``path`` and its missing parents 0700, whatever the umask (``mkdir`` applies
    the umask to the mode it is given; ``makedirs`` gives parents 0777)."""
    missing = []
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # made meanwhile: open_directory verifies what is there
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot make lock directory {str(directory)!r}: {exc.strerror}"
            ) from None
        fd = os.open(directory, _DIR_FLAGS)
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, 0o700)  # the umask may have taken bits away, never added
        finally:
            os.close(fd)


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

    # Generated from AsyncFileLocker by scripts/async_to_sync.py: edit that class and rerun.
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
