"""The lock contract's kit: base classes, cancellation-safe calls, the backend
registry, advisory keys, and the two built-in backends (memory://, file://)."""
