"""``multilock.leadership``: leader election as an API, async and sync, on memory://,
file://, PostgreSQL, Redis and ZooKeeper; several processes on file:// and PostgreSQL.

Two or three contenders: one leader at a time (the callbacks keep a record that
counts overlaps), a leader leaving its block hands over within a bound, a broken
lease revokes at once and the campaign goes on, each callback is called once a term.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

import multilock
from multilock._locks import registry
from multilock._locks.registry import backend_for
from multilock._url import LockURL
from multilock.abc import Capability
from multilock.errors import ConfigurationError, InvalidLockName
from multilock.testing import apoll, poll

BACKENDS = ("memory", "file", "postgres", "redis", "zookeeper")
POLL = 0.1
JITTER = 0.05
TTL = 3.0  # short: a TTL backend notices a broken lease when it next renews (ttl / 3)
TAKEOVER = 3.0  # a poll and a round trip, with room for a loaded machine
LOST = 10.0 + 1.0  # the conformance suite's bound on a lost signal, and its slack
REPLICA = Path(__file__).resolve().parent / "leadership_replica.py"


def _flawed_backends() -> Any:
    """tests/flawed_backends.py, loaded from its path (tests/ is no package)."""
    path = Path(__file__).with_name("flawed_backends.py")
    spec = importlib.util.spec_from_file_location("flawed_backends", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest) -> str:
    """A reachable URL of each backend (skipped, or failed when required, if down)."""
    value: str = request.getfixturevalue(f"{request.param}_url")
    return value


def name() -> str:
    return f"leader-{uuid.uuid4().hex[:10]}"


class Terms:
    """What the callbacks saw: each contender's elections and revocations, and how
    many contenders were leading at once at worst."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.inside: set[str] = set()
        self.most = 0
        self.elected: list[str] = []
        self.revoked: list[str] = []

    def callbacks(self, who: str) -> tuple[Callable[[], object], Callable[[], object]]:
        """``on_elected`` and ``on_revoked`` for the contender ``who``."""

        def elected() -> None:
            with self.guard:
                self.inside.add(who)
                self.most = max(self.most, len(self.inside))
                self.elected.append(who)

        def revoked() -> None:
            with self.guard:
                self.inside.discard(who)
                self.revoked.append(who)

        return elected, revoked


@contextlib.asynccontextmanager
async def contenders(
    url: str, lock: str, terms: Terms, count: int
) -> AsyncIterator[list[multilock.AsyncLeadership]]:
    """``count`` leaderships on ``lock``, each on a locker of its own, entered."""
    async with contextlib.AsyncExitStack() as stack:
        leads = []
        for who in range(count):
            locker = await stack.enter_async_context(multilock.connect_async(url))
            elected, revoked = terms.callbacks(f"c{who}")
            lead = multilock.leadership(
                locker,
                lock,
                ttl=TTL,
                poll=POLL,
                jitter=JITTER,
                on_elected=elected,
                on_revoked=revoked,
            )
            leads.append(lead)
        for lead in leads:
            await stack.enter_async_context(lead)
        yield leads


async def the_leader(leads: list[multilock.AsyncLeadership], within: float) -> int:
    """The index of the one contender leading, once one does; fails if two do."""

    async def probe() -> int | None:
        leading = [index for index, lead in enumerate(leads) if lead.is_leader]
        assert len(leading) <= 1, f"{leading} lead at once"
        return leading[0] + 1 if leading else None  # 0 is falsy: shifted by one

    return await apoll("a leader", probe, within) - 1


# --- async, every backend --------------------------------------------------------------------


