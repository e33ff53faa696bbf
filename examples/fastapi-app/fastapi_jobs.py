"""A FastAPI app that runs a multilock Scheduler in its lifespan.

    MULTILOCK_LOCK_URL=postgresql://app@db/app uvicorn fastapi_jobs:app

Every replica of the web app runs the scheduler (so does every uvicorn worker: each is
a replica); each tick of each job runs on one of them. The scheduler starts before
the first request is served and stops -- running jobs finished, every lease
released -- when uvicorn shuts down (SIGTERM, SIGINT).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

from fastapi import FastAPI

import multilock

# --8<-- [start:scheduler]
# No URL in the code: the lock URL (and its password) comes from the environment.
scheduler = multilock.Scheduler(os.environ.get("MULTILOCK_LOCK_URL"))
ran: list[datetime] = []  # the ticks this process ran, for /runs


@scheduler.job(multilock.every(seconds=1), name="fastapi-example-heartbeat")
async def heartbeat() -> None:
    """A job: runs in the app's own event loop, once per tick across replicas."""
    ran.append(multilock.current_run().fire_time)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with scheduler:  # start() before serving, stop() at shutdown
        yield


app = FastAPI(lifespan=lifespan)
# --8<-- [end:scheduler]


@app.get("/runs")
def runs() -> dict[str, object]:
    """The ticks this process ran, and whether its scheduler's backend answers."""
    ready, why = scheduler.readiness()
    return {"ready": ready, "why": why, "ran": [tick.isoformat() for tick in ran]}
