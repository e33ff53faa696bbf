"""The near-equal names corpus of the conformance suite collides, with certainty, under
every merging map it claims to catch -- and stays distinct where it must."""

from __future__ import annotations

import hashlib
import posixpath
import unicodedata
import zlib
from collections.abc import Callable
from urllib.parse import unquote

import pytest

from multilock import advisory_key
from multilock.testing._checks_names import BULK, HASH_COLLISIONS, families

TAG = "conformance-0123456789ab-sync-near"


def _fnv(bits: int, offset: int, prime: int, *, xor_first: bool) -> Callable[[bytes], int]:
    mask = (1 << bits) - 1

    def fnv(data: bytes) -> int:
        h = offset
        for byte in data:
            h = ((h ^ byte) * prime) & mask if xor_first else ((h * prime) & mask) ^ byte
        return h

    return fnv


def _poly(base: int, init: int = 0) -> Callable[[bytes], int]:
    def poly(data: bytes) -> int:
        h = init
        for byte in data:
            h = (h * base + byte) & 0xFFFFFFFF
        return h

    return poly


HASHES: dict[str, Callable[[bytes], int]] = {
    "crc32": zlib.crc32,
    "adler32": zlib.adler32,
    "fnv1a-32": _fnv(32, 0x811C9DC5, 0x01000193, xor_first=True),
    "fnv1-32": _fnv(32, 0x811C9DC5, 0x01000193, xor_first=False),
    "fnv1a-64-low32": lambda data: (
        _fnv(64, 0xCBF29CE484222325, 0x100000001B3, xor_first=True)(data) & 0xFFFFFFFF
    ),
    "java-hashcode": _poly(31),
    "djb2": _poly(33, 5381),
    "sdbm": _poly(65599),
}
PREFIX_FREE = {"crc32", "adler32", "java-hashcode", "djb2", "sdbm"}


def _corpus() -> list[str]:
    return [name for family in families(TAG).values() for name in family]


def _collides(key: Callable[[str], object], names: list[str]) -> bool:
    return len({key(name) for name in names}) < len(names)


def test_corpus_names_are_distinct() -> None:
    """No two members are equal strings, and none share a PostgreSQL advisory key."""
    names = _corpus()
    assert len(set(names)) == len(names)
    assert len({advisory_key(name) for name in names}) == len(names)


@pytest.mark.parametrize("label", sorted(HASH_COLLISIONS))
def test_hash_pairs_collide_after_any_suffix(label: str) -> None:
    """Each pair collides in 32 (so 16) bits, alone, with a suffix, and -- where the
    hash is linear or polynomial -- with a prefix."""
    hash_ = HASHES[label]
    x, y = (s.encode() for s in HASH_COLLISIONS[label])
    assert x != y
    assert len(x) == len(y)
    for suffix in (b"", b"@" + TAG.encode(), b"@other-tag"):
        assert hash_(x + suffix) == hash_(y + suffix), (label, suffix)
    if label in PREFIX_FREE:
        assert hash_(b"ns:" + x) == hash_(b"ns:" + y)


def _keyed(hash_: Callable[[bytes], int], mask: int, shift: int = 0) -> Callable[[str], int]:
    return lambda s: (hash_(s.encode()) >> shift) & mask


MAPS: dict[str, Callable[[str], object]] = {
    "lower": str.lower,
    "upper": str.upper,
    "casefold": str.casefold,
    "NFC": lambda s: unicodedata.normalize("NFC", s),
    "NFD": lambda s: unicodedata.normalize("NFD", s),
    "NFKC": lambda s: unicodedata.normalize("NFKC", s),
    "NFKD": lambda s: unicodedata.normalize("NFKD", s),
    "NFKC-casefold": lambda s: unicodedata.normalize("NFKC", s).casefold(),
    "strip": str.strip,
    "rstrip": str.rstrip,
    "lstrip": str.lstrip,
    "collapse-spaces": lambda s: " ".join(s.split()),
    "alnum-only": lambda s: "".join(c for c in s if c.isalnum()),
    "sanitize": lambda s: "".join(c if c.isalnum() else "_" for c in s),
    "ascii-ignore": lambda s: s.encode("ascii", "ignore"),
    "ascii-replace": lambda s: s.encode("ascii", "replace"),
    "latin1-replace": lambda s: s.encode("latin-1", "replace"),
    "printable-only": lambda s: "".join(c for c in s if c.isprintable()),
    "nul-terminated": lambda s: s.split("\x00", 1)[0],
    "sorted-chars": lambda s: "".join(sorted(s)),
    "byte-sum": lambda s: sum(s.encode()),
    "url-unquote": unquote,
    "path-normpath": posixpath.normpath,
    **{f"{label}-32": _keyed(h, 0xFFFFFFFF) for label, h in HASHES.items()},
    **{f"{label}-16-low": _keyed(h, 0xFFFF) for label, h in HASHES.items()},
    **{f"{label}-16-high": _keyed(h, 0xFFFF, shift=16) for label, h in HASHES.items()},
}


@pytest.mark.parametrize("label", sorted(MAPS))
def test_every_claimed_map_collides(label: str) -> None:
    """Each merging map is not injective on the corpus."""
    assert _collides(MAPS[label], _corpus())


@pytest.mark.parametrize("size", [*range(1, 1024, 7), 63, 64, 127, 128, 255, 256, 1023, 1024])
def test_truncation_collides_at_every_length(size: int) -> None:
    """Keeping the first, or the last, N bytes merges two names, for N up to 1 KiB."""
    names = _corpus()
    assert _collides(lambda s: s.encode()[:size], names)
    assert _collides(lambda s: s.encode()[-size:], names)


@pytest.mark.parametrize("digest", ["md5", "sha1", "sha256", "blake2b"])
def test_16_bit_truncated_digests_collide_on_the_corpus(digest: str) -> None:
    """A hash not listed, cut to 16 bits, collides within the corpus (birthday bound)."""
    corpus = _corpus() + [f"{TAG}-r{i:x}" for i in range(BULK)]
    assert _collides(lambda s: hashlib.new(digest, s.encode()).digest()[:2], corpus)
