"""The model check: random histories of lock operations against a reference model.

Hypothesis's stateful testing (a ``RuleBasedStateMachine``) draws sequences of
``try_acquire``, ``try_acquire_many``, ``release``, ``extend`` (with and without
a ttl), time passing past a ttl, ``close`` and ``locks()`` over three lockers --
two of them in other processes where the backend declares ``CROSS_PROCESS`` --
and compares every observable result with :class:`Model`, the contract written
as code. A failing history shrinks to a minimal one, printed in the failure.

Where timing makes an outcome ambiguous (an operation near a lease's expiry),
the model accepts either outcome and follows the one observed: a correct
backend never fails this check on a slow machine, it only gets fewer
unambiguous verdicts. Each lease's expiry is a window ``[lo, hi]`` of the
parent's monotonic clock, from the start and the end of the call that set it.

Every locker is a :class:`~._child.LockerServer`; the child processes are
started once per check and driven over a pipe, so an example costs round
trips, not process starts.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from multilock.abc import Capability

from ._api import OP_TIMEOUT, in_thread
from ._checks_ttl import SHORT_TTL
from ._child import LockerServer
from ._harness import Harness
from ._process import Child

__all__ = ["Budget", "Model", "ModelLease", "model_checked_history"]

T = TypeVar("T")
Step = tuple[str, dict[str, Any]]
"""One step of a history: the rule's name and its arguments."""

BATCH = 10
"""Histories per hypothesis run: the check runs batches until its budget is spent."""
LOCKERS = 3
"""Lockers per example: one in this process, two in child processes with CROSS_PROCESS."""
NAMES = 2
"""Names per example: few, so that lockers contend for them."""
STEPS = 32
"""Operations per example (hypothesis's ``stateful_step_count``)."""
EXPIRING_TTLS = (0.15, 0.3)
"""The ttls (seconds) of leases that expire (TTL without RENEWAL): short, so that
letting one pass is cheap; two of them, so that ``extend(ttl)`` taking the wrong
one shows."""
LEASE_PICKS = 8
"""A step on a lease draws an index below this (the lease at it modulo the count)."""
WAIT_GAP = 0.06
"""How far (seconds) a time-passing step lands before or after an expiry window."""
EPS = 0.02
"""Seconds of clock slack on each side of an expiry window (the backend's clock
against this process's, timestamp granularity)."""
EXPIRES_AT_SLACK = 0.1
"""Seconds ``expires_at`` may stray from the ttl counted over the call."""
MINIMIZE_SECONDS = 20.0
"""Seconds :func:`_minimize` may take to leave steps out of a shrunk failure."""
HISTORY = "this history, as it ran:"
"""What introduces a failed history's steps in a failure's message."""
REPLY_TIMEOUT = OP_TIMEOUT + 5.0
"""Seconds a child may take to answer one command (its own calls are bounded)."""


@dataclass(frozen=True)
class Budget:
    """How much of the model check a backend gets (its own wall time, not CPU)."""

    seconds: float
    """No new batch of histories starts after this many seconds."""
    waits: int = 0
    """Time-passing steps per history: each costs up to a ttl of wall time."""
    shrink_seconds: float = 15.0
    """Seconds hypothesis spends shrinking a failure (then :func:`_minimize` runs)."""


SESSION_BUDGET = Budget(seconds=0.4)
"""Backends whose leases do not expire: histories cost round trips only."""
EXPIRING_BUDGET = Budget(seconds=4.0, waits=4)
"""TTL without RENEWAL: histories sleep past ttls, which is what finds stale holders."""
RENEWAL_BUDGET = Budget(seconds=3.0, waits=1)
"""TTL with RENEWAL: a time-passing step sleeps past a whole :data:`SHORT_TTL`, and
only shows that renewal keeps the lease."""

Status = Literal["alive", "maybe", "expired", "superseded", "ended"]


