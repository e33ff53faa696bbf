"""A run's life, one tick of one job from due to done: its states, the legal moves between
them (:data:`TRANSITIONS`, the one table) and their one owner, :class:`RunLifecycle`.

The scheduler decides a tick (``due`` → ``acquiring`` → ``running``, or ``skipped``,
``missed``, ``failed``, ``abandoned``); the :class:`~multilock._scheduling.runs.Run`
watching the body ends it (``running`` → ``holding`` → ``releasing`` → ``done``, the body
cut short as ``lost`` or ``timed_out``). Both move it only through the lifecycle's
methods, and a move the table does not allow raises :class:`IllegalTransition`: a
scheduler bug, never a job's. docs/scheduler.md ("A run's life") draws the table.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .jobs import Job

if TYPE_CHECKING:
    from .runs import Run

__all__ = [
    "BODY_STATES",
    "TRANSITIONS",
    "IllegalTransition",
    "JobState",
    "RunLifecycle",
    "RunState",
    "Transition",
    "record_transitions",
]


class RunState(enum.Enum):
    """Where one tick of one job is in its life."""

    DUE = "due"
    """Its fire time has come; nothing decided yet (it may wait for the job's previous run)."""
    ACQUIRING = "acquiring"
    """Its job's lock is asked for."""
    RUNNING = "running"
    """Its body runs (or waits for a worker thread), under its lease if it has one."""
    LOST = "lost"
    """Its lease (or the leadership) was lost while the body ran: the body is being stopped."""
    TIMED_OUT = "timed_out"
    """Its body ran past the job's timeout: it is being stopped."""
    HOLDING = "holding"
    """The body is over; the lease is kept until the hold ends (or the next tick takes it)."""
    RELEASING = "releasing"
    """The lease is being released."""
    DONE = "done"
    """The run is over: body, hold and release (or its lease was handed to the next tick)."""
    SKIPPED = "skipped"
    """Not run: another replica holds the lock, this one is not the leader, or the job's
    previous run in this process still runs."""
    MISSED = "missed"
    """Not run: too late (past the grace, coalesced, or the lock granted late), or the
    backend did not answer."""
    FAILED = "failed"
    """Not run: the lock call failed (refused input, or a backend's bug)."""
    ABANDONED = "abandoned"
    """Not run: the scheduler stopped before the tick could start."""

    # Hashed on every transition of every run: by identity, in C (an Enum's own hash
    # hashes its name in Python, twice as slow).
    __hash__ = object.__hash__


_S = RunState
# The members as module globals: the transitions read them on every run, and reading
# one off the class costs several times more.
_ACQUIRING, _RUNNING, _SKIPPED, _MISSED, _FAILED, _ABANDONED = (
    _S.ACQUIRING,
    _S.RUNNING,
    _S.SKIPPED,
    _S.MISSED,
    _S.FAILED,
    _S.ABANDONED,
)
_DUE, _LOST, _TIMED_OUT, _HOLDING, _RELEASING, _DONE = (
    _S.DUE,
    _S.LOST,
    _S.TIMED_OUT,
    _S.HOLDING,
    _S.RELEASING,
    _S.DONE,
)

TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    _S.DUE: frozenset({_S.ACQUIRING, _S.RUNNING, _S.SKIPPED, _S.MISSED, _S.ABANDONED}),
    _S.ACQUIRING: frozenset({_S.RUNNING, _S.SKIPPED, _S.MISSED, _S.FAILED, _S.ABANDONED}),
    # To done at once: a run with no lease of its own (a local job, leader mode), or
    # shutdown past its stop timeout.
    _S.RUNNING: frozenset({_S.LOST, _S.TIMED_OUT, _S.HOLDING, _S.RELEASING, _S.DONE}),
    _S.LOST: frozenset({_S.RELEASING, _S.DONE}),  # no hold: the lease is gone
    _S.TIMED_OUT: frozenset({_S.HOLDING, _S.RELEASING, _S.DONE}),
    _S.HOLDING: frozenset({_S.RELEASING, _S.DONE}),  # done: the next tick took the lease
    _S.RELEASING: frozenset({_S.DONE}),
    _S.DONE: frozenset(),
    _S.SKIPPED: frozenset(),
    _S.MISSED: frozenset(),
    _S.FAILED: frozenset(),
    _S.ABANDONED: frozenset(),
}
"""Every legal transition: a state's set of next states (empty: the life is over)."""

BODY_STATES: frozenset[RunState] = frozenset(
    {_S.DUE, _S.ACQUIRING, _S.RUNNING, _S.LOST, _S.TIMED_OUT}
)
"""The states of a tick whose body is still to come or still runs (a tick its job has
claimed): what a job's ``overlap`` is about."""


