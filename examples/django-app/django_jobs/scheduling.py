"""The scheduler and its jobs: imported by the management command and by ``ready()``."""

from __future__ import annotations

import logging
import os

import multilock

log = logging.getLogger("django_jobs")

# --8<-- [start:scheduler]
# The lock URL (and its password) from the environment, never from settings in git.
scheduler = multilock.Scheduler(os.environ.get("MULTILOCK_LOCK_URL"), stop_timeout=10)


@scheduler.job(multilock.every(seconds=1), name="django-example-heartbeat")
def heartbeat() -> None:
    """A sync job (the ORM is sync): it runs on the scheduler's worker threads."""
    log.info("heartbeat for tick %s", multilock.current_run().fire_time.isoformat())


# --8<-- [end:scheduler]
