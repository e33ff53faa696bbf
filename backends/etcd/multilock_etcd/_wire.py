"""etcd's v3 JSON gateway: the request bodies multilock sends and how it reads the answers.

Keys and values travel base64-encoded; 64-bit integers (revisions, lease ids) are JSON
strings; a field whose value is zero, false or empty is left out of an answer.

A lock is one key, ``prefix + name``, holding its owner token and attached to an etcd
lease of the locker. Acquire is a transaction "if the key's create revision is 0 (it
does not exist), put it"; the revision of that transaction is the key's create revision,
the fencing token. Release and every check compare the create revision, which no other
holder's key can have: compare-and-delete, never a blind delete.
"""

from __future__ import annotations

import base64
import json
from typing import Any

__all__ = [
    "BATCH",
    "acquire_many_request",
    "acquire_request",
    "b64",
    "check_request",
    "granted",
    "header_revision",
    "prefix_end",
    "release_many_request",
    "release_request",
    "unb64",
]

BATCH = 64
"""Names per transaction of a batch. etcd's ``--max-txn-ops`` (128 by default) bounds a
transaction's operations, its nested transactions' included: the outer one's count is
taken from what a nested one may have, so 127 nested ones of one operation each fit;
64 leaves room for a server configured lower."""

Body = dict[str, Any]


def b64(data: bytes) -> str:
    """``data`` as the gateway takes bytes."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    """Bytes as the gateway gives them."""
    return base64.b64decode(text)


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range of every key starting with ``prefix`` (etcd's rule:
    the prefix with its last byte below 0xff incremented)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # every key


def _created_at(key: str, revision: int) -> Body:
    return {"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def _put(key: str, value: str, lease: int) -> Body:
    return {"request_put": {"key": key, "value": value, "lease": str(lease)}}


# The hot requests are written by hand, not by json.dumps (about 15 us each): keys and
# values are base64 (from b64), which JSON needs no escape for.
_ACQUIRE = (
    '{"compare":[{"key":"%s","target":"CREATE","result":"EQUAL","create_revision":"0"}],'
    '"success":[{"request_put":{"key":"%s","value":"%s","lease":"%d"}}]}'
)
_RELEASE = (
    '{"compare":[{"key":"%s","target":"CREATE","result":"EQUAL","create_revision":"%d"}],'
    '"success":[{"request_delete_range":{"key":"%s"}}]}'
)


def acquire_request(key: str, value: str, lease: int) -> bytes:
    """Put ``key`` = ``value`` on ``lease`` if the key does not exist (both base64)."""
    return (_ACQUIRE % (key, key, value, lease)).encode()


def acquire_many_request(keys: list[str], values: list[str], lease: int) -> bytes:
    """:func:`acquire_request` for each key, in one transaction of nested ones (each key
    is granted or refused on its own); at most :data:`BATCH` keys."""
    nested = ",".join(
        '{"request_txn":' + _ACQUIRE % (key, key, value, lease) + "}"
        for key, value in zip(keys, values, strict=True)
    )
    return ('{"success":[' + nested + "]}").encode()


def release_request(key: str, revision: int) -> bytes:
    """Delete ``key`` (base64) if it is still the one created at ``revision``."""
    return (_RELEASE % (key, revision, key)).encode()


def release_many_request(keys: list[str], revisions: list[int]) -> bytes:
    """:func:`release_request` for each key, in one transaction; at most :data:`BATCH`."""
    nested = ",".join(
        '{"request_txn":' + _RELEASE % (key, revision, key) + "}"
        for key, revision in zip(keys, revisions, strict=True)
    )
    return ('{"success":[' + nested + "]}").encode()


def check_request(key: str, revision: int, value: str | None = None, lease: int = 0) -> bytes:
    """Confirm ``key`` is still the one created at ``revision`` -- and, with ``value``,
    attach it to ``lease`` (its create revision stays). On failure the answer holds the
    key as it is now, if it exists: taken by another holder, or gone."""
    success = [] if value is None else [_put(key, value, lease)]
    txn = {
        "compare": [_created_at(key, revision)],
        "success": success,
        "failure": [{"request_range": {"key": key, "keys_only": True}}],
    }
    return json.dumps(txn).encode()


def header_revision(answer: Body) -> int:
    """The store's revision when etcd answered (the transaction's own, for a write)."""
    return int(answer["header"]["revision"])


def granted(answer: Body) -> list[bool]:
    """Which of the nested transactions of a batch answer succeeded."""
    return [
        bool(response.get("response_txn", {}).get("succeeded", False))
        for response in answer.get("responses", [])
    ]


def exists_in_failure(answer: Body) -> bool:
    """For a failed :func:`check_request`: whether the key exists (another holder's)."""
    for response in answer.get("responses", []):
        if response.get("response_range", {}).get("kvs"):
            return True
    return False
