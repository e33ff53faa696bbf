"""Small helpers shared by the reliability tests: URLs per backend, polling, bounds."""

from __future__ import annotations

import uuid

import multilock
from multilock._locks.registry import backend_for
from multilock.backend import LockURL
from multilock.testing import apoll, poll

__all__ = [
    "SERVER_BACKENDS",
    "apoll",
    "crash_bound",
    "fresh_name",
    "hooks",
    "poll",
    "with_options",
]

SERVER_BACKENDS = ("postgres", "redis", "zookeeper")


def fresh_name(what: str) -> str:
    """A lock name no other test (or earlier run) uses."""
    return f"rel-{what}-{uuid.uuid4().hex[:10]}"


def with_options(url: str, **options: object) -> str:
    """``url`` with more query options."""
    query = "&".join(f"{key}={value}" for key, value in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}" if query else url


def hooks(url: str) -> multilock.backend.ConformanceHooks:
    """The conformance hooks of ``url``'s backend (every backend here ships them)."""
    found = backend_for(LockURL.parse(url).scheme).conformance
    assert found is not None, f"{url.split(':')[0]}:// ships no conformance hooks"
    return found


def crash_bound(url: str, ttl: float) -> float:
    """The backend's declared bound for a dead holder's lock to be free again."""
    return hooks(url).crash_release_bound(LockURL.parse(url), ttl)
