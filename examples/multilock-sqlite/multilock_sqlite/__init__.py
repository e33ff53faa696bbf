"""multilock-sqlite: the tutorial backend of multilock, leases in a SQLite table.

``multilock.connect("sqlite:///var/lib/app/locks.db")`` once this distribution
is installed: its entry point in group ``multilock.backends`` maps the
``sqlite`` scheme to :data:`backend`.
"""

from __future__ import annotations

from ._backend import AsyncSQLiteLocker, SQLiteBackend, SQLiteLocker, backend

__all__ = ["AsyncSQLiteLocker", "SQLiteBackend", "SQLiteLocker", "backend"]

__version__ = "0.1.0"
