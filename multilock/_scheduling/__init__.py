"""The scheduler: triggers, the clock, jobs and their runs, leadership, events and
metrics. Coded only against the lock contract (multilock.abc)."""
