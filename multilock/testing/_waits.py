"""Seeing a waiting acquire wait: the tests of wake-ups (core and backends) release a
name only once its waiter has been refused and is in its first wait, so that a grant
proves the wake-up rather than a first try that came late."""

from __future__ import annotations

import pytest

from multilock._locks import base


def observe_waits(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names whose waiting acquires (the kit's ``acquire``, sync or async) have
    been refused once and are about to wait, filled in as it happens: poll it."""
    waiting: set[str] = set()
    next_wait = base.Patience.next_wait

    def recorded(self: base.Patience, wakes: bool = False) -> float:
        wait = next_wait(self, wakes)
        waiting.add(self._name)  # set.add is atomic: sync waiters run in threads
        return wait

    monkeypatch.setattr(base.Patience, "next_wait", recorded)
    return waiting