@dataclass(eq=False)
class ModelLease:
    """What the model knows of one granted lease."""

    label: str
    slot: int
    lease_id: int
    name: int
    ttl: float | None
    lo: float
    """Surely unexpired before this instant (monotonic; ``inf``: never expires)."""
    hi: float
    """Surely expired after this instant (``inf``: never expires)."""
    nominal: float
    """When the ttl last set runs out, renewal or not (where a wait aims)."""
    token: str
    superseded: bool = False
    """Another lease on the name was granted after this one expired."""
    ended: bool = False
    """Released (whatever ``release()`` said) or its locker closed."""
    clean: bool = False
    """Ended while surely held: ``lost`` must never fire for it."""
    ended_at: float = -math.inf


@dataclass
class Model:
    """The lock contract as code: what each call may answer, given what came before."""

    expiring: bool
    """Leases expire after their ttl (TTL without RENEWAL)."""
    leases: list[ModelLease] = field(default_factory=list)

    def current(self, name: int) -> ModelLease | None:
        """The one lease on ``name`` that may still hold it (at most one can)."""
        for lease in reversed(self.leases):
            if lease.name == name and not lease.ended and not lease.superseded:
                return lease
        return None

    def status(self, lease: ModelLease, t0: float, t1: float) -> Status:
        """The lease over a call that ran between ``t0`` and ``t1``."""
        if lease.ended:
            return "ended"
        if lease.superseded:
            return "superseded"
        if t1 < lease.lo:
            return "alive"
        if t0 > lease.hi:
            return "expired"
        return "maybe"

    def window(self, ttl: float | None, t0: float, t1: float) -> tuple[float, float]:
        """The expiry window of a lease granted or extended for ``ttl`` over [t0, t1]."""
        if not self.expiring or ttl is None:
            return math.inf, math.inf
        return t0 + ttl - EPS, t1 + ttl + EPS

    def may_grant(self, name: int, t0: float, t1: float) -> set[bool]:
        """Whether a try_acquire of ``name`` over [t0, t1] may grant it: {True}, {False}
        or both (near an expiry)."""
        holder = self.current(name)
        status = "expired" if holder is None else self.status(holder, t0, t1)
        return {True, False} if status == "maybe" else {status != "alive"}

    def granted(self, lease: ModelLease, t1: float) -> None:
        """Record a grant: the name's previous lease, expired by now, is stale."""
        previous = self.current(lease.name)
        if previous is not None:
            previous.superseded = True
            previous.hi = min(previous.hi, t1)
        self.leases.append(lease)

    def may_release(self, lease: ModelLease, t0: float, t1: float) -> set[bool]:
        """What ``release()`` may return."""
        status = self.status(lease, t0, t1)
        if status in ("ended", "superseded"):
            return {False}
        return {True} if status == "alive" else {True, False}

    def released(self, lease: ModelLease, t0: float, t1: float, answer: bool) -> None:
        """Record a release (or a close): the lease is over, whatever it answered."""
        if not lease.ended:
            lease.clean = answer and self.status(lease, t0, t1) == "alive"
            lease.ended, lease.ended_at = True, t1

    def may_extend(self, lease: ModelLease, t0: float, t1: float) -> set[bool]:
        """Whether ``extend()`` may succeed (else it raises LockLost)."""
        status = self.status(lease, t0, t1)
        if status in ("ended", "superseded"):
            return {False}
        return {True} if status == "alive" else {True, False}

    def extended(self, lease: ModelLease, ttl: float | None, t0: float, t1: float) -> None:
        """Record a successful extend: ``ttl``, or the acquire's ttl when none is given."""
        ttl = lease.ttl if ttl is None else ttl
        lease.lo, lease.hi = self.window(ttl, t0, t1)
        lease.nominal = t1 + (ttl or 0.0)

    def extend_failed(self, lease: ModelLease, t1: float) -> None:
        """Record an extend that raised LockLost: the lease had expired by ``t1``."""
        lease.hi = min(lease.hi, t1)
        lease.lo = min(lease.lo, lease.hi)

    def may_hold(self, lease: ModelLease, t: float) -> tuple[set[bool], set[bool]]:
        """What the lease's ``held`` and ``lost.is_set()`` may say at ``t``."""
        status = self.status(lease, t, t)
        if status == "alive":
            return {True}, {False}
        if status == "ended":
            return {False}, {False} if lease.clean else {True, False}
        return {True, False}, {True, False}

    def listing(self, name: int, t0: float, t1: float) -> set[bool]:
        """Whether ``locks()`` over [t0, t1] may list ``name``."""
        holder = self.current(name)
        if holder is not None:
            status = self.status(holder, t0, t1)
            if status == "alive":
                return {True}
            if status == "maybe":
                return {True, False}
        return {False}


