"""What every check gets: the URL, the API adapter, the backend's promises and hooks."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import pytest

import multilock
from multilock._locks.registry import backend_for
from multilock.abc import Capability, ConformanceHooks
from multilock.backend import LockURL

from ._api import Api, make_api

__all__ = ["CHECK_TIMEOUT", "Harness", "eventually"]

CHECK_TIMEOUT = 120.0
"""Seconds a whole check may take before it fails as hung."""


class Harness:
    """One check's view of the backend under test (the ``multilock`` fixture)."""

    def __init__(self, url: str, kind: str) -> None:
        self.url = url
        self.kind = kind
        self.lock_url = LockURL.parse(url)
        with multilock.connect(url) as locker:
            self.capabilities: frozenset[Capability] = frozenset(locker.capabilities)
        backend = backend_for(self.lock_url.scheme)
        self.hooks: ConformanceHooks | None = getattr(backend, "conformance", None)
        self._prefix = f"conformance-{uuid.uuid4().hex[:12]}-{kind}"
        self.api: Api = make_api(kind, url)
        self._probe: Any = None

    def has(self, capability: Capability) -> bool:
        """Whether the backend declares ``capability``."""
        return capability in self.capabilities

    def requires(self, *capabilities: Capability) -> None:
        """Skip the check, naming the capability, unless the backend declares all of them."""
        for capability in capabilities:
            if capability not in self.capabilities:
                pytest.skip(
                    f"backend does not declare Capability.{capability.name}"
                    f" ({capability.value!r}): check does not apply"
                )

    def require_hooks(self, why: str) -> ConformanceHooks:
        """The backend's ConformanceHooks; a failure when a declared promise needs them."""
        if self.hooks is None:
            pytest.fail(
                f"backend for {self.lock_url.scheme}:// ships no ConformanceHooks"
                f" (Backend.conformance is None), which {why}",
                pytrace=False,
            )
        return self.hooks

    async def probe(self) -> Any:
        """A locker of the check's own, independent of those the check opens."""
        if self._probe is None:
            self._probe = await self.api.connect()
        return self._probe

    async def is_free(self, name: str) -> bool:
        """Whether an independent locker can take ``name`` now (it gives it back at once)."""
        lease = await self.api.try_acquire(await self.probe(), name)
        if lease is None:
            return False
        await self.api.release(lease)
        return True

    async def assert_free(self, name: str, why: str) -> None:
        """Fail unless an independent locker can take ``name`` right now."""
        assert await self.is_free(name), f"{name!r} is still held {why}"

    async def assert_held(self, name: str, why: str) -> None:
        """Fail unless an independent locker is refused ``name`` right now."""
        assert not await self.is_free(name), f"an independent locker could take {name!r} {why}"

    def name(self, label: str) -> str:
        """A lock name unique to this check run, so runs and variants never collide."""
        return f"{self._prefix}-{label}"

    def run(self, check: Callable[[Harness], Awaitable[None]]) -> None:
        """Run ``check`` in a fresh event loop; close every locker it opened."""

        async def main() -> None:
            try:
                await asyncio.wait_for(check(self), CHECK_TIMEOUT)
            except TimeoutError:
                raise AssertionError(
                    f"check did not finish within {CHECK_TIMEOUT:g} s (hung?)"
                ) from None
            finally:
                self._probe = None
                await self.api.close_all()

        try:
            asyncio.run(main())
        except BaseException as exc:
            exc.__traceback__ = _without_asyncio(exc.__traceback__)
            raise


_ASYNCIO_DIR = os.path.dirname(asyncio.__file__)


def _without_asyncio(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without the event loop's own frames: a failed check reads as
    the check, not as ``runners.py``/``tasks.py``/``base_events.py``."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_ASYNCIO_DIR):
            kept.append(tb)
        tb = tb.tb_next
    for here, after in zip(kept, [*kept[1:], None], strict=True):
        here.tb_next = after
    return kept[0] if kept else None


async def eventually(
    what: str, probe: Callable[[], Awaitable[Any]], within: float, interval: float = 0.02
) -> tuple[Any, float]:
    """Poll ``probe`` until it returns something truthy; fail after ``within`` seconds.

    Returns the probe's result and the seconds it took.
    """
    start = time.monotonic()
    while True:
        result = await probe()
        elapsed = time.monotonic() - start
        if result:
            return result, elapsed
        if elapsed > within:
            raise AssertionError(
                f"{what}: still not true after {elapsed:.2f} s (bound {within:g} s)"
            )
        await asyncio.sleep(interval)
