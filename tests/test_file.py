"""file://: per-name flock files on one host."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import multilock
from multilock._locks.file import FileLocker, default_directory
from multilock.errors import BackendUnavailable, InvalidOption, InvalidURL

HOLDER = """
import sys, multilock
locker = multilock.connect(sys.argv[1])
lease = locker.try_acquire(sys.argv[2])
print("held" if lease else "busy", flush=True)
sys.stdin.read()  # hold until killed
"""


def connect(directory: Path) -> FileLocker:
    locker = multilock.connect(f"file://{directory}")
    assert isinstance(locker, FileLocker)
    return locker


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_two_lockers_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    with connect(tmp_path) as one, connect(tmp_path) as two:
        lease = one.try_acquire("job")
        assert lease is not None
        assert two.try_acquire("job") is None
        assert one.try_acquire("job") is None  # not re-entrant either
        lease.release()
        assert two.try_acquire("job") is not None


def test_fencing_tokens_increase_across_lockers(tmp_path: Path) -> None:
    tokens = []
    for _ in range(3):
        with connect(tmp_path) as locker:
            lease = locker.try_acquire("job")
            assert lease is not None
            tokens.append(lease.fencing_token)
            lease.release()
    assert tokens == [1, 2, 3]


def test_lock_files_are_never_unlinked(tmp_path: Path) -> None:
    with connect(tmp_path) as locker:
        lease = locker.try_acquire("job")
        assert lease is not None
        lease.release()
    assert (tmp_path / "job.lock").read_text() == "1\n"


def test_close_releases_everything(tmp_path: Path) -> None:
    locker = connect(tmp_path)
    leases = [locker.try_acquire(n) for n in ("a", "b")]
    locker.close()
    with connect(tmp_path) as other:
        assert all(other.try_acquire(n) is not None for n in ("a", "b"))
    assert all(lease is not None and lease.release() is False for lease in leases)


def test_async_api(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with multilock.connect_async(f"file://{tmp_path}") as locker:
            lease = await locker.try_acquire("job")
            assert lease is not None
            async with lease:
                assert await locker.try_acquire("job") is None
            assert await locker.try_acquire("job") is not None

    asyncio.run(scenario())


# --- names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["a/b", "../x", "..", ".", ".hidden", "", "with space", "ünï😀", "50%", "a\nb", "a~b", "%"],
)
def test_awkward_names_stay_inside_the_directory(tmp_path: Path, name: str) -> None:
    directory = tmp_path / "locks"
    with connect(directory) as locker:
        lease = locker.try_acquire(name)
        assert lease is not None
        [info] = locker.locks()
        assert info.name == name
        lease.release()
    assert [p.parent for p in directory.iterdir()] == [directory]
    assert list(tmp_path.iterdir()) == [directory]


def test_long_names_are_shortened_and_kept_apart(tmp_path: Path) -> None:
    first, second = "x" * 1024 + "1", "x" * 1024 + "2"
    with connect(tmp_path) as locker:
        one, two = locker.try_acquire(first), locker.try_acquire(second)
        assert one is not None
        assert two is not None
        assert locker.try_acquire(first) is None
        assert [info.name for info in locker.locks()] == [None, None]  # hashed: not reversible
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 2
    assert all(len(n.encode()) <= 255 for n in names)


def test_long_unicode_name(tmp_path: Path) -> None:
    with connect(tmp_path) as locker:
        assert locker.try_acquire("ж" * 1000) is not None


# --- where the locks live ----------------------------------------------------------


def test_default_directory_is_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_directory() == tmp_path / "multilock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_directory().name == f"multilock-{os.getuid()}"


def test_file_url_without_a_path_uses_the_default_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with multilock.connect("file://") as locker:
        assert isinstance(locker, FileLocker)
        assert locker.directory == tmp_path / "multilock"
        assert locker.try_acquire("job") is not None
    made = tmp_path / "multilock"
    assert (made / "job.lock").exists()
    assert made.stat().st_mode & 0o777 == 0o700  # private: other users cannot block us


def test_a_file_in_the_way_is_backend_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with connect(blocker / "locks") as locker, pytest.raises(BackendUnavailable) as info:
        locker.try_acquire("job")
    assert "cannot be opened" in str(info.value)
    assert str(blocker) in str(info.value)
    assert "Not a directory" in str(info.value)


def test_proc_directory_is_backend_unavailable() -> None:
    with (
        multilock.connect("file:///proc/multilock-unreachable") as locker,
        pytest.raises(BackendUnavailable, match="cannot make lock directory"),
    ):
        locker.try_acquire("job")


def test_remote_host_is_rejected() -> None:
    with pytest.raises(InvalidURL, match="not host 'elsewhere'"):
        multilock.connect("file://elsewhere/var/lock")


def test_unknown_option_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidOption, match="unknown option 'tl'"):
        multilock.connect(f"file://{tmp_path}?tl=5")


# --- other processes ------------------------------------------------------------------


@contextmanager
def holder_process(directory: Path, name: str) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``name`` until killed; killed and reaped on exit."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"file://{directory}", name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()


def test_sigkilled_holder_frees_the_lock_at_once(tmp_path: Path) -> None:
    with holder_process(tmp_path, "job") as holder, connect(tmp_path) as locker:
        assert locker.try_acquire("job") is None
        [info] = locker.locks()
        assert info.holder is not None
        assert info.holder.startswith(f"pid {holder.pid} ")
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        killed = time.monotonic()
        deadline = killed + 2.0
        tries = 1
        lease = locker.try_acquire("job")
        while lease is None and time.monotonic() < deadline:
            time.sleep(0.001)
            tries += 1
            lease = locker.try_acquire("job")
        freed_after = time.monotonic() - killed
        assert lease is not None, "the lock of a SIGKILLed holder was not freed within 2s"
        # The kernel drops the flock as the process exits, before wait() returns: so the
        # very first try wins. Counted in tries, not seconds, to hold on a loaded machine.
        assert tries == 1, f"freed only after {tries} tries ({freed_after:.3f}s)"
        assert lease.fencing_token == 2


def test_locks_introspection(tmp_path: Path) -> None:
    with holder_process(tmp_path, "theirs") as holder, connect(tmp_path) as locker:
        lease = locker.try_acquire("mine")
        assert lease is not None
        infos = {info.name: info for info in locker.locks()}
        assert set(infos) == {"mine", "theirs"}
        mine, theirs = infos["mine"], infos["theirs"]
        assert mine.holder is not None
        assert mine.holder.startswith(f"pid {os.getpid()} ")
        assert theirs.holder is not None
        assert theirs.holder.startswith(f"pid {holder.pid} ")
        assert mine.details["token"] == lease.token
        assert mine.details["fencing_token"] == lease.fencing_token == 1
        assert mine.since is not None
        assert mine.key == str(tmp_path / "mine.lock")
        lease.release()
        holder.kill()
        holder.wait(10)
        assert locker.locks() == []  # released, and crashed: neither is listed


def test_locks_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    with connect(tmp_path / "never-made") as locker:
        assert locker.locks() == []


def test_no_descriptor_leak_over_many_cycles(tmp_path: Path) -> None:
    with connect(tmp_path) as locker, connect(tmp_path) as rival:
        for _ in range(20):  # warm up: directory creation, lazy imports
            lease = locker.try_acquire("job")
            assert lease is not None
            lease.release()
        before = _open_fds()
        for i in range(500):
            lease = locker.try_acquire(f"job{i % 7}")
            assert lease is not None
            assert rival.try_acquire(f"job{i % 7}") is None  # contended tries close their fd
            lease.release()
        many = locker.try_acquire_many([f"m{i}" for i in range(50)])
        for held in many.values():
            assert held is not None
            held.release()
        assert _open_fds() == before
