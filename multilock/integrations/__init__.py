"""Exactly once per tick for the schedulers people already run.

:mod:`multilock.integrations.apscheduler` (APScheduler 3, ``pip install
'multilock[apscheduler]'``) and :mod:`multilock.integrations.celery` (Celery beat,
``pip install 'multilock[celery]'``). Each module imports its scheduler, so import the
one you use; for any other scheduler, :func:`multilock.once_per_tick` decorates the job.
"""
