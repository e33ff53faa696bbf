"""Private throwaway servers, for faults that must not touch the shared ones.

The backends' own fault tests already know how to run them (PostgreSQL via initdb,
a ``redis-server`` on a free port, ZooKeeper via scripts/zookeeper.sh), and their
topology tests how to run a cluster (a PostgreSQL primary with its standby, a
ZooKeeper ensemble): this module loads their helpers from the backends' conftest.py
files rather than copying them, since those test directories are not importable
packages (and their test modules import the helpers relatively, which a file loaded
on its own cannot).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

__all__ = [
    "postgres_helpers",
    "postgres_server",
    "redis_server",
    "zookeeper_helpers",
    "zookeeper_server",
]

_BACKENDS = Path(__file__).resolve().parents[2] / "backends"


_LOADED: dict[str, ModuleType] = {}


def _load(relative: str) -> ModuleType:
    if relative in _LOADED:
        return _LOADED[relative]
    path = _BACKENDS / relative
    name = "_reliability_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {relative}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _LOADED[relative] = module
    return module


def postgres_helpers() -> ModuleType:
    """The PostgreSQL backend's test helpers (``PrivateServer``, ``ReplicatedPair``...)."""
    return _load("postgres/tests/conftest.py")


def zookeeper_helpers() -> ModuleType:
    """The ZooKeeper backend's test helpers (``PrivateZooKeeper``, ``ZooKeeperEnsemble``)."""
    return _load("zookeeper/tests/conftest.py")


def postgres_bindir() -> Path:
    """Where the PostgreSQL server's programs are; a skip where they are not."""
    bindir: Path | None = postgres_helpers()._bindir()
    if bindir is None:
        pytest.skip("the PostgreSQL server binaries (initdb) are not installed")
    return bindir


def postgres_server(**options: Any) -> Any:
    """A started private PostgreSQL (``url``, ``stop()``, ``start()``, ``remove()``...);
    ``options`` go to ``PrivateServer`` (``addresses``)."""
    server = postgres_helpers().PrivateServer(postgres_bindir(), **options)
    server.start()
    return server


def redis_server(directory: Path, password: str | None = None) -> Any:
    """A started private redis-server (``url``, ``port``, ``stop()``, ``start()``,
    ``pause()``, ``resume()``, ``remove()``), with ``requirepass`` if given."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = _load("redis/tests/conftest.py").RedisServer(directory, password)
    server.start()
    return server


def zookeeper_server(directory: Path, **options: Any) -> Any:
    """A started private ZooKeeper keeping its data across restarts (``url``,
    ``port``, ``stop()``, ``start()``); ``options`` go to ``PrivateZooKeeper``
    (``address``)."""
    server = zookeeper_helpers().PrivateZooKeeper(directory, keep_data=True, **options)
    server.start()
    return server
