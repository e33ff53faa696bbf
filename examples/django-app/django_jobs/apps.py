"""The app's config: where the scheduler may be started in the web process itself."""

from __future__ import annotations

import atexit
import os
import sys

from django.apps import AppConfig


# --8<-- [start:ready]
class JobsConfig(AppConfig):  # type: ignore[misc]
    name = "django_jobs"

    def ready(self) -> None:
        # ready() runs in every process that sets Django up: migrate, shell, test and
        # check too, both processes of runserver's autoreloader, every gunicorn worker
        # (and the master, with --preload: its thread would not survive the fork). So
        # start the scheduler only where asked, and only in runserver's serving child
        # (which its watcher kills 0.25 s after a Ctrl-C: --noreload stops it cleanly).
        if os.environ.get("MULTILOCK_SCHEDULER") != "in-process":
            return
        reloading = "runserver" in sys.argv and "--noreload" not in sys.argv
        if reloading and os.environ.get("RUN_MAIN") != "true":
            return  # the autoreloader's watcher: it serves nothing
        from .scheduling import scheduler

        scheduler.start_in_background()  # its own thread and event loop
        atexit.register(scheduler.shutdown)  # jobs finish, leases are released


# --8<-- [end:ready]
