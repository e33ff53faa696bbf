# This file was generated from the async source by scripts/unasync.py:
# backends/redis/multilock_redis/_async/_lua.py.
# Do not edit it; change the source and rerun the script.
"""Running the Lua scripts: ``EVALSHA``, and loading a script the server lacks.

Not redis-py's ``Script`` objects: their call costs about ten microseconds of
Python per script call, which is most of a lock cycle's overhead over raw redis-py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import NoScriptError

from .._config import SyncClient
from .._scripts import Lua

__all__ = ["run"]


def run(client: SyncClient, script: Lua, keys: list[str], args: list[str | int]) -> Any:
    """``EVALSHA`` the script; on ``NOSCRIPT`` (after a restart, a failover or a
    ``SCRIPT FLUSH``), load it and run it again: it did not run the first time."""
    # The bare execute_command, not evalsha(): its typed dispatch costs a microsecond.
    execute: Callable[..., Any] = client.execute_command
    try:
        return execute("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.source)
        return execute("EVALSHA", script.sha, len(keys), *keys, *args)
