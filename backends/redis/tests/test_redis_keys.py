"""Key derivation: escaping, one cluster slot per name, and the way back."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from multilock_redis import fence_key, lock_key
from multilock_redis._keys import name_of, scan_pattern

AWKWARD = ["", "a", "{", "}", "}{", "{a}", "a}b", "%", "%7B", "ü/ -x", "x" * 1024, "a:fence"]


def test_plain_names_stay_readable() -> None:
    assert lock_key("nightly-reindex") == "multilock:{nightly-reindex}"
    assert fence_key("nightly-reindex") == "multilock:{nightly-reindex}:fence"
    assert lock_key("job", prefix="app:") == "app:{job}"


@pytest.mark.parametrize("name", AWKWARD)
def test_lock_and_fence_share_a_cluster_slot(name: str) -> None:
    key, fence = lock_key(name).encode(), fence_key(name).encode()
    tag = key[key.index(b"{") + 1 : key.index(b"}")]
    assert tag, "an empty hash tag would hash the whole key: the two keys would split"
    assert key_slot(key) == key_slot(fence)


@pytest.mark.parametrize("name", AWKWARD)
def test_name_comes_back_from_its_key(name: str) -> None:
    assert name_of(lock_key(name, "p:"), "p:") == name


def test_names_never_share_keys() -> None:
    keys = {lock_key(name) for name in AWKWARD} | {fence_key(name) for name in AWKWARD}
    assert len(keys) == 2 * len(AWKWARD)


def test_foreign_keys_are_not_names() -> None:
    assert name_of("other:{x}", "multilock:") is None
    assert name_of("multilock:{x}:fence", "multilock:") is None
    assert name_of("multilock:{%zz}", "multilock:") is None


def test_scan_pattern_escapes_glob_characters_of_the_prefix() -> None:
    assert scan_pattern("multilock:") == "multilock:{*}"
    assert scan_pattern("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\{*}"
