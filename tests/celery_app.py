"""The Celery app of the beat fleet test: run as ``celery -A celery_app beat|worker``.

Configured from the environment: ``CELERY_TEST_BROKER`` (a Redis URL),
``CELERY_TEST_PREFIX`` (entry names and the queue: one test's own), ``CELERY_TEST_ENTRIES``
and ``CELERY_TEST_EVERY`` (that many interval entries, every that many seconds),
``CELERY_TEST_HOLD`` and ``CELERY_TEST_SKEW`` (the multilock settings) and
``CELERY_TEST_RECORD``: each task run appends ``<entry> <tick in ms> <pid>`` to it.
The lock URL is ``$MULTILOCK_LOCK_URL``, read by the scheduler itself.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

from celery import Celery

from multilock.integrations.celery import task_tick

if "FAKETIME" in os.environ:
    # libfaketime 0.9.10 with the monotonic clocks left true (as a skewed host's are) makes
    # clock_nanosleep fail with EINVAL, and time.sleep uses it: beat sleeps between its
    # ticks. A condition wait (what every other thread here uses) works: sleep on one.
    def _sleep(seconds: float) -> None:
        threading.Event().wait(seconds)

    time.sleep = _sleep  # type: ignore[assignment]

prefix = os.environ["CELERY_TEST_PREFIX"]
app = Celery("celery_app", broker=os.environ["CELERY_TEST_BROKER"])
app.conf.update(
    task_default_queue=prefix,
    beat_multilock_hold=float(os.environ["CELERY_TEST_HOLD"]),
    beat_multilock_skew_tolerance=float(os.environ["CELERY_TEST_SKEW"]),
    beat_schedule={
        f"{prefix}-{i}": {
            "task": "celery_app.record",
            "schedule": timedelta(seconds=float(os.environ["CELERY_TEST_EVERY"])),
            "args": (f"{prefix}-{i}",),
        }
        for i in range(int(os.environ["CELERY_TEST_ENTRIES"]))
    },
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(bind=True)  # type: ignore[untyped-decorator]
def record(self: Any, entry: str) -> None:
    """Note which tick of ``entry`` ran (one write: O_APPEND keeps lines whole)."""
    tick = task_tick(self.request)
    assert tick is not None, "sent without its multilock_tick header"
    line = f"{entry} {round(tick.timestamp() * 1000)} {os.getpid()}\n"
    fd = os.open(os.environ["CELERY_TEST_RECORD"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
