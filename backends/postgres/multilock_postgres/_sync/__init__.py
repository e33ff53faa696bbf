# This file was generated from the async source by scripts/unasync.py:
# backends/postgres/multilock_postgres/_async/__init__.py.
# Do not edit it; change the source and rerun the script.
"""The async PostgreSQL locker: the one source the sync code is generated from."""
