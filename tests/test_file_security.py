"""file:// on a shared host: each attack of issue 24, played by a second local user, is
refused with one clear line; the lock directory is verified, lock files are opened
without following links, and ``locks()`` reads little and never hangs.

The attacker is a user made for the session with ``useradd`` (removed at the end): the
tests that need one are skipped, saying so, where the tests do not run as root.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import multilock
from multilock._cli import _app, _locks  # noqa: F401  (_locks registers the command)
from multilock._locks.file import FileLocker, default_directory
from multilock.errors import BackendUnavailable

PRECIOUS = "the victim's own data\n"


class Attacker:
    """A second local user, who runs shell commands."""

    def __init__(self, name: str) -> None:
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid

    def run(self, script: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``sh -c script`` as this user (no supplementary groups)."""
        return subprocess.run(
            ["/bin/sh", "-c", script],
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
            cwd="/",
        )


@pytest.fixture(scope="session")
def attacker() -> Iterator[Attacker]:
    """A local user other than the one running the tests (made here, removed after)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("a second local user needs root and useradd: run the tests as root (CI does)")
    name = f"mlatk{os.getpid()}"[:31]
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield Attacker(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def shared_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A world-writable sticky directory like /tmp, used as the temporary directory (so
    that file:// with no path defaults to ``<it>/multilock-<uid>``)."""
    path = Path(tempfile.mkdtemp(prefix="multilock-shared-", dir="/tmp"))
    path.chmod(0o1777)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def precious(shared_tmp: Path) -> Path:
    """A file of the victim's (this process's user), in a directory only it can enter."""
    home = shared_tmp / "victim-home"
    home.mkdir(mode=0o700)
    target = home / "precious"
    target.write_text(PRECIOUS)
    return target


def file_locker(url: str) -> FileLocker:
    """A sync file:// locker."""
    locker = multilock.connect(url)
    assert isinstance(locker, FileLocker)
    return locker


def refused(locker: FileLocker, name: str = "nightly") -> str:
    """The one-line message ``try_acquire(name)`` is refused with."""
    with pytest.raises(BackendUnavailable) as info:
        locker.try_acquire(name)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- the attacks of the issue, by another user ----------------------------------------------


def test_a_directory_another_user_made_first_is_refused(
    attacker: Attacker, shared_tmp: Path, precious: Path
) -> None:
    home = shared_tmp / f"multilock-{os.getuid()}"
    assert default_directory() == home
    attacker.run(f"mkdir -m 777 {home} && ln -s {precious} {home}/nightly.lock")
    with file_locker("file://") as locker:
        message = refused(locker)
    assert message == (
        f"lock directory {str(home)!r} is owned by uid {attacker.uid}, not by uid"
        f" {os.geteuid()}: refusing to use it (another user could plant links there or take"
        " its names); use a directory of yours with mode 0700"
    )
    assert precious.read_text() == PRECIOUS  # not truncated through the planted link


def test_a_directory_another_user_owns_is_refused_even_if_not_writable(
    attacker: Attacker, shared_tmp: Path
) -> None:
    theirs = shared_tmp / "theirs"
    attacker.run(f"mkdir -m 755 {theirs}")
    with file_locker(f"file://{theirs}") as locker:
        assert f"is owned by uid {attacker.uid}" in refused(locker)
        with pytest.raises(BackendUnavailable, match="owned by uid"):
            locker.locks()


def test_a_link_in_place_of_the_directory_is_refused(attacker: Attacker, shared_tmp: Path) -> None:
    ours = shared_tmp / "ours"
    ours.mkdir(mode=0o700)
    home = shared_tmp / f"multilock-{os.getuid()}"
    attacker.run(f"ln -s {ours} {home}")  # even a link to a directory of ours
    with file_locker("file://") as locker:
        assert "is a symbolic link: refusing to follow it" in refused(locker)


def test_renaming_a_held_lock_file_is_not_open_to_another_user(
    attacker: Attacker, shared_tmp: Path
) -> None:
    with file_locker("file://") as holder, file_locker("file://") as second:
        lease = holder.try_acquire("job")
        assert lease is not None
        home = default_directory()
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        moved = attacker.run(f"mv {home}/job.lock {home}/job.old", check=False)
        assert moved.returncode != 0
        assert "Permission denied" in moved.stderr
        assert second.try_acquire("job") is None  # still one holder, one fencing token
        assert lease.fencing_token == 1