class _Driver:
    """One locker of the check, answering :class:`LockerServer` commands."""

    async def start(self) -> None:
        """Open the locker."""
        raise NotImplementedError

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        """One command's answer."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Close the locker (and end its process)."""


class _Local(_Driver):
    def __init__(self, h: Harness) -> None:
        self._server = LockerServer(h.api)

    async def start(self) -> None:
        await self._server.start()

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        return await self._server.handle(command)


class _Remote(_Driver):
    def __init__(self, h: Harness) -> None:
        self._child = Child(h.kind, h.url, "serve")

    async def start(self) -> None:
        await self._child.__aenter__()
        await self._child.expect("ready")

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        await self._child.send(json.dumps(command))
        answer: dict[str, Any] = json.loads(await self._child.expect("reply", REPLY_TIMEOUT))
        return answer

    async def stop(self) -> None:
        try:
            await self._child.send("exit")
            await self._child.wait(REPLY_TIMEOUT)
        except Exception:  # gone already: the kill below is all that is left
            pass
        finally:
            await self._child.__aexit__(None, None, None)


class _Stop(Exception):
    """Ends hypothesis's run once a failure has been shrunk for long enough."""


class _Run:
    """What every history of one check shares: the lockers, the loop, the budget."""

    def __init__(self, h: Harness, drivers: list[_Driver], budget: Budget) -> None:
        self.h = h
        self.drivers = drivers
        self.budget = budget
        self.loop = asyncio.get_running_loop()
        self.ttl = h.has(Capability.TTL)
        self.renewal = h.has(Capability.RENEWAL)
        self.expiring = self.ttl and not self.renewal
        self.session = h.has(Capability.SESSION)
        self.fencing = h.has(Capability.FENCING)
        self.introspection = h.has(Capability.INTROSPECTION)
        self.started = time.monotonic()
        self.failed_at: float | None = None
        self.smallest: tuple[list[Step], str] | None = None
        """The shortest failing history seen: its steps and its report."""
        self.replaying = False
        self.examples = 0
        self.tokens: dict[str, str] = {}
        """Every owner token handed out in this check, and to which lease."""

    def live(self) -> bool:
        """Whether a new history talks to the backend: not once the budget is spent
        (it then draws its steps and does nothing, and passes). Once a failure has
        been shrunk for long enough, a new history stops hypothesis (:class:`_Stop`),
        and :func:`_minimize` takes over from the shortest failing history."""
        if self.replaying:
            return True
        if self.failed_at is None:
            return time.monotonic() <= self.started + self.budget.seconds
        if time.monotonic() > self.failed_at + self.budget.shrink_seconds:
            raise _Stop
        return True

    def more(self) -> bool:
        """Whether to draw another batch of histories."""
        return time.monotonic() < self.started + self.budget.seconds

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the check's event loop, from hypothesis's thread."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(REPLY_TIMEOUT + 5.0)


def _choices(run: _Run) -> tuple[st.SearchStrategy[float | None], st.SearchStrategy[float | None]]:
    """The ttls an acquire and an extend draw from."""
    if run.expiring:
        acquire: st.SearchStrategy[float | None] = st.sampled_from(EXPIRING_TTLS)
    elif run.renewal:
        acquire = st.just(SHORT_TTL)
    else:  # session-bound: the ttl is accepted and means nothing
        acquire = st.sampled_from([None, SHORT_TTL])
    return acquire, st.none() | acquire


