"""The PostgreSQL advisory key of a lock name, shared with Go replicas."""

from __future__ import annotations

__all__ = ["advisory_key"]

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def advisory_key(name: str) -> int:
    """Return the signed 64-bit advisory lock key of ``name``.

    It is FNV-1a 64 over the UTF-8 bytes of ``name``, read as a two's-complement
    int64: the same number as Go's ``int64(fnv.New64a().Sum64())`` (the
    ``JobLockKey`` pattern), so a Go replica and a multilock replica that call
    ``pg_try_advisory_lock`` on the same job name exclude each other.

    >>> advisory_key("nightly-reindex")
    2151323058446577676
    """
    h = _FNV64_OFFSET
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * _FNV64_PRIME) & _MASK64
    return h - (1 << 64) if h >= (1 << 63) else h