def test_one_leader_at_a_time_and_a_leaving_leader_hands_over(url: str) -> None:
    terms, lock = Terms(), name()

    async def scenario() -> None:
        async with contenders(url, lock, terms, 3) as leads:
            first = await the_leader(leads, TAKEOVER)
            assert leads[first].elected.is_set()
            assert not leads[first].revoked.is_set()
            lease = leads[first].lease
            assert lease is not None
            assert lease.held
            # A while of polls by the followers: still one leader, the same.
            ends = time.monotonic() + 5 * POLL
            while time.monotonic() < ends:
                assert await the_leader(leads, TAKEOVER) == first
                await asyncio.sleep(POLL / 4)
            left = time.monotonic()
            await leads[first].__aexit__(None, None, None)
            assert not leads[first].is_leader
            assert leads[first].revoked.reason == "the leadership block ended"
            assert leads[first].lease is None
            second = await the_leader(leads, TAKEOVER)
            assert second != first
            took = time.monotonic() - left
            assert took < TAKEOVER
            await leads[second].__aexit__(None, None, None)
            third = await the_leader(leads, TAKEOVER)
            assert third not in (first, second)

    asyncio.run(scenario())
    assert terms.most == 1
    assert sorted(terms.elected) == ["c0", "c1", "c2"]
    assert terms.elected == terms.revoked  # each revoked once, in the order elected


