"""Stale holders, all ways: every lease operation of a holder whose lease expired, in
every order, against a new holder in the same process, in another process and in a
freshly started one.

Each order of operations gets a name of its own, so one expiry serves them all. A
stale ``release()`` must return ``False`` and a stale ``extend()`` (with or without a
ttl) must raise ``LockLost`` -- tried *before* a release too, where the lease itself
does not yet know it is stale and only the backend can refuse. The new holder must
keep every name, and release it (``True``) at the end.

Against a freshly started process, the stale holder's lease is the first its process
took and so is the new holder's: owner tokens unique only within a process (a
per-process counter) collide there, with certainty.
"""

from __future__ import annotations

import asyncio
import signal
import time
from itertools import permutations
from typing import Any

import pytest

from multilock.abc import Capability

from ._checks_process import _crash_bound
from ._checks_ttl import _RENEWS, SHORT_TTL, SLACK, fences_newer
from ._harness import Harness, eventually
from ._process import Child
from ._serve import OPS, run_ops

__all__ = ["PLANS", "stale_across_processes", "stale_in_process"]

PLANS: list[tuple[str, ...]] = [
    plan for size in range(1, len(OPS) + 1) for plan in permutations(OPS, size)
]
"""Every order of every non-empty set of stale operations (15 plans)."""

_WANT = {"release": "False", "extend": "LockLost", "extend(ttl)": "LockLost"}


def _names(h: Harness, context: str) -> dict[str, list[str]]:
    """A name per plan: ``{name: ops}``."""
    return {h.name(f"stale-{context}-{'-'.join(plan)}"): list(plan) for plan in PLANS}


def _wrong(context: str, plan: dict[str, list[str]], outcomes: dict[str, list[str]]) -> list[str]:
    """What a stale holder was allowed to do that it must not."""
    wrong = []
    for name, ops in plan.items():
        got = outcomes[name]
        for i, op in enumerate(ops):
            if got[i] != _WANT[op]:
                done = ", ".join(f"{o} -> {g}" for o, g in zip(ops, got, strict=True))
                wrong.append(f"{context}: stale {op} gave {got[i]} (want {_WANT[op]}) in [{done}]")
                break
    return wrong


async def _take_all(h: Harness, locker: Any, names: list[str], within: float) -> dict[str, Any]:
    """Take each name (in order) as soon as it is free; fail after ``within`` seconds."""
    taken: dict[str, Any] = {}
    for name in names:

        async def take(name: str = name) -> Any:
            return await h.api.try_acquire(locker, name)

        taken[name], _ = await eventually(f"the stale lease on {name!r} expiring", take, within)
    return taken


async def _assert_new_holders_kept(h: Harness, names: list[str], wrong: list[str]) -> None:
    wrong += [
        f"{name!r} is free: a stale holder's operation freed the new holder's"
        for name in names
        if await h.is_free(name)
    ]
    assert not wrong, "stale holders touched new holders' locks:\n" + "\n".join(wrong)


async def stale_in_process(h: Harness) -> None:
    """A stale holder and the new holder in one process (two lockers): every plan."""
    h.requires(Capability.TTL)
    if h.has(Capability.RENEWAL):
        pytest.skip(_RENEWS)
    plan = _names(h, "here")
    names = list(plan)
    stale_locker, new_locker = await h.api.connect(), await h.api.connect()
    stale = {}
    for name in names:
        stale[name] = await h.api.try_acquire(stale_locker, name, ttl=SHORT_TTL)
        assert stale[name] is not None, f"free name {name!r} refused"
    start = time.monotonic()
    fresh = await _take_all(h, new_locker, names, SHORT_TTL + SLACK)
    since = time.monotonic() - start
    assert since >= SHORT_TTL * 0.8, f"a lease with ttl={SHORT_TTL} s expired after {since:.2f} s"
    for name in names:
        fences_newer(h, stale[name], fresh[name])
    outcomes = {name: await run_ops(h.api, stale[name], ops) for name, ops in plan.items()}
    await _assert_new_holders_kept(h, names, _wrong("same process", plan, outcomes))
    for name in names:
        assert fresh[name].held, f"the new holder's lease on {name!r} no longer says held"
        assert await h.api.release(fresh[name]) is True, (
            f"the new holder of {name!r} could not release it after stale operations"
        )


async def stale_across_processes(h: Harness) -> None:
    """Stale holders in a child process; new holders in that process (another locker),
    in this process, and in a freshly started process: every plan against each."""
    h.requires(Capability.TTL, Capability.CROSS_PROCESS)
    renews = h.has(Capability.RENEWAL)
    contexts = {"fresh": _names(h, "fresh"), "other": _names(h, "other")}
    if not renews:  # a renewing holder can only be made stale by freezing its process
        contexts["same"] = _names(h, "same")
    bound = _crash_bound(h, SHORT_TTL) + SLACK
    stale = Child(h.kind, h.url, module="multilock.testing._serve")
    newcomer = Child(h.kind, h.url, module="multilock.testing._serve")
    async with stale, newcomer:
        # The fresh context first: the stale process's first acquisitions.
        for context, plan in contexts.items():
            await stale.ask(do="take", locker=context, names=list(plan), ttl=SHORT_TTL, within=5.0)
        if renews:
            stale.signal(signal.SIGSTOP)
        fresh_names, other_names = list(contexts["fresh"]), list(contexts["other"])
        here = await _take_all(h, await h.api.connect(), other_names, bound)
        await newcomer.ask(
            bound + 5.0, do="take", locker="new", names=fresh_names, ttl=None, within=bound
        )
        if "same" in contexts:
            await stale.ask(
                bound + 5.0,
                do="take",
                locker="same-new",
                names=list(contexts["same"]),
                ttl=None,
                within=bound,
            )
        stale.signal(signal.SIGCONT)
        wrong = []
        where = {"fresh": "a freshly started process", "other": "another process"}
        for context, plan in contexts.items():
            answer = await stale.ask(do="ops", locker=context, plan=plan)
            holder = where.get(context, "the same process")
            wrong += _wrong(f"new holder in {holder}", plan, answer["outcomes"])
        all_names = [name for plan in contexts.values() for name in plan]
        await _assert_new_holders_kept(h, all_names, wrong)
        for name, lease in here.items():
            assert await h.api.release(lease) is True, f"the new holder of {name!r} lost it"
        released = (await newcomer.ask(do="release", locker="new"))["released"]
        if "same" in contexts:
            released |= (await stale.ask(do="release", locker="same-new"))["released"]
        lost = sorted(name for name, ok in released.items() if ok is not True)
        assert not lost, f"new holders could not release after stale operations: {lost}"
        for child in (stale, newcomer):
            await child.send('{"do": "exit"}')
        await asyncio.gather(stale.wait(), newcomer.wait())
