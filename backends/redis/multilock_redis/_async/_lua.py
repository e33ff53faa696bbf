"""Running the Lua scripts: ``EVALSHA``, and loading a script the server lacks.

Not redis-py's ``Script`` objects: their call costs about ten microseconds of
Python per script call, which is most of a lock cycle's overhead over raw redis-py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import NoScriptError

from .._config import AsyncClient
from .._scripts import Lua

__all__ = ["run"]


async def run(client: AsyncClient, script: Lua, keys: list[str], args: list[str | int]) -> Any:
    """``EVALSHA`` the script; on ``NOSCRIPT`` (after a restart, a failover or a
    ``SCRIPT FLUSH``), load it and run it again: it did not run the first time."""
    # The bare execute_command, not evalsha(): its typed dispatch costs a microsecond.
    execute: Callable[..., Any] = client.execute_command
    try:
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await client.script_load(script.source)
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)
