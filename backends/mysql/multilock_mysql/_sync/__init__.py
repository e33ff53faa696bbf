# This file was generated from the async source by scripts/unasync.py:
# backends/mysql/multilock_mysql/_async/__init__.py.
# Do not edit it; change the source and rerun the script.
"""The MySQL locker, written once: ``_async`` is the source, ``_sync`` is generated."""
