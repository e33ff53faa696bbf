"""Secrets never shown: one masking rule for URLs and free text, in every form multilock
speaks (repr, str, errors, log lines in both formats, ``multilock locks``, metrics)."""

from __future__ import annotations

import asyncio
import json
import logging
import string
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multilock
from multilock import ManualClock, Scheduler, every
from multilock._cli import _app
from multilock._cli._logs import JsonFormatter, TextFormatter
from multilock._masking import mask_text, split_userinfo
from multilock.backend import LockURL, mask_url
from multilock.errors import ConfigurationError, InvalidURL, MultilockError

# Around every generated password: an output that shows any piece of the password
# holding either marker leaks, and neither marker occurs in anything multilock says.
HEAD, TAIL = "PWq7", "j4ZW"
PRINTABLE = string.printable.strip() + " "  # ASCII 0x20-0x7e
passwords = st.builds(
    lambda body: f"{HEAD}{body}{TAIL}",
    st.text(
        alphabet=st.sampled_from(PRINTABLE)
        | st.characters(min_codepoint=0xA1, blacklist_categories=("Cs", "Cc", "Co", "Cn")),
        max_size=16,
    ),
)


def assert_hidden(secret: str, *said: str) -> None:
    """Neither ``secret`` (as given or percent-encoded) nor a piece of it shows."""
    for text in said:
        for form in (secret, quote(secret, safe="")):
            assert form not in text, text
        assert HEAD not in text, text
        assert TAIL not in text, text


# --- the rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "password", "hosts", "path"),
    [
        ("postgresql://app:ab/cd@db:5432/app", "ab/cd", (("db", 5432),), "/app"),
        ("postgresql://app:a#b?c@db/app", "a#b?c", (("db", None),), "/app"),
        ("redis://:x@y@z:1/0", "x@y", (("z", 1),), "/0"),
        ("redis://:sGV5/+Qw==@cache:6379/0", "sGV5/+Qw==", (("cache", 6379),), "/0"),
    ],
)
def test_a_password_may_hold_separators_unencoded(
    url: str, password: str, hosts: tuple[tuple[str, int | None], ...], path: str
) -> None:
    parsed = LockURL.parse(url)
    assert (parsed.password, parsed.hosts, parsed.path) == (password, hosts, path)
    assert password not in str(parsed) + repr(parsed)


def test_the_userinfo_ends_at_the_last_at_whose_user_has_no_separator() -> None:
    assert split_userinfo("u:p/w@h/db") == ("u:p/w", "h/db")
    assert split_userinfo("cache/0?prefix=a@b") == (None, "cache/0?prefix=a@b")
    assert split_userinfo("/dir/a@b") == (None, "/dir/a@b")  # file:///dir/a@b
    assert LockURL.parse("file:///dir/a@b").path == "/dir/a@b"


@pytest.mark.parametrize("name", ["password", "sslpassword", "passphrase", "secret", "api_token"])
def test_secret_options_are_masked_and_redacted(name: str) -> None:
    url = LockURL.parse(f"postgresql://app@db/app?{name}=hunter2secret&ttl=5s")
    for shown in (str(url), repr(url), url.masked):
        assert "hunter2secret" not in shown
        assert f"{name}=***&ttl=5s" in shown
    assert url.redact("libpq said: bad key hunter2secret") == "libpq said: bad key ***"


def test_free_text_is_masked() -> None:
    text = "failed at postgresql://app:pw1@db/app?sslkey=k&token=pw2, then ?password=pw3&ttl=1"
    assert mask_text(text + " via app:pw4@db") == (
        "failed at postgresql://app:***@db/app?sslkey=k&token=*** then ?password=***&ttl=1"
        " via app:***@db"
    )
    # A lease's repr says fencing_token=3: not a query, not a secret.
    assert mask_text("<Lease 'a' key=1 fencing_token=3 held>") == (
        "<Lease 'a' key=1 fencing_token=3 held>"
    )


def test_a_url_with_a_space_is_refused_without_echoing_it() -> None:
    with pytest.raises(InvalidURL, match="percent-encode it") as info:
        LockURL.parse("redis://:pass word@h/0")
    assert "pass" not in str(info.value).replace("percent", "")
    assert "word" not in str(info.value)


def test_a_bad_value_of_a_secret_option_is_not_shown() -> None:
    from multilock.backend import OptionParser, as_int

    parser = OptionParser({"token_count": as_int})
    with pytest.raises(ConfigurationError) as info:
        parser.parse(LockURL.parse("x://h/?token_count=hunter2secret"))
    assert "hunter2secret" not in str(info.value)


