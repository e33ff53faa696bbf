"""Lock names become user-level lock keys without collisions and without truncation."""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

import multilock
from multilock.errors import InvalidOption
from multilock_mysql import MySQLLocker, lock_key
from multilock_mysql._keys import KEY_LIMIT, MAX_PREFIX, KeyNames

from .conftest import connect, query


def _hashed(name: str, prefix: str = "") -> str:
    digest = hashlib.sha256(name.encode()).digest()
    return prefix + "#" + base64.b32encode(digest).decode().rstrip("=").lower()


def test_known_keys() -> None:
    assert lock_key("nightly-reindex") == "nightly-reindex"
    assert lock_key("reports/daily:eu_west.1") == "reports/daily:eu_west.1"
    assert lock_key("Nightly-Reindex") == "#kiupdzqu7wzom3pyuzavwnyp3ltmxnm3t5i3gsajeu3w5jic3era"
    assert lock_key("") == _hashed("")
    assert lock_key("app-", "") == "app-"
    assert lock_key("job", prefix="app:") == "app:job"
    assert lock_key("Job", prefix="app:") == _hashed("Job", "app:")


@pytest.mark.parametrize(
    "name",
    ["Job", "a b", "tr ", "é", "nul\x00byte", "line\nbreak", "100%", "{x}", "it's", "a#b", "🔒"],
)
def test_names_outside_the_readable_set_are_hashed(name: str) -> None:
    assert lock_key(name) == _hashed(name)


def test_length_limit_is_never_a_truncation() -> None:
    fits = "k" * KEY_LIMIT
    assert lock_key(fits) == fits
    assert lock_key(fits + "k") == _hashed(fits + "k")
    assert lock_key(fits[:-4], prefix="app:") == "app:" + fits[:-4]
    assert lock_key(fits[:-3], prefix="app:") == _hashed(fits[:-3], "app:")
    longest = lock_key("X" * 10_000, prefix="p" * MAX_PREFIX)
    assert len(longest) == KEY_LIMIT


def test_every_key_is_short_and_safe_to_quote() -> None:
    for name in ["", "a", "Z" * 500, "'); DROP TABLE x; --", "\\", "\x00", "é" * 64]:
        for prefix in ("", "p" * MAX_PREFIX):
            key = lock_key(name, prefix)
            assert len(key) <= KEY_LIMIT
            assert set(key) <= set("abcdefghijklmnopqrstuvwxyz0123456789_-.:/#"), key


def test_key_names_remember_hashed_keys() -> None:
    names = KeyNames("app:", size=2)
    assert names.name(names.key("plain")) == "plain"  # readable: no memory needed
    assert names.name(names.key("Hashed")) == "Hashed"
    names.key("B")
    names.key("C")  # the oldest entries make room
    assert names.name(lock_key("Hashed", "app:")) is None
    assert names.name("other:plain") is None  # not of this prefix
    assert names.name("app:#not-seen") is None


# Pairs a server could confuse: MySQL folds case and stops at NUL, MariaDB stops at NUL;
# both would truncate at 64 characters if a key were not kept within it.
CONFUSABLE = [
    ("job", "Job"),
    ("job", "JOB"),
    ("nul", "nul\x00byte"),
    ("tr", "tr "),
    ("e", "é"),
    ("ss", "ß"),
    ("k" * 64 + "a", "k" * 64 + "b"),
    ("k" * 64, "k" * 64 + "a"),
    ("", " "),
]


@pytest.mark.parametrize(("first", "second"), CONFUSABLE)
def test_confusable_names_are_two_locks_on_the_server(
    make_url: Callable[..., str], first: str, second: str
) -> None:
    unique = uuid.uuid4().hex[:8]
    with (
        multilock.connect(make_url(prefix=unique)) as one,
        multilock.connect(make_url(prefix=unique)) as two,
    ):
        a = one.try_acquire(first)
        b = two.try_acquire(second)
        assert a is not None
        assert b is not None, f"{second!r} was refused while only {first!r} is held"
        assert a.key != b.key
        a.release()
        b.release()


def test_the_server_holds_exactly_the_key(
    make_url: Callable[..., str], admin: pymysql.Connection[Any]
) -> None:
    name = f"Keys-{uuid.uuid4().hex}" * 2  # upper case and longer than 64: hashed
    with multilock.connect(make_url()) as locker:
        assert isinstance(locker, MySQLLocker)
        lease = locker.try_acquire(name)
        assert lease is not None
        assert lease.key == lock_key(name) == locker.key(name)
        assert query(admin, "SELECT IS_USED_LOCK(%s)", lease.key) == [(locker.connection_id,)]
        # Another client, in any language, takes the same lock by the same key.
        assert query(admin, "SELECT GET_LOCK(%s, 0)", lease.key) == [(0,)]
        lease.release()
        assert query(admin, "SELECT GET_LOCK(%s, 0)", lease.key) == [(1,)]
        assert locker.try_acquire(name) is None
        assert query(admin, "SELECT RELEASE_LOCK(%s)", lease.key) == [(1,)]


def test_a_raw_get_lock_on_a_readable_name_excludes_multilock(mysql_url: str) -> None:
    name = f"interop-{uuid.uuid4().hex}"
    raw = connect(mysql_url)
    try:
        assert query(raw, "SELECT GET_LOCK(%s, 0)", name) == [(1,)]
        with multilock.connect(mysql_url) as locker:
            assert locker.try_acquire(name) is None
            assert query(raw, "SELECT RELEASE_LOCK(%s)", name) == [(1,)]
            lease = locker.try_acquire(name)
            assert lease is not None
            assert query(raw, "SELECT GET_LOCK(%s, 0)", name) == [(0,)]
            lease.release()
    finally:
        raw.close()


@pytest.mark.parametrize("prefix", ["App", "a b", "p" * (MAX_PREFIX + 1), "x#"])
def test_bad_prefixes_are_refused(mysql_url: str, prefix: str) -> None:
    with pytest.raises(InvalidOption, match="prefix"):
        multilock.connect(mysql_url, prefix=prefix)
