"""The async locker: the one source of the I/O flow (``_sync`` is generated from it)."""
