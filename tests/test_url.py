"""LockURL parsing, option validation and password masking."""

from __future__ import annotations

import pytest

import multilock
from multilock.backend import (
    LockURL,
    OptionParser,
    as_bool,
    as_duration,
    as_int,
    as_str,
    mask_url,
    quote_name,
)
from multilock.errors import ConfigurationError, InvalidOption, InvalidURL

SECRET = "s3cr=t:p@ss/w?rd"
SECRET_QUOTED = "s3cr%3Dt%3Ap%40ss%2Fw%3Frd"


def test_basic_parts() -> None:
    url = LockURL.parse("postgresql://app@db.example:6543/appdb?ttl=30s")
    assert url.scheme == "postgresql"
    assert url.username == "app"
    assert url.password is None
    assert url.hosts == (("db.example", 6543),)
    assert (url.host, url.port) == ("db.example", 6543)
    assert url.path == "/appdb"
    assert dict(url.options) == {"ttl": "30s"}


def test_scheme_is_case_insensitive() -> None:
    assert LockURL.parse("Redis://h").scheme == "redis"


def test_no_host_no_port() -> None:
    url = LockURL.parse("file:///var/lock/app")
    assert url.hosts == ()
    assert url.host is None
    assert url.port is None
    assert url.path == "/var/lock/app"


def test_multi_host() -> None:
    url = LockURL.parse("zookeeper://zk1:2181,zk2:2182,zk3/chroot/app")
    assert url.hosts == (("zk1", 2181), ("zk2", 2182), ("zk3", None))
    assert url.host == "zk1"
    assert url.port == 2181
    assert url.path == "/chroot/app"


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("redis://[::1]:6379/0", (("::1", 6379),)),
        ("redis://[::1]/0", (("::1", None),)),
        ("zk://[fe80::1]:2181,[::1]:2182/x", (("fe80::1", 2181), ("::1", 2182))),
        ("postgresql://u@[2001:db8::7]:5432/db", (("2001:db8::7", 5432),)),
    ],
)
def test_ipv6_hosts(text: str, hosts: tuple[tuple[str, int | None], ...]) -> None:
    assert LockURL.parse(text).hosts == hosts


@pytest.mark.parametrize("port", ["0", "65536", "99999", "http", "-1", "12a"])
def test_bad_port(port: str) -> None:
    with pytest.raises(InvalidURL) as info:
        LockURL.parse(f"redis://user:{SECRET_QUOTED}@host:{port}/0")
    assert str(info.value) == (
        "invalid port after host 'host' in a redis:// URL: expected a number from 1 to 65535"
    )


def test_unclosed_ipv6_bracket() -> None:
    with pytest.raises(InvalidURL, match=r"unclosed '\['"):
        LockURL.parse("redis://[::1:6379/0")


@pytest.mark.parametrize("text", ["", "localhost:5432", "postgresql:/x", "://x", "1abc://x"])
def test_not_a_url(text: str) -> None:
    with pytest.raises(InvalidURL, match="expected scheme://"):
        LockURL.parse(text)


def test_not_a_string() -> None:
    with pytest.raises(InvalidURL, match="must be a string, not bytes"):
        LockURL.parse(b"redis://h")  # type: ignore[arg-type]


def test_percent_encoded_user_and_password() -> None:
    url = LockURL.parse(f"postgresql://app%40corp:{SECRET_QUOTED}@db/app")
    assert url.username == "app@corp"
    assert url.password == SECRET


def test_unencoded_at_in_password_splits_at_last_at() -> None:
    url = LockURL.parse("redis://:p@ss@host:6379/0")
    assert url.username is None
    assert url.password == "p@ss"
    assert url.hosts == (("host", 6379),)


def test_empty_password_is_not_none() -> None:
    url = LockURL.parse("redis://user:@host")
    assert url.username == "user"
    assert url.password == ""


def test_query_options_and_fragment() -> None:
    url = LockURL.parse("redis://h/0?ttl=5s&prefix=app%3A&empty=#frag")
    assert dict(url.options) == {"ttl": "5s", "prefix": "app:", "empty": ""}


def test_duplicate_option_is_an_error() -> None:
    with pytest.raises(InvalidOption, match="option 'ttl' is given twice"):
        LockURL.parse(f"redis://u:{SECRET_QUOTED}@h/0?ttl=1s&ttl=2s")


def test_malformed_query() -> None:
    with pytest.raises(InvalidURL, match="invalid query string"):
        LockURL.parse("redis://h/0?ttl")


def test_keyword_options_override_the_query() -> None:
    url = LockURL.parse("redis://h/0?ttl=5s&prefix=a", ttl=10, extra=True)
    assert dict(url.options) == {"ttl": 10, "prefix": "a", "extra": True}


