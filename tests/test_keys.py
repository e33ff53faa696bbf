"""advisory_key: pinned values shared with the Go ``JobLockKey``, and a property check."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multilock import advisory_key

# Values of Go's int64(fnv.New64a().Sum64()) over the name: a Go replica uses these.
PINNED = {
    "nightly-reindex": 2151323058446577676,
    "a": -5808556873153909620,
    "b": -5808553574619024987,
    "": -3750763034362895579,
    "foobar": -8821353812377114648,
}


def reference_key(name: str, encoding: str = "utf-8") -> int:
    """FNV-1a 64 written from the spec, reinterpreted as int64 through struct (not arithmetic)."""
    offset_basis = 14695981039346656037
    prime = 1099511628211
    h = offset_basis
    for byte in name.encode(encoding):
        h ^= byte
        h = (h * prime) % 2**64
    (signed,) = struct.unpack("<q", struct.pack("<Q", h))
    return int(signed)


@pytest.mark.parametrize(("name", "key"), PINNED.items())
def test_pinned_values(name: str, key: int) -> None:
    assert advisory_key(name) == key


@pytest.mark.parametrize(("name", "key"), PINNED.items())
def test_reference_agrees_with_pinned_values(name: str, key: int) -> None:
    # Guards the property test below: a wrong reference would make it meaningless.
    assert reference_key(name) == key


@given(st.text())
def test_matches_reference_for_any_text(name: str) -> None:
    key = advisory_key(name)
    assert key == reference_key(name)
    assert -(2**63) <= key < 2**63  # fits PostgreSQL's bigint


def test_utf8_bytes_not_code_points() -> None:
    # "é" is two UTF-8 bytes; hashing the one Latin-1 byte would not match Go's key.
    assert advisory_key("é") == reference_key("é")
    assert advisory_key("é") != reference_key("é", encoding="latin-1")
