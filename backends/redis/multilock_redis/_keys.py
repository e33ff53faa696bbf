"""Redis keys of lock names: a prefix, then the name as a cluster hash tag.

``multilock:{name}`` holds the owner token, ``multilock:{name}:fence`` the
fencing counter and ``multilock:{name}:tick`` the tick claims' mark. Redis
Cluster hashes only what is between the first ``{`` and the next ``}``, so the
keys of a name always live in one slot and one script may touch them all. A
name's own ``{``/``}`` (and ``%``, the escape character) are escaped, and the
empty name gets a tag of its own, so that every name has a non-empty tag of its
own and no two names share a key.
"""

from __future__ import annotations

from redis.crc import key_slot

__all__ = ["calls", "fence_key", "lock_key", "name_of", "scan_pattern", "tick_key"]

_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}
_UNESCAPES = {code: char for char, code in _ESCAPES.items()}
_EMPTY = "%"  # never the escape of a non-empty name: those have two hex digits after a %
_FENCE_SUFFIX = ":fence"
_TICK_SUFFIX = ":tick"
_GLOB_SPECIAL = "\\*?[]"


def _tag(name: str) -> str:
    if not name:
        return _EMPTY
    if "%" not in name and "{" not in name and "}" not in name:
        return name
    return "".join(_ESCAPES.get(char, char) for char in name)


def lock_key(name: str, prefix: str = "multilock:") -> str:
    """The Redis key holding the owner token of lock ``name``."""
    return f"{prefix}{{{_tag(name)}}}"


def fence_key(name: str, prefix: str = "multilock:") -> str:
    """The Redis key holding the fencing counter of lock ``name`` (same cluster slot)."""
    return f"{prefix}{{{_tag(name)}}}{_FENCE_SUFFIX}"


def tick_key(name: str, prefix: str = "multilock:") -> str:
    """The Redis key holding the latest claimed fire time of ``name`` (same cluster slot)."""
    return f"{prefix}{{{_tag(name)}}}{_TICK_SUFFIX}"


def name_of(key: str, prefix: str) -> str | None:
    """The lock name of a lock key under ``prefix``, or ``None`` if it is not one."""
    if not (key.startswith(prefix + "{") and key.endswith("}")):
        return None
    tag = key[len(prefix) + 1 : -1]
    if tag == _EMPTY:
        return ""
    parts = tag.split("%")
    out = [parts[0]]
    for part in parts[1:]:
        char = _UNESCAPES.get("%" + part[:2].upper())
        if char is None:
            return None  # not a key this module made
        out.append(char + part[2:])
    return "".join(out)


def scan_pattern(prefix: str) -> str:
    """A ``SCAN MATCH`` pattern for the lock keys (not the fence keys) under ``prefix``."""
    escaped = "".join("\\" + char if char in _GLOB_SPECIAL else char for char in prefix)
    return escaped + "{*}"


def calls(keys: list[str], size: int, per_slot: bool) -> list[list[int]]:
    """The positions in ``keys`` (one lock key per name) grouped into script calls of
    at most ``size``; with ``per_slot`` (a Redis Cluster, which runs a script only on
    keys of one slot), only names of one hash slot share a call."""
    if not per_slot:
        return [
            list(range(start, min(start + size, len(keys)))) for start in range(0, len(keys), size)
        ]
    slots: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        slots.setdefault(key_slot(key.encode()), []).append(i)
    return [
        group[start : start + size]
        for group in slots.values()
        for start in range(0, len(group), size)
    ]