def test_equality_ignores_the_password_and_raw_text() -> None:
    assert LockURL.parse("redis://u:one@h/0") == LockURL.parse("redis://u:two@h/0")


# --- masking ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://app:hunter2@db/app", "postgresql://app:***@db/app"),
        ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://:p@ss@h/0", "redis://:***@h/0"),
        ("redis://user@h/0", "redis://user@h/0"),
        ("zk://u:pw@a:1,b:2/x", "zk://u:***@a:1,b:2/x"),
        ("postgresql://h/db?password=hunter2&x=1", "postgresql://h/db?password=***&x=1"),
        ("postgresql://h/db?x=1&PASS=hunter2", "postgresql://h/db?x=1&PASS=***"),
        ("user:hunter2@host", "user:***@host"),
    ],
)
def test_mask_url(text: str, masked: str) -> None:
    assert mask_url(text) == masked
    assert "hunter2" not in mask_url(text)


def test_str_and_repr_hide_the_password() -> None:
    url = LockURL.parse(f"postgresql://app:{SECRET_QUOTED}@db/app?ttl=5s")
    for shown in (str(url), repr(url), url.masked, f"{url}", f"{url!r}"):
        assert SECRET not in shown
        assert SECRET_QUOTED not in shown
        assert "app:***@db" in shown


def test_redact_hides_the_decoded_password_in_driver_messages() -> None:
    url = LockURL.parse(f"redis://:{SECRET_QUOTED}@h/0")
    message = f"AUTH failed for password {SECRET!r} at redis://:{SECRET_QUOTED}@h/0"
    redacted = url.redact(message)
    assert SECRET not in redacted
    assert SECRET_QUOTED not in redacted


def test_errors_never_show_the_password() -> None:
    bad = [
        f"redis://u:{SECRET_QUOTED}@h:notaport/0",
        f"redis://u:{SECRET_QUOTED}@h/0?a=1&a=2",
        f"memory://u:{SECRET_QUOTED}@ns?bogus=1",
        f"memory://u:{SECRET_QUOTED}@ns?ttl=forever",
        f"nosuch://u:{SECRET_QUOTED}@h",
    ]
    for text in bad:
        with pytest.raises(ConfigurationError) as info:
            multilock.connect(text).close()
        assert SECRET_QUOTED not in str(info.value), text
        assert SECRET not in str(info.value), text


# --- options ------------------------------------------------------------------------

PARSER = OptionParser(
    {"ttl": as_duration, "retries": as_int, "tls": as_bool, "prefix": as_str},
    {"ttl": 30.0, "tls": False},
    passthrough=frozenset({"sslmode"}),
)


def test_option_parser_converts_and_defaults() -> None:
    url = LockURL.parse("x://h/?retries=3&tls=yes&sslmode=require", prefix="app:")
    values, extra = PARSER.parse(url)
    assert values == {"ttl": 30.0, "retries": 3, "tls": True, "prefix": "app:"}
    assert extra == {"sslmode": "require"}


def test_unknown_option_names_it_and_the_known_ones() -> None:
    url = LockURL.parse(f"x://u:{SECRET_QUOTED}@h/?tll=5s")
    with pytest.raises(InvalidOption) as info:
        PARSER.parse(url)
    message = str(info.value)
    assert "unknown option 'tll'" in message
    assert "prefix, retries, sslmode, tls, ttl" in message
    assert SECRET_QUOTED not in message


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("ttl=soon", "option 'ttl'"),
        ("retries=-1", "non-negative"),
        ("retries=x", "expected an integer"),
        ("tls=maybe", "expected true or false"),
    ],
)
def test_bad_option_values(query: str, fragment: str) -> None:
    with pytest.raises(InvalidOption, match=fragment):
        PARSER.parse(LockURL.parse(f"x://h/?{query}"))


def test_converters_on_python_values() -> None:
    assert as_bool(True) is True
    assert as_bool("OFF") is False
    assert as_int(7) == 7
    assert as_duration("1m") == 60.0
    with pytest.raises(ConfigurationError):
        as_int(True)
    with pytest.raises(ConfigurationError):
        as_str(5)


# --- quote_name ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("nightly-reindex", "nightly-reindex"),
        ("a/b", "a%2Fb"),
        ("..", "%2E."),
        (".hidden", "%2Ehidden"),
        ("", "%"),
        ("a b", "a%20b"),
        ("é", "%C3%A9"),
        ("50%", "50%25"),
    ],
)
def test_quote_name(name: str, quoted: str) -> None:
    assert quote_name(name) == quoted
    assert "/" not in quote_name(name)
