"""Lock URLs: parsed once, options validated, passwords never shown."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from ._durations import parse_duration
from ._masking import MASK, SCHEME, is_secret_option, mask_text, mask_url, split_userinfo
from .errors import ConfigurationError, InvalidOption, InvalidURL

__all__ = [
    "LockURL",
    "OptionParser",
    "as_bool",
    "as_duration",
    "as_int",
    "as_str",
    "mask_url",
    "quote_name",
]

# Characters a URL never holds unencoded: whitespace and control characters. Refused,
# so that a URL in free text always ends at whitespace (see _masking.mask_text).
_UNENCODED = re.compile(r"[\s\x00-\x1f\x7f]")


@dataclass(frozen=True, repr=False)
class LockURL:
    """A parsed lock URL, as handed to a backend.

    ``hosts`` keeps every ``host:port`` of a multi-host netloc (ZooKeeper);
    ``host``/``port`` are the first. ``options`` holds the query parameters
    merged with the keyword options given to ``connect()`` (keywords win).
    ``str()`` and ``repr()`` mask the password.
    """

    scheme: str
    username: str | None
    password: str | None = field(compare=False)
    hosts: tuple[tuple[str, int | None], ...]
    path: str
    options: Mapping[str, Any]
    raw: str = field(compare=False)

    @property
    def host(self) -> str | None:
        """The first host, or ``None`` when the URL names none."""
        return self.hosts[0][0] if self.hosts else None

    @property
    def port(self) -> int | None:
        """The first host's port, or ``None`` when not given."""
        return self.hosts[0][1] if self.hosts else None

    @property
    def address(self) -> str:
        """What follows the userinfo, up to the query, as given: the hosts with their
        ports and the path (for a client library that parses URLs itself, rebuilt
        with the userinfo percent-encoded)."""
        _, rest = split_userinfo(self.raw.partition("://")[2])
        return rest.partition("#")[0].partition("?")[0]

    @property
    def masked(self) -> str:
        """The URL as given, with the password replaced by ``***``."""
        return mask_url(self.raw)

    def redact(self, text: str) -> str:
        """``text`` (a driver's error message, say) with every URL in it masked and this
        URL's password and secret options hidden, as given and as decoded."""
        text = mask_text(text)
        for secret in self._secrets():
            text = text.replace(secret, MASK)
        return text

    def _secrets(self) -> list[str]:
        """The secret strings of this URL, longest first (so a part never shows)."""
        found = {self.password} if self.password else set()
        for name, value in self.options.items():
            if is_secret_option(name) and isinstance(value, str) and value:
                found.add(value)
        forms = found | {quote(secret, safe="") for secret in found}
        userinfo, _ = split_userinfo(self.raw.partition("://")[2])
        if userinfo is not None and ":" in userinfo:
            forms.add(userinfo.partition(":")[2])  # as typed: maybe percent-encoded
        return sorted(forms, key=len, reverse=True)

    def __str__(self) -> str:
        return self.masked

    def __repr__(self) -> str:
        return f"LockURL({self.masked!r})"

    @classmethod
    def parse(cls, url: str, **options: Any) -> LockURL:
        """Parse ``url``; keyword ``options`` override query parameters."""
        if not isinstance(url, str):
            raise InvalidURL(f"a lock URL must be a string, not {type(url).__name__}")
        match = SCHEME.match(url)
        if not match:
            raise InvalidURL(
                "invalid lock URL: expected scheme://..., "
                "e.g. postgresql://user@host/db, redis://host:6379/0, file:///var/lock/app"
            )
        # A URL that does not parse is never shown, even masked: where its parts begin
        # and end is what is wrong with it, so a password could show through.
        scheme = match.group(0)[:-3].lower()
        if _UNENCODED.search(url):
            raise InvalidURL(
                f"invalid {scheme}:// URL: it holds a space or control character;"
                " percent-encode it (a space is %20)"
            )
        userinfo, rest = split_userinfo(url[match.end() :])
        rest, _, _fragment = rest.partition("#")
        rest, _, query = rest.partition("?")
        netloc, slash, path = rest.partition("/")
        path = slash + path
        username = password = None
        if userinfo is not None:
            user, colon, secret = userinfo.partition(":")
            username = unquote(user) or None
            password = unquote(secret) if colon else None
        hosts = tuple(_parse_host(part, scheme) for part in netloc.split(",") if part)
        merged: dict[str, Any] = {}
        if query:
            try:
                pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
            except ValueError:
                raise InvalidURL(f"invalid query string in a {scheme}:// URL") from None
            for key, value in pairs:
                if key in merged:
                    raise InvalidOption(f"option {key!r} is given twice in a {scheme}:// URL")
                merged[key] = value
        merged.update(options)
        return cls(scheme, username, password, hosts, unquote(path), merged, url)


