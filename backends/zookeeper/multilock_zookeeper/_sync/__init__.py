# This file was generated from the async source by scripts/unasync.py:
# backends/zookeeper/multilock_zookeeper/_async/__init__.py.
# Do not edit it; change the source and rerun the script.
"""The async locker: the one source of the I/O flow (``_sync`` is generated from it)."""
