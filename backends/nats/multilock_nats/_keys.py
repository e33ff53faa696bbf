"""NATS KV keys of lock names: reversible, and valid for every KV client.

A KV key is ``[-/_=.A-Za-z0-9]+`` without a leading or trailing ``.`` (a subject token
separator). A name keeps its letters, digits, ``-``, ``_`` and ``/``; every other byte of
its UTF-8 form (``.`` and ``=`` included) becomes ``=XX``, upper-case hex. The empty
name is ``=`` alone, which no other name's key is (a ``=`` is always followed by two
hex digits). The bucket's subjects are ``$KV.<bucket>.<prefix><escaped name>``.
"""

from __future__ import annotations

import re

__all__ = ["escape", "unescape"]

_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_/")
_HEX = re.compile(r"[0-9A-F]{2}")


def escape(name: str) -> str:
    """The key fragment of lock ``name``."""
    if not name:
        return "="
    data = name.encode("utf-8")
    if all(byte in _KEPT for byte in data):
        return name
    return "".join(chr(byte) if byte in _KEPT else f"={byte:02X}" for byte in data)


def unescape(fragment: str) -> str | None:
    """The lock name of a key fragment made by :func:`escape`, or ``None`` if it is not one."""
    if fragment == "=":
        return ""
    data = bytearray()
    i = 0
    while i < len(fragment):
        char = fragment[i]
        if char == "=" and _HEX.fullmatch(fragment[i + 1 : i + 3]):
            data.append(int(fragment[i + 1 : i + 3], 16))
            i += 3
        elif ord(char) in _KEPT:
            data.append(ord(char))
            i += 1
        else:
            return None
    try:
        return data.decode("utf-8") if data else None
    except UnicodeDecodeError:
        return None
