# This file was generated from the async source by scripts/unasync.py:
# backends/postgres/multilock_postgres/_async/__init__.py.
# Do not edit it; change the source and rerun the script.
"""The PostgreSQL locker, written once: ``_async`` is the source, ``_sync`` is generated."""
