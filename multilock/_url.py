"""Lock URLs: parsed once, options validated, passwords never shown."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from ._durations import parse_duration
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

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_MASK = "***"


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``; never raises."""
    match = _SCHEME.match(url)
    if not match:
        # Not a URL we can parse: hide anything that looks like user:secret@.
        return re.sub(r"(?<=:)[^:/@\s]*(?=@)", _MASK, url)
    rest = url[match.end() :]
    netloc_end = len(rest)
    for sep in "/?#":
        pos = rest.find(sep)
        if pos != -1:
            netloc_end = min(netloc_end, pos)
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":" + _MASK
        netloc = f"{userinfo}@{hosts}"
    tail = re.sub(r"(?i)([?&](?:password|passwd|pass)=)[^&#]*", r"\1" + _MASK, tail)
    return f"{match.group(0)}{netloc}{tail}"


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
    def masked(self) -> str:
        """The URL as given, with the password replaced by ``***``."""
        return mask_url(self.raw)

    def redact(self, text: str) -> str:
        """``text`` (a driver's error message, say) with this URL's password hidden."""
        text = mask_url(text) if "://" in text else text
        if self.password:
            text = text.replace(self.password, _MASK)
        return text

    def __str__(self) -> str:
        return self.masked

    def __repr__(self) -> str:
        return f"LockURL({self.masked!r})"

    @classmethod
    def parse(cls, url: str, **options: Any) -> LockURL:
        """Parse ``url``; keyword ``options`` override query parameters."""
        if not isinstance(url, str):
            raise InvalidURL(f"a lock URL must be a string, not {type(url).__name__}")
        match = _SCHEME.match(url)
        if not match:
            raise InvalidURL(
                f"invalid lock URL {mask_url(url)!r}: expected scheme://..., "
                "e.g. postgresql://user@host/db, redis://host:6379/0, file:///var/lock/app"
            )
        scheme = match.group(1).lower()
        rest = url[match.end() :]
        rest, _, _fragment = rest.partition("#")
        rest, _, query = rest.partition("?")
        netloc, slash, path = rest.partition("/")
        path = slash + path
        username = password = None
        if "@" in netloc:
            userinfo, netloc = netloc.rsplit("@", 1)
            user, colon, secret = userinfo.partition(":")
            username = unquote(user) or None
            password = unquote(secret) if colon else None
        hosts = tuple(_parse_host(part, url) for part in netloc.split(",") if part)
        merged: dict[str, Any] = {}
        if query:
            try:
                pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
            except ValueError:
                raise InvalidURL(f"invalid query string in lock URL {mask_url(url)!r}") from None
            for key, value in pairs:
                if key in merged:
                    raise InvalidOption(f"option {key!r} is given twice in {mask_url(url)!r}")
                merged[key] = value
        merged.update(options)
        return cls(scheme, username, password, hosts, unquote(path), merged, url)


def _parse_host(part: str, url: str) -> tuple[str, int | None]:
    if part.startswith("["):  # [ipv6]:port
        host, bracket, port_text = part[1:].partition("]")
        if not bracket:
            raise InvalidURL(f"unclosed '[' in host of {mask_url(url)!r}")
        port_text = port_text.removeprefix(":")
    else:
        host, _, port_text = part.partition(":")
    if not port_text:
        return unquote(host), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidURL(f"invalid port {port_text!r} in {mask_url(url)!r}")
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
                    raise InvalidOption(
                        f"invalid value for option {name!r} of {url.scheme}:// URL: {exc}"
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
