# Generated from backends/etcd/multilock_etcd/_async/__init__.py
# by scripts/async_to_sync.py: do not edit; change that file and rerun.
"""The asyncio API (the source the sync API is generated from)."""
