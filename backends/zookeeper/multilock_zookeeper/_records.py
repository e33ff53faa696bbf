"""The holder record a lock node carries, written on create and read back by ``locks()``."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from multilock.abc import LockInfo

__all__ = ["hidden_lock_info", "lock_info", "node_value"]

_HOST = socket.gethostname()
_VALUE_PREFIX: list[str] = []


def node_value(token: str) -> bytes:
    """The holder record a lock node carries: token, host, pid, and creation time (ms)."""
    pid = os.getpid()
    if not _VALUE_PREFIX or _VALUE_PREFIX[0] != str(pid):  # computed once per process
        _VALUE_PREFIX[:] = [str(pid), f'{{"host":{json.dumps(_HOST)},"pid":{pid},"since_ms":']
    # token (new_token) is hex and dashes only: no JSON escaping needed.
    return f'{_VALUE_PREFIX[1]}{time.time_ns() // 1_000_000},"token":"{token}"}}'.encode()


def lock_info(path: str, child: str, value: bytes, stat: Any) -> LockInfo:
    """What ``locks()`` reports of the node ``child`` at ``path``, from its data and stat."""
    try:
        data = json.loads(value)
        if not isinstance(data, dict):
            raise ValueError
    except ValueError:
        data = {}
    holder = f"pid {data['pid']} on {data['host']}" if "pid" in data and "host" in data else None
    return LockInfo(
        key=path,
        name=_name(child),
        holder=holder,
        since=datetime.fromtimestamp(stat.ctime / 1000, UTC),
        details={
            "token": data.get("token"),
            "fencing_token": stat.czxid,
            "session": f"0x{stat.ephemeralOwner:x}",
        },
    )


def hidden_lock_info(path: str, child: str) -> LockInfo:
    """What ``locks()`` reports of a node another identity keeps unreadable (its ACL): it
    is there, so the name is held, but by whom and since when cannot be known."""
    return LockInfo(key=path, name=_name(child), details={"readable": False})


def _name(child: str) -> str:
    return unquote(child) if child != "%" else ""
