"""Triggers: identical fire times on every replica, the DST policy, early errors."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from multilock import ManualClock, Scheduler, cron, daily, every, monthly, once, weekly
from multilock.errors import ConfigurationError

KYIV = ZoneInfo("Europe/Kyiv")
UTC_ZONE = ZoneInfo("UTC")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fires(trigger: object, after: datetime, count: int, tz: ZoneInfo = KYIV) -> list[datetime]:
    """The next ``count`` fire times of ``trigger`` after ``after``."""
    found = []
    for _ in range(count):
        nxt = trigger.next_fire(after, tz, "seed")  # type: ignore[attr-defined]
        assert nxt is not None
        found.append(nxt)
        after = nxt
    return found


# --- interval ---------------------------------------------------------------------------


def test_every_is_anchored_to_the_epoch() -> None:
    """Two replicas asking at different moments get the same ticks."""
    trigger = every(seconds=7)
    a = fires(trigger, utc(2026, 5, 1, 12, 0, 0), 3, UTC_ZONE)
    b = fires(trigger, a[0] - timedelta(seconds=3.5), 3, UTC_ZONE)
    assert a == b
    assert all(int(f.timestamp()) % 7 == 0 for f in a)
    assert fires(trigger, a[0], 1, UTC_ZONE) == [a[1]]  # strictly after


def test_every_with_start_anchor_and_units() -> None:
    start = utc(2026, 1, 1, 0, 0, 10)
    trigger = every(minutes=1, seconds=30, start=start)
    assert fires(trigger, utc(2025, 12, 31), 2, UTC_ZONE) == [start, start + timedelta(seconds=90)]
    assert every("5m").interval == timedelta(minutes=5)


def test_every_answers_alike_whatever_it_was_asked_before() -> None:
    """The shortcut for the tick after the last one answered gives what a fresh trigger
    computes: asked in any order, with instants in other zones, on and off the grid."""
    start = datetime(2026, 1, 1, 0, 0, 0, 437000, tzinfo=UTC)
    used = every(milliseconds=1500, start=start)
    queries = [start + timedelta(microseconds=us) for us in (0, 1, 1_499_999, 1_500_000)]
    queries += [start - timedelta(days=3), start + timedelta(days=400, microseconds=7)]
    for after in queries + [q.astimezone(KYIV) for q in queries]:
        for step in range(6):  # each after the last answer (the shortcut), in UTC or Kyiv
            asked = after.astimezone(KYIV) if step % 2 else after
            nxt = used.next_fire(asked, KYIV, "seed")
            fresh = every(milliseconds=1500, start=start).next_fire(asked, KYIV, "seed")
            assert nxt == fresh
            assert nxt is not None
            assert nxt.utcoffset() == timedelta(0)  # in UTC, as computed
            after = nxt


def test_every_ignores_dst() -> None:
    """Interval ticks are absolute: an hourly interval keeps 1 h gaps through both switches."""
    for day in (utc(2026, 3, 28, 22), utc(2026, 10, 24, 22)):
        times = fires(every(hours=1), day, 6)
        assert {b - a for a, b in itertools.pairwise(times)} == {timedelta(hours=1)}


def test_jitter_is_deterministic_per_job_and_bounded() -> None:
    trigger = every(minutes=5, jitter="30s")
    after = utc(2026, 5, 1)
    one = [trigger.next_fire(t, UTC_ZONE, "job-a") for t in (after, after)]
    assert one[0] == one[1]
    other = trigger.next_fire(after, UTC_ZONE, "job-b")
    ticks = fires(trigger, after, 20, UTC_ZONE)
    for tick in ticks:
        base = tick.replace(second=0, microsecond=0)
        base -= timedelta(minutes=base.minute % 5)
        assert timedelta(0) <= tick - base < timedelta(seconds=30)
    assert len({t - t.replace(second=0, microsecond=0) for t in ticks}) > 1  # it does vary
    assert other is not None


# --- cron and calendar triggers -----------------------------------------------------------


def test_cron_five_and_six_fields() -> None:
    assert fires(cron("0 3 * * *"), utc(2026, 6, 1), 2, UTC_ZONE) == [
        utc(2026, 6, 1, 3),
        utc(2026, 6, 2, 3),
    ]
    every_ten = fires(cron("*/10 * * * * *", seconds=True), utc(2026, 6, 1, 0, 0, 1), 3, UTC_ZONE)
    assert every_ten == [
        utc(2026, 6, 1, 0, 0, 10),
        utc(2026, 6, 1, 0, 0, 20),
        utc(2026, 6, 1, 0, 0, 30),
    ]


@pytest.mark.parametrize(
    ("alias", "expression"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
    ],
)
def test_cron_aliases_fire_as_their_expressions(alias: str, expression: str) -> None:
    after = utc(2026, 3, 28, 12, 34)
    assert fires(cron(alias), after, 3) == fires(cron(expression), after, 3)
    assert fires(cron(alias.upper()), after, 1) == fires(cron(expression), after, 1)
    with_seconds = cron(alias, seconds=True)
    assert fires(with_seconds, after, 3) == fires(cron(expression), after, 3)


def test_every_takes_milliseconds() -> None:
    trigger = every(milliseconds=250, seconds=1)
    assert trigger.interval == timedelta(milliseconds=1250)
    # Anchored at the epoch: 2026-06-01T00:00Z is a whole number of 1.25 s ticks after it.
    assert fires(trigger, utc(2026, 6, 1), 2, UTC_ZONE) == [
        utc(2026, 6, 1) + timedelta(milliseconds=1250),
        utc(2026, 6, 1) + timedelta(milliseconds=2500),
    ]


def test_cron_reads_the_timezone() -> None:
    assert fires(cron("0 3 * * *"), utc(2026, 5, 31, 12), 1) == [utc(2026, 6, 1, 0)]  # 03:00 EEST


def test_dst_gap_runs_once_at_the_end_of_the_gap() -> None:
    """29 March 2026, Kyiv: 03:00 -> 04:00. 03:30 does not exist: it runs at 04:00 (01:00 UTC)."""
    assert fires(cron("30 3 * * *"), utc(2026, 3, 28, 12), 2) == [
        utc(2026, 3, 29, 1),  # the transition instant, 04:00 EEST
        utc(2026, 3, 30, 0, 30),  # 03:30 EEST
    ]
    # Several times inside the gap collapse into one run.
    assert fires(cron("*/20 3 * * *"), utc(2026, 3, 28, 12), 2) == [
        utc(2026, 3, 29, 1),
        utc(2026, 3, 30, 0, 0),
    ]
    assert fires(daily(at="03:30"), utc(2026, 3, 28, 12), 1) == [utc(2026, 3, 29, 1)]


def test_dst_repeated_hour_runs_once_at_the_first_occurrence() -> None:
    """25 October 2026, Kyiv: 04:00 -> 03:00. 03:30 happens twice: it runs at the first."""
    assert fires(cron("30 3 * * *"), utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),  # 03:30 EEST, first occurrence
        utc(2026, 10, 26, 1, 30),  # 03:30 EET the next day
    ]
    quarter = fires(cron("*/15 3 * * *"), utc(2026, 10, 24, 12), 5)
    assert quarter == [
        utc(2026, 10, 25, 0, 0),
        utc(2026, 10, 25, 0, 15),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 0, 45),
        utc(2026, 10, 26, 1, 0),  # not again during the repeated hour
    ]
    # Asked from inside the second occurrence, it does not go back to it.
    inside = utc(2026, 10, 25, 1, 10)  # 03:10 EET, the repeated hour
    assert fires(cron("*/15 3 * * *"), inside, 1) == [utc(2026, 10, 26, 1, 0)]
    assert fires(daily(at="03:30"), utc(2026, 10, 24, 12), 1) == [utc(2026, 10, 25, 0, 30)]


def test_hourly_cron_across_dst() -> None:
    """An hourly cron fires 23 times on the spring-forward day and 24 (not 25) on fall-back."""
    spring = fires(cron("0 * * * *"), utc(2026, 3, 28, 21, 30), 23)
    assert spring[-1] == utc(2026, 3, 29, 20)  # 23:00 EEST
    fall = fires(cron("0 * * * *"), utc(2026, 10, 24, 20, 30), 24)
    assert fall[-1] == utc(2026, 10, 25, 21)  # 23:00 EET


def test_daily_every_n_days_weekly_monthly() -> None:
    every_other = fires(
        daily(at=["09:00", "18:00"], every=2, start=date(2026, 6, 1)), utc(2026, 5, 31), 3, UTC_ZONE
    )
    assert every_other == [utc(2026, 6, 1, 9), utc(2026, 6, 1, 18), utc(2026, 6, 3, 9)]
    mondays = fires(weekly(on=["mon", "thu"], at="07:15"), utc(2026, 6, 1, 8), 2, UTC_ZONE)
    assert mondays == [utc(2026, 6, 4, 7, 15), utc(2026, 6, 8, 7, 15)]  # Thu, then Mon
    last_day = fires(monthly(on=-1, at="23:00"), utc(2026, 1, 31, 23, 30), 2, UTC_ZONE)
    assert last_day == [utc(2026, 2, 28, 23), utc(2026, 3, 31, 23)]
    thirty_first = fires(monthly(on=31), utc(2026, 3, 31, 1), 1, UTC_ZONE)
    assert thirty_first == [utc(2026, 5, 31)]  # April has no 31st


def test_once() -> None:
    at = utc(2026, 7, 1, 12)
    assert once(at).next_fire(utc(2026, 7, 1), UTC_ZONE, "s") == at
    assert once(at).next_fire(at, UTC_ZONE, "s") is None
    assert once("2026-07-01T15:00").next_fire(utc(2026, 7, 1), KYIV, "s") == at  # naive: job tz


# --- errors, reported when the job is added ---------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: cron("61 * * * *"), "'61 * * * *': minute 61 out of 0\u201359"),
        (lambda: cron("* 24 * * *"), "hour 24 out of 0\u201323"),
        (lambda: cron("* * 0 * *"), "day of month 0 out of 1\u201331"),
        (lambda: cron("* * * 13 *"), "month 13 out of 1\u201312"),
        (lambda: cron("* * * * 8"), "day of week 8 out of 0\u20137"),
        (lambda: cron("0-70/5 * * * *"), "minute 70 out of 0\u201359"),
        (lambda: cron("1,2,99 * * * *"), "minute 99 out of 0\u201359"),
        (lambda: cron("60 * * * * *", seconds=True), "second 60 out of 0\u201359"),
        (lambda: cron("* * * jan-foo *"), "month field 'jan-foo' is not valid"),
        (lambda: cron("? * * * *"), "minute field '?' is not valid"),
        (lambda: cron("@reboot"), "'@reboot': unknown alias (known: @yearly"),
        (lambda: cron("* * * *"), "4 fields, expected 5"),
        (lambda: cron("0 0 * * * *"), "6 fields, expected 5 (pass seconds=True for a seconds"),
        (lambda: cron("0 0 * * *", seconds=True), "(seconds=True expects a seconds field first)"),
        (lambda: every(milliseconds=0.5), "at least 1ms"),
        (lambda: every(milliseconds=-1), "every(milliseconds=-1)"),
        (lambda: every(), "at least 1ms"),
        (lambda: every(seconds=-1), "every(seconds=-1)"),
        (lambda: every("soon"), "invalid interval: 'soon'"),
        (lambda: every(seconds=10, jitter="10s"), "jitter 0:00:10 must be shorter"),
        (lambda: every(seconds=1, start=datetime(2026, 1, 1)), "aware datetime"),
        (lambda: daily(at="25:00"), "invalid time '25:00'"),
        (lambda: daily(every=0), "every=0"),
        (lambda: weekly(on="funday"), "invalid weekday 'funday'"),
        (lambda: monthly(on=0), "invalid day 0"),
        (lambda: once("tomorrow"), "invalid date-time 'tomorrow'"),
    ],
)
def test_bad_triggers_are_refused(make: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=_literal(message)):
        make()  # type: ignore[operator]


def _literal(text: str) -> str:
    return re.escape(text)


@pytest.fixture
def scheduler() -> Scheduler:
    return Scheduler(
        "memory://triggers", clock=ManualClock(utc(2026, 6, 1).timestamp()), metrics=False
    )


async def _noop() -> None:
    return None


@pytest.mark.parametrize(
    ("trigger", "options", "message"),
    [
        (cron("0 0 30 2 *"), {}, "never fires"),
        (once(utc(2026, 5, 1)), {}, "never fires"),
        (every(seconds=0.5), {}, "skew_tolerance 0.25s lets two replicas' clocks differ by 0.5s"),
        (every(minutes=1), {"timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        (every(minutes=1), {"timeout": "forever"}, "invalid timeout: 'forever'"),
        (every(minutes=1), {"misfire_grace": -1}, "invalid misfire_grace"),
        (every(minutes=1), {"overlap": "queue"}, "invalid overlap 'queue'"),
        (every(minutes=1), {"name": ""}, "invalid job name ''"),
        (every(minutes=1), {"args": (1,)}, "arguments do not fit: too many positional"),
        (every(minutes=1), {"kwargs": {"x": 1}}, "unexpected keyword argument 'x'"),
    ],
)
def test_add_job_refuses_with_a_named_problem(
    scheduler: Scheduler, trigger: object, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=_literal(message)):
        scheduler.add_job(_noop, trigger, **options)  # type: ignore[arg-type]
    assert scheduler.jobs == []


def test_a_local_job_may_fire_faster_than_the_skew_tolerance(scheduler: Scheduler) -> None:
    scheduler.add_job(_noop, every(seconds=0.5), distributed=False)
    assert [job.name for job in scheduler.jobs] == ["_noop"]


def test_bad_scheduler_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown timezone 'Nowhere'"):
        Scheduler("memory://x", timezone="Nowhere")
    with pytest.raises(ConfigurationError, match="invalid coordination 'raft'"):
        Scheduler("memory://x", coordination="raft")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="invalid skew_tolerance"):
        Scheduler("memory://x", skew_tolerance="0s")


def test_jobs_of_one_cron_expression_share_its_trigger_and_its_answers() -> None:
    # 100,000 daily crons start in seconds only if the jobs of an expression compute its
    # fire times once: one trigger per expression, which remembers its last answer.
    shared = cron("30 3 * * *")
    assert cron(" 30  3 * * * ") is shared
    assert cron("30 3 * * *", seconds=False) is shared
    assert cron("0 30 3 * * *", seconds=True) is not shared
    fresh = type(shared)(shared.expr, shared.seconds)  # no memory of earlier answers
    start = utc(2026, 3, 1, 3, 29, 59)
    for step in range(0, 3 * 86_400, 3_607):  # before, on and after fire times
        after = start + timedelta(seconds=step, microseconds=step % 7)
        for tz in (UTC_ZONE, KYIV):
            assert shared.next_fire(after, tz, "a") == fresh.next_fire(after, tz, "b")


@pytest.mark.parametrize("tz", [UTC_ZONE, KYIV])
def test_next_fires_walk_as_next_fire_does(tz: ZoneInfo) -> None:
    trigger = cron("*/20 2,3 * * *")  # Kyiv: through the DST change of 2026-03-29
    after = utc(2026, 3, 27)
    assert trigger.next_fires(after, tz, 40) == fires(trigger, after, 40, tz)


@pytest.mark.parametrize(
    ("trigger", "skew", "refused"),
    [
        (cron("* * * * *"), 29.9, False),  # a minute apart: shorter checks need no walk
        (cron("* * * * *"), 30.0, True),
        (cron("*/20 * * * * *", seconds=True), 9.9, False),
        (cron("*/20 * * * * *", seconds=True), 10.0, True),
    ],
)
def test_a_cron_faster_than_twice_the_skew_tolerance_is_refused(
    trigger: object, skew: float, refused: bool
) -> None:
    scheduler = Scheduler("memory://cron-gaps", skew_tolerance=skew, metrics=False)
    if refused:
        with pytest.raises(ConfigurationError, match="shortest interval between its fire times"):
            scheduler.add_job(_noop, trigger)  # type: ignore[arg-type]
    else:
        scheduler.add_job(_noop, trigger)  # type: ignore[arg-type]
