"""``python manage.py runscheduler``: the jobs in a process of their own."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_jobs.scheduling import scheduler


# --8<-- [start:command]
class Command(BaseCommand):  # type: ignore[misc]
    help = "Run the multilock scheduler until SIGTERM or SIGINT."

    def handle(self, *args: Any, **options: Any) -> None:
        scheduler.run()  # blocks; SIGTERM/SIGINT: jobs finish, leases are released


# --8<-- [end:command]
