"""Backends by URL scheme: entry points, helpful errors, register_backend."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint, EntryPoints, entry_points, metadata
from typing import Any

import pytest

import multilock
from multilock._locks import registry as _registry
from multilock._locks.file import FileLocker
from multilock._locks.memory import AsyncMemoryLocker, MemoryBackend, MemoryLocker
from multilock.backend import ENTRY_POINT_GROUP, LockURL
from multilock.errors import ConfigurationError, MissingBackend, UnknownScheme

SERVER_SCHEMES = sorted(_registry._EXTRAS)


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty caches and registrations, so a test sees (and leaves) only its own."""
    monkeypatch.setattr(_registry, "_registered", {})
    monkeypatch.setattr(_registry, "_loaded", {})


def _entry_points_without(hidden: set[str], extra: list[EntryPoint]) -> Any:
    """importlib.metadata.entry_points, minus ``hidden`` names, plus ``extra`` ones."""

    def without(**params: Any) -> EntryPoints:
        group: str = params["group"]
        found = [ep for ep in entry_points(group=group) if ep.name not in hidden]
        if group == ENTRY_POINT_GROUP:
            found += extra
        if "name" in params:
            found = [ep for ep in found if ep.name == params["name"]]
        return EntryPoints(found)

    return without


def test_core_schemes_come_from_entry_points() -> None:
    names = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert names["memory"] == "multilock._locks.memory:backend"
    assert names["file"] == "multilock._locks.file:backend"
    assert {"file", "memory"} <= set(multilock.installed_schemes())


def test_connect_by_scheme(tmp_path: Any) -> None:
    with multilock.connect("memory://registry-test") as locker:
        assert isinstance(locker, MemoryLocker)
    with multilock.connect(f"file://{tmp_path}") as locker:
        assert isinstance(locker, FileLocker)
    assert isinstance(multilock.connect_async("MEMORY://x"), AsyncMemoryLocker)


@pytest.mark.usefixtures("fresh_registry")
def test_unknown_scheme_lists_installed_schemes() -> None:
    with pytest.raises(UnknownScheme) as info:
        multilock.connect("nosuch://host/x")
    message = str(info.value)
    assert "no multilock backend for nosuch://" in message
    for scheme in multilock.installed_schemes():
        assert f"{scheme}://" in message
    assert not isinstance(info.value, MissingBackend)


@pytest.mark.usefixtures("fresh_registry")
@pytest.mark.parametrize("scheme", SERVER_SCHEMES)
def test_server_scheme_without_its_distribution_names_the_extra(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hide the entry point, as if the backend's distribution were not installed.
    monkeypatch.setattr(_registry, "entry_points", _entry_points_without({scheme}, []))
    assert scheme not in multilock.installed_schemes()
    extra = _registry._EXTRAS[scheme]
    with pytest.raises(MissingBackend) as info:
        multilock.connect(f"{scheme}://user:hunter2@host/x")
    assert f"pip install 'multilock[{extra}]'" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_every_extra_named_in_errors_exists() -> None:
    provided = set(metadata("multilock").get_all("Provides-Extra") or [])
    assert set(_registry._EXTRAS.values()) <= provided


@pytest.mark.usefixtures("fresh_registry")
def test_installed_but_broken_backend_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint("broken", "multilock_no_such_module:backend", ENTRY_POINT_GROUP)
    monkeypatch.setattr(_registry, "entry_points", _entry_points_without(set(), [broken]))
    with pytest.raises(MissingBackend, match="installed but cannot be imported"):
        multilock.connect("broken://x")


class _Recorder(MemoryBackend):
    """A third-party style backend: the memory backend, counting its connects."""

    def __init__(self) -> None:
        self.urls: list[LockURL] = []

    def connect(self, url: LockURL) -> MemoryLocker:
        self.urls.append(url)
        return MemoryLocker(url)


@pytest.mark.usefixtures("fresh_registry")
def test_register_backend_adds_a_scheme() -> None:
    backend = _Recorder()
    multilock.register_backend("Custom+Mem", backend)
    assert "custom+mem" in multilock.installed_schemes()
    with multilock.connect("custom+mem://ns?ttl=5s") as locker:
        assert locker.try_acquire("x") is not None
    assert [u.scheme for u in backend.urls] == ["custom+mem"]


@pytest.mark.usefixtures("fresh_registry")
def test_register_backend_overrides_an_entry_point() -> None:
    backend = _Recorder()
    multilock.register_backend("memory", backend)
    multilock.connect("memory://override").close()
    assert len(backend.urls) == 1


@pytest.mark.usefixtures("fresh_registry")
@pytest.mark.parametrize("scheme", ["", "has space", "semi;colon", "a/b"])
def test_register_backend_rejects_bad_schemes(scheme: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid URL scheme"):
        multilock.register_backend(scheme, MemoryBackend())


@pytest.mark.usefixtures("fresh_registry")
def test_register_backend_rejects_objects_without_connect() -> None:
    with pytest.raises(ConfigurationError, match=r"has no connect_async\(\) method"):
        multilock.register_backend("half", type("Half", (), {"connect": lambda self, u: 1})())


class _Buggy:
    conformance = None

    def connect(self, url: LockURL) -> Any:
        raise RuntimeError(f"cannot log in with {url.password}")

    connect_async = connect


@pytest.mark.usefixtures("fresh_registry")
def test_a_backend_bug_is_wrapped_without_the_password() -> None:
    multilock.register_backend("buggy", _Buggy())
    with pytest.raises(ConfigurationError) as info:
        multilock.connect("buggy://u:hunter2@h/x")
    message = str(info.value)
    assert "backend for buggy:// failed to open" in message
    assert "RuntimeError" in message
    assert "hunter2" not in message


def test_the_core_backends_load_without_reading_entry_points_or_croniter() -> None:
    # A fresh interpreter: what `import multilock` and a memory:// or file:// scheduler
    # load. Both modules cost a quarter of the import; a cron job still gets croniter.
    script = """
import sys, tempfile
import multilock
multilock.connect("memory://")
with tempfile.TemporaryDirectory() as folder:
    multilock.connect(f"file://{folder}").close()
scheduler = multilock.Scheduler("memory://", metrics=False)
scheduler.add_job(lambda: None, multilock.every(seconds=1), name="j")
print(sorted(m for m in ("importlib.metadata", "croniter") if m in sys.modules))
scheduler.add_job(lambda: None, multilock.cron("*/5 * * * *"), name="c")
print("croniter" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True"]
