"""The backend author's kit: what a backend distribution imports from the core.

A backend is any object with ``connect(url)`` and ``connect_async(url)``
(:class:`multilock.abc.Backend`), published under the entry-point group
``multilock.backends`` with the URL scheme as its name. The base classes here
are optional but carry the subtle parts of the contract (see ``multilock._locks.base``).
"""

from __future__ import annotations

from ._durations import MAX_DURATION, Duration, parse_duration
from ._locks.base import (
    MAX_NAME_BYTES,
    AsyncLeaseBase,
    AsyncLockerBase,
    AsyncReleaseWatch,
    LeaseBase,
    LockerBase,
    LockInfo,
    ReleaseWatch,
    new_token,
)
from ._locks.mutex import AsyncMutex, Mutex
from ._locks.outcome import Outcome, finish_shielded, settle_in_task
from ._locks.registry import ENTRY_POINT_GROUP
from ._signal import LostSignal
from ._url import LockURL, OptionParser, as_bool, as_duration, as_int, as_str, mask_url, quote_name
from .abc import DEGRADED_STATES, Backend, Capability, ConformanceHooks, SupportsDegrade

__all__ = [
    "DEGRADED_STATES",
    "ENTRY_POINT_GROUP",
    "MAX_DURATION",
    "MAX_NAME_BYTES",
    "AsyncLeaseBase",
    "AsyncLockerBase",
    "AsyncMutex",
    "AsyncReleaseWatch",
    "Backend",
    "Capability",
    "ConformanceHooks",
    "Duration",
    "LeaseBase",
    "LockInfo",
    "LockURL",
    "LockerBase",
    "LostSignal",
    "Mutex",
    "OptionParser",
    "Outcome",
    "ReleaseWatch",
    "SupportsDegrade",
    "as_bool",
    "as_duration",
    "as_int",
    "as_str",
    "finish_shielded",
    "mask_url",
    "new_token",
    "parse_duration",
    "quote_name",
    "settle_in_task",
]