def _machine(run: _Run) -> type[_History]:
    """The state machine of one check. Its draws never depend on what the backend
    answers (leases are picked by index, not from a bundle of the granted ones):
    the same steps replay alike even where timing changes an answer."""
    acquire_ttl, extend_ttl = _choices(run)
    lockers = st.integers(0, LOCKERS - 1)
    names = st.integers(0, NAMES - 1)
    leases = st.integers(0, LEASE_PICKS - 1)

    class History(_History):
        """One history over fresh names; the model follows every answer."""

        def __init__(self) -> None:
            super().__init__(run)

        @rule(slot=lockers, name=names, ttl=acquire_ttl)
        def try_acquire(self, slot: int, name: int, ttl: float | None) -> None:
            """``try_acquire`` on one locker."""
            self.acquires += 1
            if self.record("try_acquire", slot=slot, name=name, ttl=ttl):
                self.do_try_acquire(slot, name, ttl)

        @rule(
            slot=lockers,
            chosen=st.lists(names, min_size=1, max_size=NAMES, unique=True),
            ttl=acquire_ttl,
        )
        def try_acquire_many(self, slot: int, chosen: list[int], ttl: float | None) -> None:
            """``try_acquire_many`` on one locker, names in the order drawn."""
            self.acquires += 1
            if self.record("try_acquire_many", slot=slot, chosen=chosen, ttl=ttl):
                self.do_try_acquire_many(slot, chosen, ttl)

        @rule(lease=leases)
        def release(self, lease: int) -> None:
            """``release()`` of a lease granted in this history, held or not."""
            lease = self.pick(lease)
            if self.record("release", lease=lease) and self.model.leases:
                self.do_release(self.model.leases[lease])

        @rule(lease=leases, ttl=extend_ttl)
        def extend(self, lease: int, ttl: float | None) -> None:
            """``extend()`` or ``extend(ttl)`` of a lease granted in this history."""
            lease = self.pick(lease)
            if self.record("extend", lease=lease, ttl=ttl) and self.model.leases:
                self.do_extend(self.model.leases[lease], ttl)

        @precondition(lambda self: self.acquires and self.waits < run.budget.waits)
        @rule(before=st.booleans())
        def wait(self, before: bool) -> None:
            """Let time pass to just before the leases held expire, or past it."""
            self.waits += 1
            if self.record("wait", before=before):
                self.do_wait(before)

        @rule(slot=lockers)
        def close(self, slot: int) -> None:
            """Close a locker (a new one takes its place)."""
            if self.record("close", slot=slot):
                self.do_close(slot)

        @precondition(lambda self: run.introspection)
        @rule(slot=lockers)
        def locks(self, slot: int) -> None:
            """``locks()``: what it lists, what it must list, what it must not."""
            if self.record("locks", slot=slot):
                self.do_locks(slot)

        @invariant()
        def states_agree(self) -> None:
            """The last answer's ``held`` and ``lost`` of its locker's leases fit the model."""
            self.check_states()

        def teardown(self) -> None:
            """Release what the history left held."""
            self.finish()

    return History