class IllegalTransition(RuntimeError):
    """A run was moved where :data:`TRANSITIONS` does not allow: a scheduler bug."""

    def __init__(self, job: str, fire: datetime, before: RunState, after: RunState) -> None:
        super().__init__(
            f"run of job {job!r} at {fire.isoformat()}: illegal transition"
            f" {before.value} -> {after.value}"
        )
        self.before, self.after = before, after


class JobState(Protocol):
    """What a run tells its job's state (the scheduler's ``_JobState``, which derives
    whether the job runs, is busy or holds a lease from its current tick's state)."""

    def notify(self) -> None:
        """Wake whoever waits for the state to change."""

    def settle(self, tick: RunLifecycle[Any] | None = None) -> None:
        """``tick``'s run is over and its lease released: the job is free again."""


S = TypeVar("S", bound=JobState, covariant=True)


@dataclass(frozen=True, slots=True)
class Transition:
    """One move of one run, as :func:`record_transitions` sees it; ``legal`` is
    ``False`` for a move refused (:class:`IllegalTransition` raised, maybe in a loop
    callback where only the loop's exception handler would see it)."""

    job: str
    fire: datetime
    before: RunState
    after: RunState
    legal: bool = True


_recorders: list[list[Transition]] = []  # of every move
_refusals: list[list[Transition]] = []  # of the moves refused only


@contextmanager
def record_transitions(*, refused_only: bool = False) -> Iterator[list[Transition]]:
    """Record every run's transitions (of every scheduler in the process), and every
    move refused, while inside: what tests read to check a run's path. ``refused_only``
    records the refused moves alone, at no cost to the others (the simulation)."""
    seen: list[Transition] = []
    into = _refusals if refused_only else _recorders
    into.append(seen)
    try:
        yield seen
    finally:
        into.remove(seen)


class RunLifecycle(Generic[S]):
    """One tick of one job (``job`` at ``fire``, ``job_state`` its job's state in this
    process) and the one owner of its :class:`RunState`: each transition is a method,
    named after the state it moves to, and raises :class:`IllegalTransition` where the
    table forbids it. ``run`` is the :class:`~multilock._scheduling.runs.Run` watching
    its body, from the body's start until the life is over (``finish`` drops it).
    ``at`` is ``fire`` in seconds since the epoch (given, or computed once: a run reads
    it several times, and ``datetime.timestamp()`` is not free)."""

    __slots__ = ("at", "fire", "job", "job_state", "run", "state")

    def __init__(self, job: Job, fire: datetime, job_state: S, at: float | None = None) -> None:
        self.job, self.fire, self.job_state = job, fire, job_state
        self.at = fire.timestamp() if at is None else at
        self.state = _DUE
        self.run: Run | None = None

    def __repr__(self) -> str:
        return f"<RunLifecycle {self.job.name} {self.fire.isoformat()} {self.state.value}>"

    def _move(self, after: RunState) -> None:
        before = self.state
        if after in TRANSITIONS[before]:
            self.state = after
            if _recorders:
                move = Transition(self.job.name, self.fire, before, after)
                for seen in _recorders:
                    seen.append(move)
            return
        refused = Transition(self.job.name, self.fire, before, after, legal=False)
        for seen in (*_recorders, *_refusals):
            seen.append(refused)
        raise IllegalTransition(self.job.name, self.fire, before, after)

    @property
    def over(self) -> bool:
        """Whether the life is over (a state with no way out)."""
        return not TRANSITIONS[self.state]

    # The scheduler's decisions about the tick.

    def acquire(self) -> None:
        """The job's lock is asked for."""
        self._move(_ACQUIRING)

    def start(self) -> None:
        """The body starts: its lock was granted, it needs none, or it runs under the
        leader lease or the lease the previous tick still held."""
        self._move(_RUNNING)

    def skip(self) -> None:
        """Not run: held elsewhere, not the leader, or the previous run still runs."""
        self._move(_SKIPPED)

    def miss(self) -> None:
        """Not run: too late, or the backend did not answer."""
        self._move(_MISSED)

    def fail(self) -> None:
        """Not run: the lock call failed."""
        self._move(_FAILED)

    def abandon(self) -> None:
        """Not run: the scheduler is stopping."""
        self._move(_ABANDONED)

    # The run's, once its body started.

    def lose(self) -> None:
        """The lease was lost under the body: it is being stopped."""
        self._move(_LOST)

    def time_out(self) -> None:
        """The body ran past its timeout: it is being stopped."""
        self._move(_TIMED_OUT)

    def hold(self) -> None:
        """The body is over; its lease is kept until the hold ends."""
        self._move(_HOLDING)

    def release(self) -> None:
        """The lease is being released."""
        self._move(_RELEASING)

    def finish(self) -> None:
        """The run is over (its :class:`Run` is let go: no cycle outlives it)."""
        self._move(_DONE)
        self.run = None