def test_a_lock_file_another_user_owns_is_refused_not_busy(
    attacker: Attacker, tmp_path: Path
) -> None:
    planted = tmp_path / "nightly.lock"
    planted.write_text("")
    os.chown(planted, attacker.uid, attacker.gid)  # planted while the directory was open
    planted.chmod(0o600)
    with file_locker(f"file://{tmp_path}") as locker:
        assert refused(locker) == (
            f"lock file {str(planted)!r} is owned by uid {attacker.uid}, not by uid"
            f" {os.geteuid()}: refusing to use it"
        )
        assert locker.try_acquire("other") is not None  # the rest of the directory works


# --- the same checks, without a second user -----------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o702])
def test_a_directory_writable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    locks.chmod(mode)
    with file_locker(f"file://{locks}") as locker:
        message = refused(locker)
    assert f"is writable by group or others (mode {stat.S_IMODE(mode):o})" in message
    assert list(locks.iterdir()) == []


def test_a_link_as_lock_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text(PRECIOUS)
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    (locks / "nightly.lock").symlink_to(target)
    with file_locker(f"file://{locks}") as locker:
        assert refused(locker) == (
            f"lock file {str(locks / 'nightly.lock')!r} is a symbolic link: refusing to follow it"
        )
    assert target.read_text() == PRECIOUS


def test_a_fifo_or_a_directory_as_lock_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.lock", 0o600)
    (tmp_path / "dir.lock").mkdir(mode=0o700)
    with file_locker(f"file://{tmp_path}") as locker:
        assert "is not a regular file" in refused(locker, "fifo")
        assert "dir.lock" in refused(locker, "dir")


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_directories_made_are_0700_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    deep = tmp_path / "a" / "b" / "c"
    old = os.umask(umask)
    try:
        with file_locker(f"file://{deep}") as locker:
            assert locker.try_acquire("job") is not None
    finally:
        os.umask(old)
    for made in (tmp_path / "a", tmp_path / "a" / "b", deep):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made
    assert stat.S_IMODE((deep / "job.lock").stat().st_mode) & 0o077 == 0


# --- locks(): bounded reads, nothing followed, nothing that hangs ----------------------------


def _held_file(path: Path, content: bytes) -> int:
    """A lock file with ``content``, flock-held through the returned descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, content)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_locks_skips_what_is_not_a_lock_file_of_ours(tmp_path: Path) -> None:
    with file_locker(f"file://{tmp_path}") as locker:
        lease = locker.try_acquire("real")
        assert lease is not None
        os.mkfifo(tmp_path / "a.lock", 0o600)  # opening it for reading would wait forever
        (tmp_path / "zero.lock").symlink_to("/dev/zero")  # reading it would never end
        malformed = [
            _held_file(tmp_path / "bad1.lock", b"not a number\n1 host tok 2024-01-01\n"),
            _held_file(tmp_path / "bad2.lock", b"3\n1 host tok not-a-date\n"),
            _held_file(tmp_path / "bad3.lock", b"\xff\xfe\x00garbage"),
            _held_file(tmp_path / "huge.lock", b"7\n1 host tok\n" + b"x" * (8 << 20)),
        ]
        try:
            tracemalloc.start()
            started = time.monotonic()
            found = locker.locks()
            elapsed = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            output = CliRunner().invoke(_app.cli, ["locks", f"file://{tmp_path}"])
        finally:
            for fd in malformed:
                os.close(fd)
    assert sorted(str(info.name) for info in found) == ["huge", "real"]
    assert elapsed < 2.0
    assert peak < 256 * 1024  # a few KiB a file, not the 8 MiB one
    assert output.exit_code == 0, output.output
    assert "real" in output.output
    assert "Traceback" not in output.output


def test_locks_of_a_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with (
        file_locker(f"file://{tmp_path / 'link'}") as locker,
        pytest.raises(BackendUnavailable, match="symbolic link"),
    ):
        locker.locks()


def test_open_directory_refuses_with_the_errno_kept_out_of_the_message(tmp_path: Path) -> None:
    # ENOTDIR through a file in the path: one line naming the directory and the reason.
    blocker = tmp_path / "file"
    blocker.write_text("")
    with file_locker(f"file://{blocker}") as locker:
        message = refused(locker)
    assert (
        message == f"lock directory {str(blocker)!r} cannot be opened: {os.strerror(errno.ENOTDIR)}"
    )
