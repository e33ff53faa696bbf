"""Backends by URL scheme: entry points of group ``multilock.backends``, plus
:func:`register_backend` for code that cannot ship an entry point."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from .._url import LockURL
from ..abc import AsyncDistributedLock, Backend, DistributedLock
from ..errors import ConfigurationError, MissingBackend, MultilockError, UnknownScheme

__all__ = ["backend_for", "connect", "connect_async", "installed_schemes", "register_backend"]

ENTRY_POINT_GROUP = "multilock.backends"

# Schemes of the reference backends, which live in their own distributions.
_EXTRAS = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "redis": "redis",
    "rediss": "redis",
    "redis+unix": "redis",
    "redis+cluster": "redis",
    "redis+sentinel": "redis",
    "unix": "redis",
    "zookeeper": "zookeeper",
    "zk": "zookeeper",
    "etcd": "etcd",
    "nats": "nats",
    "mysql": "mysql",
    "mariadb": "mysql",
}

# The core's own backends (entry points too, for listings): found without importing
# importlib.metadata and reading every installed distribution's entry points, which
# costs more than the demo's whole run and keeps thousands of objects alive.
_BUILTIN = {"memory": "multilock._locks.memory", "file": "multilock._locks.file"}

_registered: dict[str, Backend] = {}
_loaded: dict[str, Backend] = {}
_guard = threading.Lock()


def register_backend(scheme: str, backend: Backend) -> None:
    """Make ``scheme://`` URLs use ``backend``; overrides an installed entry point.

    ``backend`` is any object with ``connect(url)`` and ``connect_async(url)``
    (see :class:`multilock.abc.Backend`). For code that cannot ship an entry point.
    """
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise ConfigurationError(f"invalid URL scheme {scheme!r}")
    for method in ("connect", "connect_async"):
        if not callable(getattr(backend, method, None)):
            raise ConfigurationError(f"backend for {scheme!r} has no {method}() method")
    with _guard:
        _registered[scheme.lower()] = backend


def entry_points(*, group: str, name: str | None = None) -> Any:
    """The installed entry points of ``group`` (named ``name``): importlib.metadata's,
    imported on first use (see ``_BUILTIN``)."""
    from importlib.metadata import entry_points as installed

    return installed(group=group) if name is None else installed(group=group, name=name)


def installed_schemes() -> list[str]:
    """Every scheme a URL may use here: entry points and registered backends."""
    found = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(found | set(_registered))


def backend_for(scheme: str) -> Backend:
    """The backend serving ``scheme``, or an error that says what to install."""
    scheme = scheme.lower()
    backend = _registered.get(scheme) or _loaded.get(scheme)
    if backend is not None:
        return backend
    with _guard:
        if scheme in _BUILTIN:
            builtin: Backend = importlib.import_module(_BUILTIN[scheme]).backend
            _loaded[scheme] = builtin
            return builtin
        for ep in entry_points(group=ENTRY_POINT_GROUP, name=scheme):
            try:
                loaded: Any = ep.load()
            except ImportError as exc:
                raise MissingBackend(
                    f"the backend for {scheme}:// is installed but cannot be imported: {exc}"
                ) from exc
            _loaded[scheme] = loaded
            return loaded  # type: ignore[no-any-return]
    if scheme in _EXTRAS:
        extra = _EXTRAS[scheme]
        # Both forms work: the first from an index, the second with the core installed
        # from a checkout of the repository (where the backends live under backends/).
        raise MissingBackend(
            f"{scheme}:// needs the {extra} backend (distribution multilock-{extra}):"
            f" pip install 'multilock[{extra}]', or from a checkout of multilock:"
            f" pip install ./backends/{extra}"
        )
    raise UnknownScheme(
        f"no multilock backend for {scheme}:// (installed: "
        f"{', '.join(s + '://' for s in installed_schemes())})"
    )


def connect(url: str, **options: Any) -> DistributedLock:
    """A sync locker for ``url``; keyword ``options`` override the URL's query.

    ``with multilock.connect("postgresql://app@db/app") as locker: ...``
    """
    parsed = LockURL.parse(url, **options)
    locker: DistributedLock = _call(parsed, lambda b: b.connect(parsed))
    return locker


def connect_async(url: str, **options: Any) -> AsyncDistributedLock:
    """An async locker for ``url`` (it connects lazily, on first use or ``async with``)."""
    parsed = LockURL.parse(url, **options)
    locker: AsyncDistributedLock = _call(parsed, lambda b: b.connect_async(parsed))
    return locker


def _call(url: LockURL, make: Any) -> Any:
    backend = backend_for(url.scheme)
    try:
        return make(backend)
    except MultilockError:
        raise
    except Exception as exc:  # a third-party backend's bug: say where, never the password
        raise ConfigurationError(
            f"backend for {url.scheme}:// failed to open {url.masked!r}: "
            f"{type(exc).__name__}: {url.redact(str(exc))}"
        ) from None