class _History(RuleBasedStateMachine):
    """What one history does; :func:`_machine` adds the rules that draw the steps."""

    def __init__(self, run: _Run) -> None:
        super().__init__()
        self.run = run
        self.live = run.live()
        run.examples += self.live
        self.model = Model(expiring=run.expiring)
        self.names = [run.h.name(f"model{run.examples}-{i}") for i in range(NAMES)]
        self.keys: dict[int, Any] = {}
        self.fences: dict[int, int] = {}
        self.log: list[str] = []
        self.steps: list[Step] = []
        self.waits = 0
        self.acquires = 0
        self.pending: tuple[int, dict[str, list[bool]], float] | None = None
        self.failed = False
        self.t_start = time.monotonic()

    def pick(self, index: int) -> int:
        """Which lease a drawn index stands for: its position in the history (which
        the step records, so that leaving out a later step keeps its meaning)."""
        return index % len(self.model.leases) if self.model.leases else index

    # -- talking to the lockers ---------------------------------------------------------

    def ask(self, slot: int, op: str, **args: Any) -> tuple[dict[str, Any], float, float]:
        """One command to locker ``slot``; its answer and when the call began and ended."""
        t0 = time.monotonic()
        try:
            answer = self.run.call(self.run.drivers[slot].ask({"op": op, **args}))
        except BaseException as exc:
            self.failing(f"L{slot}: {op} failed: {exc!r}\n\n{HISTORY}\n" + "\n".join(self.log))
            raise
        t1 = time.monotonic()
        # Checked by the invariant, once the rule has told the model what the answer meant.
        self.pending = (slot, answer["states"], t1)
        return answer, t0, t1

    def failing(self, message: str) -> None:
        """Note that this history failed (shrinking starts, and its budget with it)."""
        self.failed = True
        run = self.run
        if run.failed_at is None:
            run.failed_at = time.monotonic()
        if run.smallest is None or len(self.steps) <= len(run.smallest[0]):
            run.smallest = (list(self.steps), message)

    def fail(self, what: str) -> NoReturn:
        """Fail the check with ``what`` and the history so far."""
        message = f"{what}\n\n{HISTORY}\n" + "\n".join(self.log)
        self.failing(message)
        raise AssertionError(message)

    def record(self, rule: str, **args: Any) -> bool:
        """Note a step (for :func:`_minimize`); whether it is to be carried out."""
        self.steps.append((rule, args))
        return self.live

    def note(self, t: float, line: str) -> None:
        """One line of the history (shown when it fails)."""
        self.log.append(f"  [{t - self.t_start:6.3f}s] {line}")

    def raised(self, answer: dict[str, Any], call: str) -> None:
        """Fail if the call raised."""
        if "error" in answer:
            self.fail(f"{call} raised {answer['error']}: {answer['message']}")

    def n(self, name: int) -> str:
        """How a name shows in the history."""
        return f"name{name}"

    def check_states(self) -> None:
        """``held`` and ``lost`` of the leases of the locker that answered last."""
        if self.pending is None:
            return
        slot, states, t = self.pending
        self.pending = None
        mine = {lease.lease_id: lease for lease in self.model.leases if lease.slot == slot}
        for key, (held, lost) in states.items():
            lease = mine[int(key)]
            may_held, may_lost = self.model.may_hold(lease, t)
            if lost and held:
                self.fail(f"{lease.label}: lost fired, yet the lease still says held")
            if held not in may_held:
                self.fail(f"{lease.label}.held is {held} ({self.model.status(lease, t, t)})")
            if lost not in may_lost:
                why = "after a clean release or close" if lease.ended else "while it holds the name"
                self.fail(f"{lease.label}.lost fired {why}")

    def finish(self) -> None:
        """Release what the history left held; forget its leases."""
        if not self.live:
            return
        for slot in range(LOCKERS):
            try:
                self.ask(slot, "reset")
            except BaseException:
                if not self.failed:
                    raise
                # The history's own failure is what to report, not this one's.
        self.pending = None

    # -- the steps ------------------------------------------------------------------------

    def do_try_acquire(self, slot: int, name: int, ttl: float | None) -> None:
        """``try_acquire``: granted exactly when no lease holds the name."""
        wall = time.time()
        answer, t0, t1 = self.ask(slot, "acquire", name=self.names[name], ttl=ttl)
        call = f"L{slot}.try_acquire({self.n(name)}, ttl={ttl})"
        self.raised(answer, call)
        self.grant(slot, name, ttl, answer["lease"], (t0, t1), (wall, time.time()), call)

    def do_try_acquire_many(self, slot: int, chosen: list[int], ttl: float | None) -> None:
        """``try_acquire_many``: each name as ``try_acquire``, answered in order."""
        wall = time.time()
        full = [self.names[name] for name in chosen]
        answer, t0, t1 = self.ask(slot, "acquire_many", names=full, ttl=ttl)
        walls = (wall, time.time())
        call = f"L{slot}.try_acquire_many({[self.n(name) for name in chosen]}, ttl={ttl})"
        self.raised(answer, call)
        if answer["names"] != full:
            self.fail(f"{call} answered for {answer['names']}, not the names given in order")
        for name, got in zip(chosen, answer["leases"], strict=True):
            self.grant(slot, name, ttl, got, (t0, t1), walls, f"{call}[{self.n(name)}]")

    def grant(
        self,
        slot: int,
        name: int,
        ttl: float | None,
        got: dict[str, Any] | None,
        times: tuple[float, float],
        walls: tuple[float, float],
        call: str,
    ) -> None:
        """What an acquire answered for one name, against the model."""
        t0, t1 = times
        may = self.model.may_grant(name, t0, t1)
        holder = self.model.current(name)
        if got is None:
            self.note(t1, f"{call} -> None")
            if False not in may:
                expired = f" ({holder.label} expired)" if holder else ""
                self.fail(f"{call} returned None, but no lease holds {self.n(name)}{expired}")
            return
        lo, hi = self.model.window(ttl, t0, t1)
        lease = ModelLease(
            label=f"lease{len(self.model.leases)}",
            slot=slot,
            lease_id=got["id"],
            name=name,
            ttl=ttl,
            lo=lo,
            hi=hi,
            nominal=t1 + (ttl or 0.0),
            token=got["token"],
        )
        fence = "" if got["fence"] is None else f" (fencing token {got['fence']})"
        self.note(t1, f"{call} -> {lease.label}{fence}")
        if True not in may:
            assert holder is not None
            self.fail(f"{call} granted {self.n(name)}, which {holder.label} holds")
        self.check_grant(lease, got, walls, call)
        self.model.granted(lease, t1)

    def check_grant(
        self, lease: ModelLease, got: dict[str, Any], walls: tuple[float, float], call: str
    ) -> None:
        """A granted lease's name, token, key and fencing token; its expiry."""
        name, run = lease.name, self.run
        if got["name"] != self.names[name]:
            self.fail(f"{call}: lease.name is {got['name']!r}")
        if lease.token in run.tokens:
            earlier = run.tokens[lease.token]
            self.fail(f"{call}: owner token {lease.token!r} was handed out before, to {earlier}")
        run.tokens[lease.token] = f"{lease.label} (L{lease.slot}) in history {run.examples}"
        key = got["key"]
        if self.keys.setdefault(name, key) != key:
            self.fail(f"{call}: key {key!r}, but {self.n(name)} had key {self.keys[name]!r}")
        for other, other_key in self.keys.items():
            if other != name and other_key == key:
                self.fail(f"{self.n(name)} and {self.n(other)} share the key {key!r}")
        fence = got["fence"]
        if run.fencing:
            if type(fence) is not int:
                self.fail(f"{call}: fencing_token {fence!r} is not an int")
            if name in self.fences and fence <= self.fences[name]:
                self.fail(
                    f"{call}: fencing token {fence} is not above {self.fences[name]},"
                    f" an earlier holder's of {self.n(name)}"
                )
            self.fences[name] = fence
        elif fence is not None:
            self.fail(f"{call}: fencing_token {fence!r} without FENCING")
        self.check_expiry(got["expires_at"], lease.ttl, walls, call)

    def check_expiry(
        self, expires_at: float | None, ttl: float | None, walls: tuple[float, float], call: str
    ) -> None:
        """``expires_at`` (a Unix time here) against the ttl counted over the call."""
        run = self.run
        if run.expiring and ttl is not None:
            low, high = walls[0] + ttl - EXPIRES_AT_SLACK, walls[1] + ttl + EXPIRES_AT_SLACK
            if expires_at is None or not low <= expires_at <= high:
                away = "None" if expires_at is None else f"{expires_at - walls[1]:+.3f} s away"
                self.fail(f"{call}: expires_at is {away}, expected about {ttl:g} s")
        elif run.ttl and expires_at is None:
            self.fail(f"{call}: expires_at is None on a TTL backend")
        elif not run.ttl and run.session and expires_at is not None:
            self.fail(f"{call}: a session-bound lease has an expires_at")

    def do_release(self, lease: ModelLease) -> None:
        """``release()``: True from the holder, False once released, expired or taken."""
        answer, t0, t1 = self.ask(lease.slot, "release", id=lease.lease_id)
        call = f"{lease.label}.release()"
        self.raised(answer, call)
        released = answer["released"]
        self.note(t1, f"{call} -> {released}")
        if released not in self.model.may_release(lease, t0, t1):
            why = {
                "ended": "it was released already, or its locker closed",
                "superseded": "it expired and another lease holds the name",
                "alive": "it holds the name",
            }[self.model.status(lease, t0, t1)]
            self.fail(f"{call} returned {released}, but {why}")
        self.model.released(lease, t0, t1, released)

    def do_extend(self, lease: ModelLease, ttl: float | None) -> None:
        """``extend()``: works for the holder, raises LockLost once released or taken;
        what follows is the new ttl's (the acquire's, with none), as others see it."""
        wall = time.time()
        answer, t0, t1 = self.ask(lease.slot, "extend", id=lease.lease_id, ttl=ttl)
        call = f"{lease.label}.extend({'' if ttl is None else ttl})"
        may = self.model.may_extend(lease, t0, t1)
        status = self.model.status(lease, t0, t1)
        if "error" in answer:
            self.note(t1, f"{call} raised {answer['error']}")
            if not answer["lock_lost"]:
                self.fail(f"{call} raised {answer['error']}: {answer['message']}")
            if False not in may:
                self.fail(f"{call} raised {answer['error']}, but the lease holds the name")
            self.model.extend_failed(lease, t1)
            return
        self.note(t1, f"{call} -> ok")
        if True not in may:
            why = (
                "it was released already, or its locker closed"
                if status == "ended"
                else "it expired and another lease holds the name"
            )
            self.fail(f"{call} succeeded, but {why}: it must raise LockLost")
        self.model.extended(lease, ttl, t0, t1)
        ttl = lease.ttl if ttl is None else ttl
        self.check_expiry(answer["expires_at"], ttl, (wall, time.time()), call)

    def do_wait(self, before: bool) -> None:
        """Sleep to just before the earliest expiry of the leases held, or past the
        last one (each lease held goes stale at once: what stale holders need)."""
        held = [lease for lease in self.model.leases if not (lease.ended or lease.superseded)]
        if before:
            ends = [lease.lo for lease in held if math.isfinite(lease.lo)]
            target = min(ends, default=-math.inf) - WAIT_GAP
        else:
            ends = [lease.hi if math.isfinite(lease.hi) else lease.nominal for lease in held]
            target = max(ends, default=-math.inf) + WAIT_GAP
        pause = target - time.monotonic()
        if pause > 0:
            time.sleep(pause)
            where = "just before the first" if before else "past every"
            self.note(time.monotonic(), f"{pause:.2f} s pass, to {where} expiry of a held lease")

    def do_close(self, slot: int) -> None:
        """``close()``: every lease of the locker ends, cleanly."""
        answer, t0, t1 = self.ask(slot, "close")
        self.raised(answer, f"L{slot}.close()")
        self.note(t1, f"L{slot}.close() (a new locker takes its place)")
        for lease in self.model.leases:
            if lease.slot == slot:
                self.model.released(lease, t0, t1, True)

    def do_locks(self, slot: int) -> None:
        """``locks()`` lists every name surely held, and no name surely free."""
        answer, t0, t1 = self.ask(slot, "locks")
        call = f"L{slot}.locks()"
        self.raised(answer, call)
        by_key = {key: name for name, key in self.keys.items()}
        listed: set[int] = set()
        for info_name, info_key in answer["locks"]:
            if info_name in self.names:
                listed.add(self.names.index(info_name))
            elif info_name is None and info_key in by_key:
                listed.add(by_key[info_key])
        self.note(t1, f"{call} -> {sorted(self.n(name) for name in listed)}")
        for name in range(NAMES):
            may = self.model.listing(name, t0, t1)
            if (name in listed) not in may:
                holder = self.model.current(name)
                if name in listed:
                    self.fail(f"{call} lists {self.n(name)}, which no lease holds")
                assert holder is not None
                self.fail(f"{call} does not list {self.n(name)}, which {holder.label} holds")


