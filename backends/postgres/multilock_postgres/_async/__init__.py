"""The async PostgreSQL locker: the one source the sync code is generated from."""
