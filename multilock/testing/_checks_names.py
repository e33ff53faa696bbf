"""Near-equal names: a corpus built so that a merging map of names to keys collides.

Each *family* is a set of distinct names that one plausible mapping merges: case
folding, Unicode normalization (NFC/NFD, NFKC), whitespace and punctuation
stripping or sanitizing, dropping control or non-ASCII characters, order-insensitive
sums, truncation to the first or the last N bytes at common N, and the 32-bit hashes
whose collisions survive a shared prefix or suffix (CRC-32, Adler-32, FNV-1/FNV-1a
32, the low half of FNV-1a 64, Java's ``hashCode``, djb2, sdbm) -- so each of these
maps collides on the corpus with certainty, not by chance. A bulk of :data:`BULK`
plain names adds the birthday bound for every other map: into 16 bits, a random-like
map leaves the corpus's 1784 names all distinct with probability about ``e**-24``
(1e-10). A key space of 32 bits under a hash not listed here (a truncated SHA-256,
say) is only caught by chance: thousands of names cannot promise more.

Every name is held at the same time, members of one family by different lockers:
a backend that merges two names refuses one of them (``None``) and fails. A
backend with a documented limit raises ``InvalidLockName`` for the names it
cannot keep apart -- allowed, with a message -- and never merges them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from multilock.errors import InvalidLockName

from ._harness import Harness

__all__ = [
    "BULK",
    "HASH_COLLISIONS",
    "TRUNCATIONS",
    "families",
    "names_near_equal",
]

BULK = 1536
"""Plain names held at once besides the families (the sync variant only: sizes, not
spellings, are what they test)."""

LOCKERS = 3
"""Lockers holding the corpus: members of a family go to different ones."""

TRUNCATIONS = (
    *(8, 16, 20, 24, 30, 31, 32, 40, 50, 60, 63, 64, 100, 120, 127, 128),
    *(200, 250, 255, 256, 500, 511, 512, 1000, 1023, 1024),
)
"""Byte lengths at which a truncating backend would cut names."""

_SPLIT_CHARACTER = (64, 128, 255, 256)

HASH_COLLISIONS = {
    "crc32": ("TbCKtziL", "5DZKXy3h"),
    "adler32": ("XmewmLLo", "wuIaYAyl"),
    "fnv1a-32": ("wuWk9r2d", "C6eCGB3L"),
    "fnv1-32": ("3gp5m4nY", "ZY6DVKgb"),
    "fnv1a-64-low32": ("L071mPsa", "0ZqWsBNh"),
    "java-hashcode": ("Ez45QK2t", "MrpV8L1D"),
    "djb2": ("3LzXKbfQ", "A78Greur"),
    "sdbm": ("m2Gso87Y", "3HO3Rkf0"),
}
"""Pairs of equal-length ASCII strings with the same 32-bit hash from the hash's
initial state: the collision survives any common suffix (the state is the whole
output), and for CRC-32, Adler-32 and the polynomial hashes any common prefix too
(checked by tests/test_names_corpus.py, which also finds them again)."""

_SPELLINGS: dict[str, list[str]] = {
    "case": ["job", "Job", "JOB", "jOb"],
    "case-sharp-s": ["straße", "strasse", "STRASSE", "straẞe"],
    "case-sigma": ["σς", "σσ", "ΣΣ"],  # noqa: RUF001 (confusables on purpose)
    "case-kelvin": ["\u212a", "K", "k"],
    "case-dotted-i": ["İ", "i\u0307", "i", "I", "ı"],  # noqa: RUF001 (confusables on purpose)
    "case-digraph": ["ǆ", "ǅ", "Ǆ"],
    "nfc-nfd": ["é", "e\u0301"],
    "nfc-nfd-hangul": ["한", "\u1112\u1161\u11ab"],
    "nfc-angstrom": ["Å", "\u212b", "A\u030a"],
    "nfc-order": ["ệ", "e\u0323\u0302", "e\u0302\u0323"],
    "nfkc-ligature": ["ﬁ", "fi", "ﬀ", "ff"],
    "nfkc-width": ["Ａ", "A", "ｶ", "カ"],  # noqa: RUF001 (confusables on purpose)
    "nfkc-compat": ["²", "2", "①", "1", "™", "TM", "…", "...", "㎏", "kg", "½", "1⁄2"],  # noqa: RUF001 (confusables on purpose)
    "whitespace": ["w", "w ", "w\t", "w\n", "w\r\n", "w\u00a0", "w\u200b", "w\u3000", "w\u2028"],
    "inner-space": ["w x", "w  x", "w\tx", "wx"],
    "punctuation": [f"a{c}b" for c in "-_. /:\\|*?#+=,;@&~!$'\"<>()[]{}^`"]
    + ["ab", "a%20b", "a%2Fb", "a%2fb", "a--b", "a__b"],
    "path": ["p/q", "p//q", "p/./q", "p/x/../q", "p/q/", "p\\q"],
    "control": ["n", "n\x00", "n\x00x", "n\x01", "n\x7f", "n\x1b", "n\x85"],
    "non-ascii": ["", "ü", "ö", "u", "ue", "?", "\ufffd", "üü", "¿"],
    "anagram": ["ab12", "ba12", "12ab", "a1b2", "21ba"],
}
"""Spellings a normalizing, sanitizing or stripping backend would merge (each after
the run's tag and a dash)."""


def families(tag: str) -> dict[str, list[str]]:
    """The corpus's families for a run whose names start with ``tag`` (ASCII)."""
    found = {label: [f"{tag}-{s}" for s in spellings] for label, spellings in _SPELLINGS.items()}
    found["leading-space"] = [f"{tag}-lead", f" {tag}-lead", f"\t{tag}-lead", f"\n{tag}-lead"]
    for label, pair in HASH_COLLISIONS.items():
        found[f"hash-{label}"] = [f"{x}@{tag}" for x in pair]
    for size in TRUNCATIONS:
        base = f"{tag}-t{size}-"
        if len(base) < size:  # shorter cuts merge every name of the tag: caught anyway
            base += "." * (size - len(base))
            found[f"first-{size}-bytes"] = [base, base + "x"]
            if size in _SPLIT_CHARACTER:  # a cut inside a character, decoded leniently
                found[f"first-{size}-bytes"] += [base[:-1] + "é", base[:-1] + "è"]
        fill = "." * size
        found[f"last-{size}-bytes"] = [f"{tag}-s{size}a{fill}", f"{tag}-s{size}b{fill}"]
    return found


async def names_near_equal(h: Harness) -> None:
    """Every name of the corpus held at once, across lockers: all granted, distinct
    keys -- or refused with ``InvalidLockName`` and a message."""
    tag = h.name("near")
    lockers = [await h.api.connect() for _ in range(LOCKERS)]
    held: dict[str, Any] = {}
    refused: dict[str, str] = {}
    merged: list[str] = []
    for label, family in families(tag).items():
        for i, name in enumerate(family):
            try:
                lease = await h.api.try_acquire(lockers[i % LOCKERS], name)
            except InvalidLockName as exc:
                refused[name] = str(exc)
                continue
            if lease is None:
                others = [n for n in family if n in held]
                merged.append(f"{label}: {name!r} refused while {others!r} are held")
            else:
                assert lease.name == name, f"lease.name {lease.name!r} is not {name!r}"
                held[name] = lease
    if h.kind == "sync":
        bulk = [f"{tag}-r{i:x}" for i in range(BULK)]
        # Small batches: a backend without BATCH takes them one by one, and any
        # try_acquire_many must answer within TRY_LIMIT.
        for i, start in enumerate(range(0, BULK, 32)):
            chunk = bulk[start : start + 32]
            got = await h.api.try_acquire_many(lockers[i % LOCKERS], chunk)
            merged += [f"bulk: {name!r} refused" for name, lease in got.items() if lease is None]
            held.update({name: lease for name, lease in got.items() if lease is not None})
    assert not merged, (
        f"distinct names map to one lock ({len(merged)} refused while the corpus is held):\n"
        + "\n".join(merged[:40])
    )
    for name, message in refused.items():
        assert message.strip(), f"InvalidLockName for {name[:40]!r} has no message"
    if len(refused) > len(held):
        pytest.fail(f"most of the corpus was refused: {sorted(refused)[:10]}...", pytrace=False)
    by_key: dict[Any, list[str]] = defaultdict(list)
    for name, lease in held.items():
        by_key[lease.key].append(name)
    shared = [names for names in by_key.values() if len(names) > 1]
    assert not shared, f"distinct held names share a lease.key: {shared[:10]}"