def _budget(h: Harness) -> Budget:
    if not h.has(Capability.TTL):
        return SESSION_BUDGET
    return RENEWAL_BUDGET if h.has(Capability.RENEWAL) else EXPIRING_BUDGET


async def model_checked_history(h: Harness) -> None:
    """Random histories over three lockers (two in other processes, with CROSS_PROCESS)
    agree with the reference model at every step; a failure shrinks to a minimal one."""
    remote = h.has(Capability.CROSS_PROCESS)
    drivers: list[_Driver] = [_Local(h)] + [
        _Remote(h) if remote else _Local(h) for _ in range(LOCKERS - 1)
    ]
    try:
        await asyncio.gather(*(driver.start() for driver in drivers))
        run = _Run(h, drivers, _budget(h))
        machine = _machine(run)
        config = settings(
            max_examples=BATCH,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.generate, Phase.shrink),
            print_blob=False,
            report_multiple_bugs=False,
        )
        while run.more():
            await in_thread(_runner(run, machine, config))
    finally:
        await asyncio.gather(*(driver.stop() for driver in drivers))


def _runner(run: _Run, machine: type[_History], config: settings) -> Callable[[], None]:
    """One batch of histories; a failure is shrunk further and reported."""

    def go() -> None:
        try:
            run_state_machine_as_test(machine, settings=config)
        except Exception:
            if run.smallest is None:
                raise
            # Whatever hypothesis ended with -- the failure, _Stop, or Flaky where a
            # failure depends on timing -- the shortest failing history it ran is
            # shrunk on here, and reported.
            steps, message = _minimize(run, machine, *run.smallest)
            raise AssertionError(
                f"{message}\n\n(a history of {len(steps)} steps: hypothesis shrank it, then"
                " each step was left out in turn, and kept where the failure went away)"
            ) from None

    return go


def _minimize(
    run: _Run, machine: type[_History], steps: list[Step], message: str
) -> tuple[list[Step], str]:
    """Leave each step out in turn, last first; keep it out if the history still fails.

    Hypothesis's shrinker works within a time budget, and every try that keeps a
    time-passing step costs a ttl of wall time: this pass, one try per step, ends
    with a history from which no step can be left out.
    """
    deadline = time.monotonic() + MINIMIZE_SECONDS
    run.replaying = True
    try:
        index = len(steps) - 1
        while index >= 0 and time.monotonic() < deadline:
            candidate = steps[:index] + steps[index + 1 :]
            failure = _replay(machine, candidate)
            if failure is not None:
                steps, message = candidate, failure
            index -= 1
    finally:
        run.replaying = False
    return steps, message


def _replay(machine: type[_History], steps: list[Step]) -> str | None:
    """Run ``steps`` as a history of their own: the failure's report, or ``None``."""
    history = machine()  # type: ignore[call-arg]  # the rules' subclass takes no argument
    try:
        for rule, args in steps:
            getattr(history, rule)(**args)
            history.check_states()
    except AssertionError as exc:
        return str(exc)
    finally:
        history.finish()
    return None
