"""Private throwaway servers, for faults that must not touch the shared ones.

The backends' own fault tests already know how to run them (PostgreSQL via initdb,
a ``redis-server`` on a free port, ZooKeeper via scripts/zookeeper.sh): this module
loads their helpers from those files rather than copying them, since those test
directories are not importable packages.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

__all__ = ["postgres_server", "redis_server", "zookeeper_server"]

_BACKENDS = Path(__file__).resolve().parents[2] / "backends"


def _load(relative: str) -> ModuleType:
    path = _BACKENDS / relative
    name = "_reliability_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {relative}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def postgres_server() -> Any:
    """A started private PostgreSQL (``url``, ``stop()``, ``start()``, ``remove()``)."""
    helpers = _load("postgres/tests/test_postgres_restart.py")
    bindir = helpers._bindir()
    if bindir is None:
        pytest.skip("the PostgreSQL server binaries (initdb) are not installed")
    server = helpers.PrivateServer(bindir)
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


def zookeeper_server(directory: Path) -> Any:
    """A started private ZooKeeper keeping its data across restarts (``url``,
    ``port``, ``stop()``, ``start()``)."""
    server = _load("zookeeper/tests/test_zookeeper_faults.py").PrivateZooKeeper(
        directory, keep_data=True
    )
    server.start()
    return server
