# Generated from backends/postgres/multilock_postgres/_async/__init__.py
# by scripts/async_to_sync.py: do not edit; change that file and rerun.
"""The PostgreSQL locker, written once: ``_async`` is the source, ``_sync`` is generated."""
