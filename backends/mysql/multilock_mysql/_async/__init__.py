"""The MySQL locker, written once: ``_async`` is the source, ``_sync`` is generated."""
