# Generated from backends/zookeeper/multilock_zookeeper/_async/__init__.py
# by scripts/async_to_sync.py: do not edit; change that file and rerun.
"""The async locker: the one source of the I/O flow (``_sync`` is generated from it)."""
