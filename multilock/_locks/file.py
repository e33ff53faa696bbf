"""``file:///dir``: ``flock`` on one file per name, for replicas on one host.

``flock`` (not ``fcntl`` record locks, which belong to the whole process and
vanish when any descriptor of the file is closed) locks an *open file
description*: two lockers in one process exclude each other, and the kernel
frees the lock the moment the holder dies, SIGKILL included.

Lock files are never unlinked: deleting one while another process has it open
would let two holders lock two different inodes of the same name. The file
holds the name's fencing counter (first line), bumped under the lock, and a
line describing the current holder, cleared on release.

Tick claims (``TICK_CLAIM``) keep each name's mark -- the latest fire time claimed, in
microseconds -- in a file of its own beside the lock file (``.tick`` for ``.lock``),
read and raised under a brief ``flock`` of that file. Mark files are never deleted:
a mark lasts as long as the directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import hashlib
import math
import os
import re
import select
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from stat import S_IMODE, S_ISDIR, S_ISREG
from types import TracebackType
from urllib.parse import unquote

from .._url import LockURL, OptionParser, as_duration, quote_name
from ..abc import Capability
from ..errors import BackendUnavailable, InvalidURL
from .base import (
    AsyncLeaseBase,
    AsyncLockerBase,
    AsyncReleaseWatch,
    LeaseBase,
    LockerBase,
    LockInfo,
    ReleaseWatch,
    new_token,
)

__all__ = [
    "AsyncFileLocker",
    "AsyncFileWatch",
    "FileBackend",
    "FileLocker",
    "FileWatch",
    "backend",
    "default_directory",
]

_OPTIONS = OptionParser({"ttl": as_duration}, {"ttl": 30.0})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening (or reading) a FIFO or a device planted as a lock file never waits.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_READ = 4096  # a lock file holds two short lines
_MAX_FILENAME = 200  # below NAME_MAX (255) with room for the suffix
_SUFFIX = ".lock"
_TICK_SUFFIX = ".tick"
_TICK_PATIENCE = 5.0  # seconds a claim waits for another claimer's read-compare-write
_HASHED = re.compile(r".{100}~[0-9a-f]{32}")


def default_directory() -> Path:
    """Where ``file://`` (no path) keeps its locks: a private per-user directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "multilock"
    return Path(tempfile.gettempdir()) / f"multilock-{os.getuid()}"


def _filename(name: str, suffix: str = _SUFFIX) -> str:
    quoted = quote_name(name)
    if len(quoted) + len(suffix) <= _MAX_FILENAME:
        return quoted + suffix
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f"{quoted[:100]}~{digest}{suffix}"


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


# inotify(7), through libc: the stdlib has no binding, and a dependency for three calls
# is not worth it. The events that can mean "released": a writer's close (a release,
# or the kernel closing a dead holder's descriptor), and the file going away.
_IN_ATTRIB, _IN_CLOSE_WRITE, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x4, 0x8, 0x400, 0x800
_IN_MASK = _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_MOVE_SELF
_RECHECKS = (0.001, 0.01, 0.1)
"""After an event that found the file still held, probe again this long after it: the
kernel reports a close (fsnotify) *before* it drops the flock of that close, so the
probe woken by a release may come too early."""
_INOTIFY_EVENTS = 64 * 1024


