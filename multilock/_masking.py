"""The one rule that hides secrets in URLs and in free text (errors, log lines).

* A URL's userinfo runs from ``scheme://`` to the **last** ``@`` whose user part
  (before the first ``:``) holds no ``/``, ``?`` or ``#``: a password may then
  contain any of ``/ ? # @ :`` unencoded (base64 secrets do), and ``file:///a@b``
  has none. The password (after the first ``:``) is shown as ``***``. An ``@``
  after the host must be written ``%40``: it would be read as the end of a password.
* A query option is secret when its name contains ``pass`` (password, passphrase,
  passwd, sslpassword...), ``secret`` or ``token``: its value is shown as ``***``.

:class:`~multilock.backend.LockURL` parses with the same split, so what is masked is
exactly what the backend receives as the password.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "is_secret_option", "mask_text", "mask_url", "masked_line", "split_userinfo"]

MASK = "***"
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SECRET_NAMES = ("pass", "secret", "token")
# name=value after ? or & (a query, in a URL or on its own in free text)
_QUERY_PAIR = re.compile(r"(?<=[?&])([^=&#?\s]+)=([^&#\s]*)")
# user:secret@host outside a URL (a driver's message)
_BARE_USERINFO = re.compile(r"(?<=[\w%.~-]:)[^\s:/@]+(?=@[\w\[])")


def is_secret_option(name: str) -> bool:
    """Whether an option named ``name`` holds a secret (its value is never shown)."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_NAMES)


def split_userinfo(rest: str) -> tuple[str | None, str]:
    """``(userinfo, remainder)`` of what follows ``scheme://``: split at the last ``@``
    whose user part has no ``/``, ``?`` or ``#``; ``(None, rest)`` when there is none."""
    at = rest.rfind("@")
    while at != -1:
        user = rest[:at].partition(":")[0]
        if not any(sep in user for sep in "/?#"):
            return rest[:at], rest[at + 1 :]
        at = rest.rfind("@", 0, at)
    return None, rest


def _mask_query(text: str) -> str:
    def hide(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"{name}={MASK}" if is_secret_option(name) else match.group(0)

    return _QUERY_PAIR.sub(hide, text)


def mask_url(url: str) -> str:
    """``url`` with its password and secret options replaced by ``***``; never raises.

    Text that is not a URL is masked as free text (:func:`mask_text`).
    """
    match = SCHEME.match(url)
    if not match:
        return mask_text(url)
    userinfo, remainder = split_userinfo(url[match.end() :])
    shown = match.group(0)
    if userinfo is not None:
        user, colon, _ = userinfo.partition(":")
        shown += f"{user}:{MASK}@" if colon else f"{userinfo}@"
    return shown + _mask_query(remainder)


def mask_text(text: str) -> str:
    """Free text (an error, a log line, a traceback) with every URL in it masked by
    :func:`mask_url`, secret ``?name=value`` pairs hidden, and ``user:secret@host``
    forms hidden. A URL in text ends at whitespace (a URL has none unencoded)."""
    out: list[str] = []
    pos = 0
    for match in SCHEME.finditer(text):
        if match.start() < pos:
            continue  # inside the previous URL
        out.append(_mask_plain(text[pos : match.start()]))
        end = match.end()
        while end < len(text) and not text[end].isspace():
            end += 1
        out.append(mask_url(text[match.start() : end]))
        pos = end
    out.append(_mask_plain(text[pos:]))
    return "".join(out)


def _mask_plain(text: str) -> str:
    return _BARE_USERINFO.sub(MASK, _mask_query(text))


def masked_line(error: BaseException | str) -> str:
    """An error's message masked and on one line (a driver's may span several)."""
    return " ".join(mask_text(str(error)).split())