@pytest.mark.parametrize("backend", ["memory", "file", "postgres", "redis", "zookeeper"])
def test_a_release_wakes_the_standby_where_the_backend_announces_it(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """With a poll of 5 s, only the release's announcement can elect the standby
    within a second of the leader leaving."""
    url: str = request.getfixturevalue(f"{backend}_url")
    lock, slow = name(), 5.0

    async def scenario() -> float:
        async with (
            multilock.connect_async(url) as a,
            multilock.connect_async(url) as b,
            multilock.leadership(a, lock, poll=slow, jitter=0) as leader,
        ):
            await leader.elected
            refusals = _refusals(b)
            async with multilock.leadership(b, lock, poll=slow, jitter=0) as standby:
                await apoll("the standby refused, now waiting", refusals, 10)
                left = time.monotonic()
                await leader.__aexit__(None, None, None)
                async with asyncio.timeout(slow / 2):
                    await standby.elected
                return time.monotonic() - left

    assert asyncio.run(scenario()) < 1.0


def _refusals(locker: multilock.AsyncDistributedLock) -> Callable[[], Awaitable[int]]:
    """Wraps ``locker.try_acquire``: the count of its refusals so far, to poll."""
    refused = 0
    tries = locker.try_acquire

    async def counted(name: str, *, ttl: Any = None) -> Any:
        nonlocal refused
        lease = await tries(name, ttl=ttl)
        refused += lease is None
        return lease

    async def count() -> int:
        return refused

    locker.try_acquire = counted  # type: ignore[method-assign]
    return count


def test_a_broken_lease_revokes_at_once_and_the_campaign_goes_on(url: str) -> None:
    """Lost on the backend (its conformance hook, where it has one; a closed locker on
    file://): ``is_leader`` false, ``revoked`` fired, the term's task cancelled, then
    ``on_revoked``; with the backend back, this replica is elected again."""
    events: list[str] = []
    lock = name()

    async def term() -> None:
        events.append("work")
        try:
            await asyncio.Event().wait()
        finally:
            events.append("work stopped")

    async def scenario() -> None:
        parsed = LockURL.parse(url)
        async with multilock.connect_async(url) as locker:
            breaks = Capability.LOST_SIGNAL in locker.capabilities
            lead = multilock.leadership(
                locker,
                lock,
                ttl=TTL,
                poll=POLL,
                jitter=JITTER,
                on_elected=term,
                on_revoked=lambda: events.append("revoked"),
            )
            async with lead:
                async with asyncio.timeout(TAKEOVER):
                    await lead.elected
                revoked = lead.revoked
                lease = lead.lease
                assert lease is not None
                hooks = backend_for(parsed.scheme).conformance
                assert hooks is not None
                if breaks:
                    await asyncio.to_thread(hooks.break_lease, parsed, locker, lease)
                else:  # a flock cannot be taken from its holder: its locker goes
                    await locker.aclose()
                async with asyncio.timeout(LOST):
                    reason = await revoked
                assert reason
                assert not lead.is_leader
                await apoll("on_revoked", lambda: asyncio.sleep(0, "revoked" in events), TAKEOVER)
                assert events == ["work", "work stopped", "revoked"]
                if breaks:  # the campaign goes on: elected again
                    async with asyncio.timeout(LOST):
                        await lead.elected
                    assert lead.lease is not None  # leading again
                    assert events == ["work", "work stopped", "revoked", "work"]

    asyncio.run(scenario())


def test_an_extend_refused_revokes_where_the_backend_has_no_lost_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A TTL backend that neither renews nor fires ``lost`` (``sound://`` of
    tests/flawed_backends.py): the campaign extends the lease every ttl / 3, and the
    first extend the backend refuses (the lease expired unnoticed, another took it)
    revokes the leader."""
    sound = _flawed_backends().FlawedBackend("sound")
    monkeypatch.setitem(registry._registered, "leadersound", sound)
    url, lock, ttl = f"leadersound://tests/{uuid.uuid4().hex[:8]}", name(), 0.6

    async def scenario() -> None:
        async with (
            multilock.connect_async(url) as a,
            multilock.connect_async(url) as b,
            multilock.leadership(a, lock, ttl=ttl, poll=POLL, jitter=0) as lead,
        ):
            await lead.elected
            lease = lead.lease
            assert lease is not None
            await asyncio.sleep(3 * ttl)  # past its ttl: kept by the extends
            assert lead.lease is lease
            assert await b.try_acquire(lock) is None
            cast(Any, a).table.drop(lock, lease.token, blind=True)  # expired unnoticed
            taken = await b.try_acquire(lock, ttl=30)
            assert taken is not None
            async with asyncio.timeout(TAKEOVER):
                reason = await lead.revoked
            assert "refused" in reason
            assert not lead.is_leader
            await taken.release()

    asyncio.run(scenario())


def test_the_fencing_token_grows_from_term_to_term(url: str) -> None:
    lock = name()

    async def scenario() -> list[int | None]:
        tokens = []
        async with multilock.connect_async(url) as locker:
            if Capability.FENCING not in locker.capabilities:
                pytest.skip("the backend has no fencing tokens (as configured)")
            for _ in range(2):
                async with multilock.leadership(locker, lock, poll=POLL) as lead:
                    await lead.elected
                    assert lead.lease is not None
                    tokens.append(lead.lease.fencing_token)
        return tokens

    first, second = asyncio.run(scenario())
    assert first is not None
    assert second is not None
    assert second > first


def test_leaving_while_cancelled_still_releases(memory_url: str) -> None:
    lock = name()

    async def scenario() -> None:
        async with multilock.connect_async(memory_url) as locker:
            lead = multilock.leadership(locker, lock, poll=POLL)

            async def leads_forever() -> None:
                async with lead:
                    await lead.elected
                    await asyncio.Event().wait()

            task = asyncio.create_task(leads_forever())
            await apoll("elected", lambda: asyncio.sleep(0, lead.is_leader), TAKEOVER)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not lead.is_leader
            assert await locker.try_acquire(lock) is not None

    asyncio.run(scenario())


def test_a_follower_leaves_without_being_elected(memory_url: str) -> None:
    lock, terms = name(), Terms()

    async def scenario() -> None:
        async with contenders(memory_url, lock, terms, 2) as leads:
            leader = await the_leader(leads, TAKEOVER)
            follower = leads[1 - leader]
            assert follower.revoked.is_set()
            assert not follower.elected.is_set()
            await follower.__aexit__(None, None, None)
            assert leads[leader].is_leader

    asyncio.run(scenario())
    assert len(terms.elected) == 1


def test_async_callbacks_are_awaited(memory_url: str) -> None:
    events: list[str] = []

    async def revoked() -> None:
        await asyncio.sleep(0.05)
        events.append("revoked")

    async def scenario() -> None:
        async with multilock.connect_async(memory_url) as locker:
            async with multilock.leadership(locker, name(), on_revoked=revoked) as lead:
                await lead.elected
            events.append("left")

    asyncio.run(scenario())
    assert events == ["revoked", "left"]


def test_a_failing_callback_is_logged_and_the_term_goes_on(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def elected() -> None:
        raise RuntimeError("bug in on_elected")

    async def scenario() -> None:
        async with (
            multilock.connect_async(memory_url) as locker,
            multilock.leadership(locker, name(), on_elected=elected) as lead,
        ):
            await lead.elected
            await asyncio.sleep(3 * POLL)
            assert lead.is_leader

    with caplog.at_level("ERROR", logger="multilock.leadership"):
        asyncio.run(scenario())
    assert any("on_elected failed" in r.getMessage() for r in caplog.records)


def test_a_closed_locker_revokes_and_its_failing_polls_are_logged_once(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        locker = multilock.connect_async(memory_url)
        async with multilock.leadership(locker, name(), poll=POLL, jitter=0) as lead:
            await lead.elected
            await locker.aclose()
            async with asyncio.timeout(TAKEOVER):
                assert "released underneath" in await lead.revoked
            await asyncio.sleep(5 * POLL)  # five polls, each refused: the locker is closed

    with caplog.at_level("WARNING", logger="multilock.leadership"):
        asyncio.run(scenario())
    failed = [r for r in caplog.records if "could not be asked" in r.getMessage()]
    assert len(failed) == 1


def test_waiting_to_be_elected_is_bounded_with_asyncio_timeout(memory_url: str) -> None:
    """A standby that gives up leaves the block: its campaign stops, the leader leads on."""
    lock, terms = name(), Terms()

    async def scenario() -> None:
        async with contenders(memory_url, lock, terms, 1) as (leader,):
            await leader.elected
            async with multilock.connect_async(memory_url) as locker:
                standby = multilock.leadership(locker, lock, poll=POLL)

                async def give_up() -> None:
                    async with standby, asyncio.timeout(3 * POLL):
                        await standby.elected

                with pytest.raises(TimeoutError):
                    await give_up()
                assert not standby.is_leader
            assert leader.is_leader

    asyncio.run(scenario())


def test_options_are_checked_at_once(memory_url: str) -> None:
    async def scenario() -> None:
        async with multilock.connect_async(memory_url) as locker:
            with pytest.raises(ConfigurationError):
                multilock.leadership(locker, "x", poll=0)
            with pytest.raises(InvalidLockName):
                multilock.leadership(locker, "x" * 70_000)
            lead = multilock.leadership(locker, name())
            async with lead:
                with pytest.raises(RuntimeError, match="already entered"):
                    await lead.__aenter__()

    asyncio.run(scenario())


# --- sync ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "file", "postgres"])
def test_the_sync_form_campaigns_on_a_thread(backend: str, request: pytest.FixtureRequest) -> None:
    url: str = request.getfixturevalue(f"{backend}_url")
    terms, lock = Terms(), name()
    with multilock.connect(url) as a, multilock.connect(url) as b:
        (a_elected, a_revoked), (b_elected, b_revoked) = terms.callbacks("a"), terms.callbacks("b")
        first = multilock.leadership(
            a, lock, poll=POLL, jitter=JITTER, on_elected=a_elected, on_revoked=a_revoked
        )
        second = multilock.leadership(
            b, lock, poll=POLL, jitter=JITTER, on_elected=b_elected, on_revoked=b_revoked
        )
        assert isinstance(first, multilock.Leadership)
        with first:
            assert first.elected.wait(TAKEOVER)
            with second:
                time.sleep(5 * POLL)
                assert first.is_leader
                assert not second.is_leader
                left = time.monotonic()
                first.__exit__(None, None, None)
                assert first.revoked.is_set()
                assert second.elected.wait(TAKEOVER)
                assert time.monotonic() - left < TAKEOVER
                lease = second.lease
                assert lease is not None
                assert lease.held
        assert not second.is_leader
    assert terms.elected == terms.revoked == ["a", "b"]
    assert terms.most == 1


def test_the_sync_form_is_revoked_when_its_lease_breaks(memory_url: str) -> None:
    lock, terms = name(), Terms()
    elected, revoked = terms.callbacks("a")
    with (
        multilock.connect(memory_url) as locker,
        multilock.leadership(
            locker, lock, poll=POLL, jitter=JITTER, on_elected=elected, on_revoked=revoked
        ) as lead,
    ):
        assert lead.elected.wait(TAKEOVER)
        ended = lead.revoked
        locker.revoke(lock, "taken away")  # type: ignore[attr-defined]
        assert not lead.is_leader  # at once: the backend's own notice
        assert ended.wait(TAKEOVER)
        assert ended.reason == "taken away"
        poll("on_revoked", lambda: terms.revoked, TAKEOVER)
        assert lead.elected.wait(TAKEOVER)  # and elected again
    assert terms.elected == terms.revoked == ["a", "a"]


# --- processes -------------------------------------------------------------------------------


def _replicas(url: str, lock: str, record: Path, count: int, lead_for: float) -> list[Any]:
    replicas = []
    for _ in range(count):
        process = subprocess.Popen(
            [sys.executable, str(REPLICA), lock, str(record), str(lead_for)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(url + "\n")
        process.stdin.close()
        replicas.append(process)
    for process in replicas:
        out = process.stdout
        assert out is not None
        assert out.readline().strip() == "ready"
        out.close()  # nothing more is printed
    return replicas


def _terms(record: Path) -> list[tuple[int, str, float]]:
    if not record.exists():
        return []
    rows = [line.split() for line in record.read_text().splitlines()]
    return [(int(pid), what, float(when)) for pid, what, when in rows]


def _no_overlap(rows: list[tuple[int, str, float]], ended: dict[int, float]) -> None:
    """Terms, from each ``elected`` to its ``revoked`` (or the kill in ``ended``), are
    disjoint: one leader at a time."""
    spans = []
    for pid, what, when in rows:
        if what == "elected":
            end = next(
                (w for p, x, w in rows if p == pid and x == "revoked" and w >= when),
                ended.get(pid, float("inf")),
            )
            spans.append((when, end, pid))
    spans.sort()
    for (_, end, pid), (start, _, other) in itertools.pairwise(spans):
        assert end <= start, f"{pid} still led when {other} was elected"


@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_processes_take_turns(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Three processes: each, once elected, leads 0.3 s and leaves; the next takes over
    within the bound, never while another leads."""
    url: str = request.getfixturevalue(f"{backend}_url")
    record = tmp_path / "terms"
    replicas = _replicas(url, name(), record, 3, 0.3)
    for process in replicas:
        assert process.wait(timeout=60) == 0
    rows = _terms(record)
    assert sorted(what for _, what, _ in rows) == ["elected"] * 3 + ["revoked"] * 3
    assert len({pid for pid, _, _ in rows}) == 3
    _no_overlap(rows, {})
    revokes = sorted(when for _, what, when in rows if what == "revoked")
    elects = sorted(when for _, what, when in rows if what == "elected")
    for handed, took in zip(revokes, elects[1:], strict=False):
        assert took - handed < TAKEOVER


@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_a_killed_leader_is_replaced(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """SIGKILL the leader: its session (connection, flock) ends with it, and another
    process is elected within the bound."""
    url: str = request.getfixturevalue(f"{backend}_url")
    record = tmp_path / "terms"
    replicas = _replicas(url, name(), record, 2, 3600)
    try:
        first = poll("a leader", lambda: [r for r in _terms(record) if r[1] == "elected"], 10)
        leader = next(p for p in replicas if p.pid == first[0][0])
        killed = time.time()
        leader.send_signal(signal.SIGKILL)
        leader.wait(timeout=10)

        def two_terms() -> list[tuple[int, str, float]] | None:
            rows = _terms(record)
            return rows if [what for _, what, _ in rows].count("elected") == 2 else None

        rows = poll("a second leader", two_terms, 10)
        took = rows[-1][2] - killed
        assert rows[-1][0] != leader.pid
        assert took < TAKEOVER
        _no_overlap(rows, {leader.pid: killed})
    finally:
        for process in replicas:
            process.kill()
            process.wait(timeout=10)