class _Inotify:
    """inotify(7) through libc (``None`` off Linux), and a pool of its instances.

    Pooled, process-wide: closing an instance that has had a watch waits for the
    kernel's grace period (5-15 ms measured), which every waiting acquire would pay on
    its way out; removing a watch does not. An instance is used by one wait at a time.
    """

    IDLE = 8
    """Instances kept for the next waits (each counts against the user's
    ``fs.inotify.max_user_instances``, 128 by default)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._init, self._add, self._rm = (
            libc.inotify_init1,
            libc.inotify_add_watch,
            libc.inotify_rm_watch,
        )
        self._init.argtypes, self._init.restype = [ctypes.c_int], ctypes.c_int
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add.restype = ctypes.c_int
        self._rm.argtypes, self._rm.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        self._idle: list[int] = []
        self._guard = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    @classmethod
    def load(cls) -> _Inotify | None:
        """The binding, or ``None`` where there is no inotify."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls()
        except (OSError, AttributeError):
            return None

    def watch(self, path: str) -> tuple[int, int]:
        """(instance, watch) told of ``path``'s events of :data:`_IN_MASK`."""
        with self._guard:
            events = self._idle.pop() if self._idle else -1
        if events < 0:
            events = self._init(os.O_NONBLOCK | os.O_CLOEXEC)
            if events < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        wd = self._add(events, path.encode(), _IN_MASK)
        if wd < 0:
            error = ctypes.get_errno()
            self._give_back(events)
            raise OSError(error, "inotify_add_watch failed")
        return events, wd

    def unwatch(self, events: int, wd: int) -> None:
        """End the watch ``wd`` and give its instance back."""
        if self._rm(events, wd) < 0:
            os.close(events)  # not a watch of this instance any more: do not reuse it
            return
        self._give_back(events)

    def _give_back(self, events: int) -> None:
        with self._guard:
            if len(self._idle) < self.IDLE:
                self._idle.append(events)
                return
        os.close(events)

    def _forget(self) -> None:
        """In a forked child: the instances are the parent's too; closing the child's
        copies is cheap, and the child makes its own."""
        self._guard = threading.Lock()
        idle, self._idle = self._idle, []
        for events in idle:
            os.close(events)


_INOTIFY = _Inotify.load()


