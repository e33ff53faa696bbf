"""From a lock name to the name of a server-side user-level lock, collision-free.

MySQL refuses user-level lock names longer than 64 characters, lower-cases them
(so ``Job`` and ``job`` are one lock there) and takes them as C strings (a NUL
ends them); MariaDB compares them byte for byte but cuts them at a NUL too. A
key is therefore the name itself only where that is safe on both servers, and a
hash otherwise:

* **readable**: ``prefix + name`` when the name is 1 to ``64 - len(prefix)``
  characters of ``a-z 0-9 _ - . : /`` -- lower-case ASCII, so that no server's
  folding or truncation can make two such names one lock;
* **hashed**: ``prefix + "#" + base32(SHA-256(UTF-8 of name))``, lower case without
  padding (52 characters), for every other name: upper case, spaces, non-ASCII,
  control characters, the empty name, names too long.

The two forms never meet: a readable key has no ``#``. Readable keys are distinct
because the names are; hashed keys are distinct unless SHA-256 collides. Every key
is at most 64 characters of ``a-z 0-9 _ - . : / #``, which also makes it safe to
write into SQL as a literal. The prefix (``?prefix=``, at most 11 characters of the
readable set) keeps apart applications that share a server.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading

__all__ = ["KEY_LIMIT", "MAX_PREFIX", "KeyNames", "is_prefix", "lock_key"]

KEY_LIMIT = 64
"""Characters in a user-level lock name that MySQL accepts (MariaDB takes more)."""

_HASH_MARK = "#"
_HASHED_LENGTH = 1 + 52  # the mark, then 256 bits in base32 without padding
MAX_PREFIX = KEY_LIMIT - _HASHED_LENGTH
"""The longest prefix: 11 characters, so that a hashed key still fits."""

_READABLE = re.compile(r"[a-z0-9_.:/-]+")
_PREFIX = re.compile(r"[a-z0-9_.:/-]*")


def is_prefix(prefix: str) -> bool:
    """Whether ``prefix`` may start every key: the readable set, at most 11 characters."""
    return len(prefix) <= MAX_PREFIX and _PREFIX.fullmatch(prefix) is not None


def lock_key(name: str, prefix: str = "") -> str:
    """The user-level lock name (``GET_LOCK``'s argument) for lock ``name``.

    >>> lock_key("nightly-reindex")
    'nightly-reindex'
    >>> lock_key("Nightly-Reindex")
    '#kiupdzqu7wzom3pyuzavwnyp3ltmxnm3t5i3gsajeu3w5jic3era'
    """
    if len(prefix) + len(name) <= KEY_LIMIT and _READABLE.fullmatch(name):
        return prefix + name
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return prefix + _HASH_MARK + base64.b32encode(digest).decode("ascii").rstrip("=").lower()


class KeyNames:
    """The keys of the names seen, and the names of hashed keys seen, both bounded.

    ``locks()`` can name a readable key by itself; a hashed key only if this
    locker has hashed its name, since SHA-256 is one-way.
    """

    def __init__(self, prefix: str, size: int = 4096, max_bytes: int = 4 << 20) -> None:
        self.prefix = prefix
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self._keys: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._guard = threading.Lock()  # a sync locker is shared by threads

    def key(self, name: str) -> str:
        """The key of ``name``."""
        key = self._keys.get(name)
        if key is None:
            key = lock_key(name, self.prefix)
            with self._guard:
                while self._keys and (
                    len(self._keys) >= self._size or self._bytes + len(name) > self._max_bytes
                ):
                    oldest = next(iter(self._keys))  # insertion order: the oldest first
                    self._names.pop(self._keys.pop(oldest), None)
                    self._bytes -= len(oldest)
                if name not in self._keys:
                    self._keys[name] = key
                    self._names[key] = name
                    self._bytes += len(name)
        return key

    def name(self, key: str) -> str | None:
        """The name of ``key``: read off a readable key, remembered for a hashed one."""
        if not key.startswith(self.prefix):
            return None
        body = key[len(self.prefix) :]
        if body and not body.startswith(_HASH_MARK) and _READABLE.fullmatch(body):
            return body
        return self._names.get(key)
