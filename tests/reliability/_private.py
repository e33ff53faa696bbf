"""Private throwaway servers, for faults that must not touch the shared ones.

The servers themselves -- and the topologies, a PostgreSQL primary with its standby,
a ZooKeeper ensemble -- are the repository's test support
(:mod:`multilock.testing._servers`), which the backends' own fault tests use too;
these start a Redis or a ZooKeeper, or skip (fail when backends are required) where
it cannot be had (a private PostgreSQL: ``_servers.postgres.private_server``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from multilock.testing._servers import unavailable
from multilock.testing._servers.process import script
from multilock.testing._servers.redis import RedisServer
from multilock.testing._servers.zookeeper import PrivateZooKeeper

__all__ = ["redis_server", "zookeeper_server"]


def redis_server(
    config: pytest.Config, directory: Path, password: str | None = None
) -> RedisServer:
    """A started private redis-server (``url``, ``port``, ``stop()``, ``start()``,
    ``freeze()``, ``thaw()``, ``remove()``), with ``requirepass`` if given."""
    if shutil.which("redis-server") is None:
        unavailable(config, "redis-server is not installed")
    server = RedisServer(directory, password)
    server.start()
    return server


def zookeeper_server(config: pytest.Config, directory: Path, **options: Any) -> PrivateZooKeeper:
    """A started private ZooKeeper keeping its data across restarts (``url``,
    ``port``, ``stop()``, ``start()``); ``options`` go to ``PrivateZooKeeper``
    (``address``)."""
    zookeeper_sh = script(config, "zookeeper.sh")
    server = PrivateZooKeeper(zookeeper_sh, directory, keep_data=True, **options)
    server.start()
    return server