class _ReleaseProbe:
    """What a waiter on a ``file://`` name watches: an inotify watch told of every
    close of the lock file by a writer (each holder's release among them), and a
    read-only descriptor of the file to test whether it is free.

    No thread and no blocked ``flock``: the descriptor is closed and the watch removed
    when the wait ends, whatever ended it, and nothing stays queued on the lock.
    """

    __slots__ = ("events", "file", "wd")

    def __init__(self, locker: _FileCommon, name: str) -> None:
        if _INOTIFY is None:
            raise OSError(errno.ENOSYS, "inotify is not available")
        self.file = locker._open_lock_file(_filename(name), _READ_FLAGS)
        try:
            # Through /proc: the inode this descriptor opened (and verified), not
            # whatever the name leads to now.
            self.events, self.wd = _INOTIFY.watch(f"/proc/self/fd/{self.file}")
        except BaseException:
            os.close(self.file)
            raise

    def free(self) -> bool:
        """Whether the lock looks free now. The events so far are read first: one that
        comes after this test is a release to wake for."""
        with suppress(BlockingIOError):
            while os.read(self.events, _INOTIFY_EVENTS):
                pass
        try:
            fcntl.flock(self.file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(self.file, fcntl.LOCK_UN)
        # A file unlinked or replaced is free for ever: the next try opens the new one.
        return os.fstat(self.file).st_nlink > 0

    def close(self) -> None:
        """Remove the watch and close the file (once)."""
        if self.file >= 0:
            assert _INOTIFY is not None
            _INOTIFY.unwatch(self.events, self.wd)
            os.close(self.file)
            self.file = -1


class AsyncFileWatch(AsyncReleaseWatch):
    """A waiting acquire's watch on a ``file://`` name: woken by a close of the lock
    file by a writer (inotify, Linux), it returns once the lock tests free. Elsewhere,
    or when inotify cannot be had (its per-user limits), it polls."""

    wakes = True

    def __init__(self, locker: _FileCommon, name: str) -> None:
        self._locker = locker
        self._name = name
        self._probe: _ReleaseProbe | None = None

    def _ready(self) -> _ReleaseProbe | None:
        """The probe, made at the first wait (an acquire of a free name costs nothing);
        ``None``, polling, when it cannot be made."""
        if self._probe is None and self.wakes:
            try:
                self._probe = _ReleaseProbe(self._locker, self._name)
            except (OSError, BackendUnavailable):
                self.wakes = False
        return self._probe

    # sync-by-hand: the sync watch waits in poll()
    async def wait(self, seconds: float) -> None:
        """Until the lock tests free after a writer closed its file, or ``seconds``."""
        probe = self._ready()
        if probe is None:
            await super().wait(seconds)
            return
        until = time.monotonic() + seconds
        rechecks: Iterator[float] = iter(())
        while not probe.free() and (left := until - time.monotonic()) > 0:
            step = next(rechecks, left)
            if await _readable(probe.events, min(step, left)):
                rechecks = iter(_RECHECKS)

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


class FileWatch(ReleaseWatch):
    """A waiting acquire's watch on a ``file://`` name (sync API; see
    :class:`AsyncFileWatch`)."""

    def wait(self, seconds: float) -> None:
        """Until the lock tests free after a writer closed its file, or ``seconds``."""
        probe = self._ready()
        if probe is None:
            super().wait(seconds)
            return
        until = time.monotonic() + seconds
        readable = select.poll()
        readable.register(probe.events, select.POLLIN)
        rechecks: Iterator[float] = iter(())
        while not probe.free() and (left := until - time.monotonic()) > 0:
            step = next(rechecks, left)
            if readable.poll(math.ceil(min(step, left) * 1000)):
                rechecks = iter(_RECHECKS)

    # Generated from AsyncFileWatch by scripts/async_to_sync.py: edit that class and rerun.
    wakes = True

    def __init__(self, locker: _FileCommon, name: str) -> None:
        self._locker = locker
        self._name = name
        self._probe: _ReleaseProbe | None = None

    def _ready(self) -> _ReleaseProbe | None:
        """The probe, made at the first wait (an acquire of a free name costs nothing);
        ``None``, polling, when it cannot be made."""
        if self._probe is None and self.wakes:
            try:
                self._probe = _ReleaseProbe(self._locker, self._name)
            except (OSError, BackendUnavailable):
                self.wakes = False
        return self._probe

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


async def _readable(fd: int, seconds: float) -> bool:
    """Whether ``fd`` turned readable within ``seconds`` (waited on the event loop)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _settle_once, readable)
    try:
        async with asyncio.timeout(seconds):
            await readable
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True


def _settle_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _FileCommon:
    capabilities = frozenset(
        {
            Capability.FENCING,
            Capability.SESSION,
            Capability.CROSS_PROCESS,
            Capability.INTROSPECTION,
            Capability.TICK_CLAIM,
        }
    )
    # claim_retention: None (the kit's), mark files are never deleted

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

    def _claim(self, names: list[str], fires: list[int]) -> list[bool]:
        return [self._claim_one(name, fire) for name, fire in zip(names, fires, strict=True)]

    def _claim_one(self, name: str, fire: int) -> bool:
        """Raise the mark of ``name`` to ``fire`` if it is below: read, compare and write
        under an exclusive ``flock`` of the mark file, held for those three calls only."""
        fd = self._open_lock_file(_filename(name, _TICK_SUFFIX))
        path = self._path(name).removesuffix(_SUFFIX) + _TICK_SUFFIX
        try:
            _flock_briefly(fd, path)
            raw = os.pread(fd, 64, 0).strip()
            try:
                mark = int(raw) if raw else None
            except ValueError:
                raise BackendUnavailable(f"tick mark file {path!r} holds {raw[:20]!r}") from None
            if mark is not None and mark >= fire:
                return False
            data = f"{fire}\n".encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            return True
        except OSError as exc:
            raise BackendUnavailable(f"cannot claim a tick in {path!r}: {exc.strerror}") from None
        finally:
            os.close(fd)  # drops the flock

    def _open_lock_file(self, filename: str, flags: int = _LOCK_FLAGS) -> int:
        """The lock file ``filename``, opened (made if missing, with the default
        ``flags``) in the verified directory: never through a symbolic link, and only a
        regular file of ours."""
        directory = open_directory(self.directory, create=True)
        path = os.path.join(self.directory, filename)
        try:
            fd = os.open(filename, flags, 0o600, dir_fd=directory)
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


def _flock_briefly(fd: int, path: str) -> None:
    """An exclusive ``flock`` of a mark file, polled (another claimer holds it for a
    read and a write) up to :data:`_TICK_PATIENCE`: a frozen claimer never hangs us."""
    deadline = time.monotonic() + _TICK_PATIENCE
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"tick mark file {path!r} stayed locked for {_TICK_PATIENCE:g} s"
                ) from None
            time.sleep(0.0005)


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

    def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        return self._claim(names, fires)

    def watch_released(self, name: str) -> FileWatch:
        """A watch woken when a writer closes ``name``'s lock file and it tests free."""
        return FileWatch(self, name)

    def _close(self) -> None:
        self._release_all()


class AsyncFileLocker(_FileCommon, AsyncLockerBase):
    """Async locker of ``file://``."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        return self._lock(name, AsyncFileLease)  # type: ignore[return-value]

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        return self._claim(names, fires)

    def watch_released(self, name: str) -> AsyncFileWatch:
        """A watch woken when a writer closes ``name``'s lock file and it tests free."""
        return AsyncFileWatch(self, name)

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
