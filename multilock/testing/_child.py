"""A lock holder in a separate process, driven by the conformance suite over pipes.

    python -m multilock.testing._child sync|async URL hold NAME TTL
    python -m multilock.testing._child sync|async URL count NAME ROUNDS PATH

A URL of ``-`` is read from the first line of stdin (how the suite passes it: a
password must not show in the process list).

``hold`` takes NAME (TTL seconds, or ``-`` for the default), prints
``acquired <fencing token>``, then obeys stdin lines: ``release`` (prints
``released True|False``), ``extend`` (prints ``extended`` or
``extend-failed <error class> <is LockLost>``) and ``exit``.
``count`` takes NAME ROUNDS times; each time, while holding it, it appends
the lease's fencing token to ``PATH.fences`` and bumps the number in ``PATH``
non-atomically (read, pause, write); then prints ``done``. Failures print
``error <message>`` and exit 1.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from typing import Any

from multilock.errors import LockLost

from ._api import Api, in_thread, make_api

__all__ = ["main"]

_ACQUIRE_DEADLINE = 30.0


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _take(api: Api, locker: Any, name: str, ttl: float | None) -> Any:
    deadline = time.monotonic() + _ACQUIRE_DEADLINE
    while time.monotonic() < deadline:
        lease = await api.try_acquire(locker, name, ttl)
        if lease is not None:
            return lease
        # Jittered backoff: busy contenders must not starve the holder of CPU.
        await asyncio.sleep(random.uniform(0.001, 0.004))
    raise TimeoutError(f"could not take {name!r} within {_ACQUIRE_DEADLINE:g} s")


async def _hold(api: Api, name: str, ttl: float | None) -> None:
    lease = await _take(api, await api.connect(), name, ttl)
    _say(f"acquired {lease.fencing_token}")
    while True:
        command = (await in_thread(sys.stdin.readline)).strip()
        if command == "release":
            _say(f"released {await api.release(lease)}")
        elif command == "extend":
            try:
                await api.extend(lease, ttl)
            except Exception as exc:
                _say(f"extend-failed {type(exc).__name__} {isinstance(exc, LockLost)}")
            else:
                _say("extended")
        else:  # "exit", or the parent closed the pipe
            return


async def _count(api: Api, name: str, rounds: int, path: str) -> None:
    locker = await api.connect()
    for _ in range(rounds):
        lease = await _take(api, locker, name, None)
        seen = _read_and_log(path, lease.fencing_token)
        await asyncio.sleep(0.001)  # widen the window a second holder would fall into
        _write(path, seen + 1)
        await api.release(lease)
    _say("done")


def _read_and_log(path: str, fencing_token: object) -> int:
    with open(f"{path}.fences", "a") as fences:
        fences.write(f"{fencing_token}\n")
    with open(path) as counter:
        return int(counter.read() or 0)


def _write(path: str, value: int) -> None:
    with open(path, "w") as counter:
        counter.write(str(value))


async def _main(argv: list[str]) -> None:
    kind, url, command, name, *rest = argv
    if url == "-":
        url = sys.stdin.readline().strip()
    api = make_api(kind, url)
    try:
        if command == "hold":
            await _hold(api, name, None if rest[0] == "-" else float(rest[0]))
        elif command == "count":
            await _count(api, name, int(rest[0]), rest[1])
        else:
            raise ValueError(f"unknown command {command!r}")
    finally:
        await api.close_all()


def main(argv: list[str] | None = None) -> int:
    """Run one command (see the module docstring); the exit status says how it went."""
    try:
        asyncio.run(_main(sys.argv[1:] if argv is None else argv))
    except Exception as exc:
        _say(f"error {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    os._exit(main())  # daemon threads of a hung backend call must not delay the exit
