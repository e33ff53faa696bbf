# Generated from backends/mysql/multilock_mysql/_async/__init__.py
# by scripts/async_to_sync.py: do not edit; change that file and rerun.
"""The MySQL locker, written once: ``_async`` is the source, ``_sync`` is generated."""