def _parse_host(part: str, scheme: str) -> tuple[str, int | None]:
    if part.startswith("["):  # [ipv6]:port
        host, bracket, port_text = part[1:].partition("]")
        if not bracket:
            raise InvalidURL(f"unclosed '[' in a host of a {scheme}:// URL")
        port_text = port_text.removeprefix(":")
    else:
        host, _, port_text = part.partition(":")
    if not port_text:
        return unquote(host), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidURL(
            f"invalid port after host {unquote(host)!r} in a {scheme}:// URL:"
            " expected a number from 1 to 65535"
        )
    return unquote(host), int(port_text)


def as_str(value: object) -> str:
    """Option converter: a string."""
    if not isinstance(value, str):
        raise ConfigurationError(f"expected a string, got {type(value).__name__}")
    return value


def as_bool(value: object) -> bool:
    """Option converter: true/false, 1/0, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"expected true or false, got {value!r}")


def as_int(value: object) -> int:
    """Option converter: a non-negative integer."""
    if isinstance(value, bool):
        raise ConfigurationError(f"expected an integer, got {value!r}")
    try:
        number = int(str(value)) if not isinstance(value, int) else value
    except ValueError:
        raise ConfigurationError(f"expected an integer, got {value!r}") from None
    if number < 0:
        raise ConfigurationError(f"expected a non-negative integer, got {value!r}")
    return number


def as_duration(value: object) -> float:
    """Option converter: a duration in seconds (``30``, ``"250ms"``, ``"5m"``...)."""
    return parse_duration(value, what="duration")


class OptionParser:
    """Validates a URL's options against what a backend knows.

    ``known`` maps option names to converters (``as_duration``...) and
    ``defaults`` gives values for absent options. ``passthrough`` names options
    handed on unchanged (libpq's ``sslmode``...). Any other option is an
    :class:`~multilock.errors.InvalidOption` that names it and lists the known ones.
    """

    def __init__(
        self,
        known: Mapping[str, Callable[[object], Any]],
        defaults: Mapping[str, Any] | None = None,
        passthrough: frozenset[str] = frozenset(),
    ) -> None:
        self.known = dict(known)
        self.defaults = dict(defaults or {})
        self.passthrough = passthrough

    def parse(self, url: LockURL) -> tuple[dict[str, Any], dict[str, str]]:
        """Return (converted known options with defaults, passthrough options)."""
        values = dict(self.defaults)
        extra: dict[str, str] = {}
        for name, raw in url.options.items():
            if name in self.known:
                try:
                    values[name] = self.known[name](raw)
                except ConfigurationError as exc:
                    why = "not shown: a secret" if is_secret_option(name) else exc
                    raise InvalidOption(
                        f"invalid value for option {name!r} of {url.scheme}:// URL: {why}"
                    ) from None
            elif name in self.passthrough:
                extra[name] = str(raw)
            else:
                names = ", ".join(sorted([*self.known, *self.passthrough]))
                raise InvalidOption(
                    f"unknown option {name!r} for {url.scheme}:// URL {url.masked!r}"
                    f"{_did_you_mean(name, [*self.known, *self.passthrough])}"
                    f" (known options: {names})"
                )
        return values, extra


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    """``": did you mean 'ttl'?"`` for the known option closest to a mistyped ``name``,
    or ``""`` when none is close."""
    close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


def quote_name(name: str) -> str:
    """Escape a lock name into one path segment, reversibly.

    Letters, digits, ``-``, ``_``, ``.`` and ``~`` stay; every other byte of the
    UTF-8 form becomes ``%XX``; a leading dot is escaped too (no ``.``/``..``
    or hidden files) and the empty name becomes ``%``.
    """
    if not name:
        return "%"
    quoted = quote(name, safe="-_")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted
