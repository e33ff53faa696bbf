# This file was generated from the async source by scripts/unasync.py:
# backends/etcd/multilock_etcd/_async/__init__.py.
# Do not edit it; change the source and rerun the script.
"""The asyncio API (the source the sync API is generated from)."""
