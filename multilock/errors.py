"""The one exception tree of multilock.

Every error multilock raises on purpose is a :class:`MultilockError`; errors of
the drivers (psycopg, redis-py, kazoo, the OS) are mapped into this tree at the
backend boundary, never leaked raw::

    MultilockError
    ├── ConfigurationError            (also a ValueError: bad input, caught early)
    │   ├── InvalidURL                the URL cannot be parsed
    │   ├── UnknownScheme             no backend is installed for the scheme
    │   ├── MissingBackend            a known scheme whose extra is not installed
    │   ├── InvalidOption             unknown option, or a value of the wrong form
    │   ├── InvalidLockName           a name the backend cannot represent
    │   └── ClaimsUnavailable         TICK_CLAIM declared, but this locker cannot claim
    ├── BackendUnavailable            could not ask the backend (never "held elsewhere")
    ├── LockTimeout                   (also a TimeoutError) a waiting acquire's timeout passed
    └── LockLost                      a lease we held is no longer ours
        └── NotOwner                  ... and the lock now belongs to another holder

Messages never contain passwords: URLs are always shown masked.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "ClaimsUnavailable",
    "ConfigurationError",
    "InvalidLockName",
    "InvalidOption",
    "InvalidURL",
    "LockLost",
    "LockTimeout",
    "MissingBackend",
    "MultilockError",
    "NotOwner",
    "UnknownScheme",
]


class MultilockError(Exception):
    """Base class of every error multilock raises."""


class ConfigurationError(MultilockError, ValueError):
    """Bad input: a URL, an option or a name that cannot work. Raised early."""


class InvalidURL(ConfigurationError):
    """The lock URL cannot be parsed."""


class UnknownScheme(ConfigurationError):
    """No backend is installed for the URL's scheme; the message lists those that are."""


class MissingBackend(UnknownScheme):
    """The scheme belongs to a multilock extra that is not installed."""


class InvalidOption(ConfigurationError):
    """An option is unknown to the backend, or its value has the wrong form."""


class InvalidLockName(ConfigurationError):
    """A lock name the backend cannot represent (too long, forbidden characters)."""


class BackendUnavailable(MultilockError, ConnectionError):
    """The backend could not be asked: connection refused, timed out or dropped.

    Distinct from "held elsewhere", which is ``try_acquire`` returning ``None``.
    """


class ClaimsUnavailable(ConfigurationError):
    """A backend that declares ``TICK_CLAIM`` cannot claim ticks for this locker (a
    PostgreSQL role that may not create or write the claims table, say); the message
    says what to do. The scheduler then holds its jobs' locks instead, as on a backend
    without claims."""


class LockTimeout(MultilockError, TimeoutError):
    """``acquire(name, timeout=...)`` waited its whole timeout and the name stayed held.

    Nothing is held or queued for the caller when it is raised.
    """


class LockLost(MultilockError):
    """A lease is no longer held: it expired, its session died, or it was revoked."""


class NotOwner(LockLost):
    """The lock is held, but by another owner: a stale holder tried to touch it."""