def _record(message: str, *args: object, error: BaseException | None = None) -> logging.LogRecord:
    record = logging.LogRecord("multilock.test", logging.ERROR, __file__, 1, message, args, None)
    if error is not None:
        record.exc_info = (type(error), error, error.__traceback__)
    return record


def test_the_json_format_masks_as_the_text_one() -> None:
    url = "redis://:hunter2secret@h:6379/0"
    record = _record("connecting to %s", url, error=RuntimeError(f"refused at {url}"))
    record.lock = url  # a structured field
    text = TextFormatter().format(record)
    data = json.loads(JsonFormatter().format(record))
    assert "hunter2secret" not in text
    assert "hunter2secret" not in json.dumps(data)
    assert data["message"] == "connecting to redis://:***@h:6379/0"
    assert "RuntimeError: refused at redis://:***@h:6379/0" in data["traceback"]
    assert data["lock"] == "redis://:***@h:6379/0"


# --- generated passwords, everywhere -----------------------------------------------------


@contextmanager
def captured() -> Iterator[list[logging.LogRecord]]:
    """Every record of the ``multilock`` loggers, from DEBUG up."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, logger = Keep(logging.DEBUG), logging.getLogger("multilock")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _formatted(records: list[logging.LogRecord]) -> list[str]:
    return [f.format(r) for r in records for f in (TextFormatter(), JsonFormatter())]


def _errors(url: str) -> list[str]:
    """The messages of the configuration errors ``url`` can meet."""
    said = []
    head, _, _ = url.partition("?")
    for bad in (f"{head}?bogus=1", f"{head}?ttl=forever", head.replace("@", "@h:12a", 1)):
        try:
            multilock.connect(bad).close()
        except MultilockError as exc:
            said.append(str(exc))
    return said


def _scheduler_run(url: str) -> tuple[list[str], str]:
    """Log lines (both formats) and metrics of a scheduler on ``url`` running two ticks."""
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    clock = ManualClock(1_800_000_001.0)

    async def job() -> None:
        raise RuntimeError(f"the job met {url}")  # a traceback naming the raw URL

    async def scenario() -> None:
        sched = Scheduler(url, clock=clock, registry=registry, stop_timeout=1)
        sched.add_job(job, every(seconds=10), name="masked-job")
        async with sched:
            for tick in (10, 11):
                clock.set(1_800_000_000.0 + tick)
                for _ in range(20):
                    await asyncio.sleep(0)
        said.append(repr(sched))

    said: list[str] = []
    with captured() as records:
        asyncio.run(scenario())
    return said + _formatted(records), prometheus.generate_latest(registry).decode()


def _cli(*args: str) -> str:
    result = CliRunner().invoke(_app.cli, list(args), catch_exceptions=False)
    return result.output + (result.stderr if result.stderr_bytes is not None else "")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=passwords)
def test_a_generated_password_never_shows(secret: str) -> None:
    from multilock._cli import _locks  # noqa: F401  (registers the command)

    space = f"mask-{uuid.uuid4().hex[:8]}"
    encoded = f"memory://app:{quote(secret, safe='')}@{space}?ttl=5s"
    forms = [encoded]
    if not any(c.isspace() for c in secret):
        forms.append(f"memory://app:{secret}@{space}?ttl=5s")  # unencoded: the same rule
    for url in forms:
        said = [str(LockURL.parse(url)), repr(LockURL.parse(url)), mask_url(url)]
        said.append(mask_text(f"driver said: cannot reach {url} (?password={quote(secret)})"))
        with multilock.connect(url) as locker:
            lease = locker.try_acquire("a")
            said += [repr(locker), str(locker), locker.url, repr(lease)]
            said.append(_cli("locks", url))
        said += _errors(url)
        said.append(_cli("locks", url.replace("?ttl=5s", "?bogus=1")))
        logs, metrics = _scheduler_run(url)
        assert_hidden(secret, *said, *logs, metrics)
    assert LockURL.parse(encoded).password == secret


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=passwords)
def test_a_generated_password_never_shows_in_a_server_backends_errors(secret: str) -> None:
    pytest.importorskip("multilock_postgres")
    pytest.importorskip("multilock_redis")
    said = []
    for template in (
        "postgresql://app:{}@127.0.0.1:1/app?connect_timeout=2",
        "redis://app:{}@127.0.0.1:1/0",
    ):
        for password in (quote(secret, safe=""), secret):
            if password is secret and any(c.isspace() for c in secret):
                continue
            url = template.format(password)
            try:
                with multilock.connect(url) as locker:
                    locker.try_acquire("a")
            except MultilockError as exc:
                said.append(f"{exc!r} {exc}")
            else:
                raise AssertionError(f"{mask_url(url)} answered on port 1")
    assert_hidden(secret, *said)
