"""A lock holder in a separate process, driven by the conformance suite over pipes.

    python -m multilock.testing._child sync|async URL hold NAME TTL
    python -m multilock.testing._child sync|async URL count NAME ROUNDS PATH
    python -m multilock.testing._child sync|async URL serve
    python -m multilock.testing._child sync|async URL claim NAME FIRE COUNT

A URL of ``-`` is read from the first line of stdin (how the suite passes it: a
password must not show in the process list).

``hold`` takes NAME (TTL seconds, or ``-`` for the default), prints
``acquired <fencing token>``, then obeys stdin lines: ``release`` (prints
``released True|False``), ``extend`` (prints ``extended`` or
``extend-failed <error class> <is LockLost>``) and ``exit``.
``count`` takes NAME ROUNDS times; each time, while holding it, it appends
the lease's fencing token to ``PATH.fences`` and bumps the number in ``PATH``
non-atomically (read, pause, write); then prints ``done``. ``serve`` opens a
locker, prints ``ready``, then answers each stdin line, a JSON command of
:class:`LockerServer`, with ``reply <JSON>``, until ``exit`` or end of input.
``claim`` prints ``ready``, waits for a ``go`` line, then claims the
tick FIRE (epoch seconds) of NAME-0, NAME-1, ... (COUNT names) one by one and
prints ``won`` followed by the indexes of the names whose tick it won.
Failures print ``error <message>`` and exit 1.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import sys
import time
from contextlib import suppress
from typing import Any

from multilock.errors import LockLost

from ._api import Api, in_thread, make_api

__all__ = ["LockerServer", "main"]

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


async def _claim(api: Api, name: str, fire: float, count: int) -> None:
    locker = await api.connect()
    _say("ready")
    await in_thread(sys.stdin.readline)  # "go": every claimer starts together
    won = []
    for i in range(count):
        got = await api.claim_ticks(locker, {f"{name}-{i}": fire})
        if got[f"{name}-{i}"]:
            won.append(str(i))
    _say(" ".join(["won", *won]))


def _read_and_log(path: str, fencing_token: object) -> int:
    with open(f"{path}.fences", "a") as fences:
        fences.write(f"{fencing_token}\n")
    with open(path) as counter:
        return int(counter.read() or 0)


def _write(path: str, value: int) -> None:
    with open(path, "w") as counter:
        counter.write(str(value))


class LockerServer:
    """One locker that obeys JSON-able commands and answers in JSON-able dicts.

    The model check (:mod:`._checks_model`) drives each of its lockers through
    one of these -- in this process, or in a child over a pipe (``serve``) -- so
    both kinds answer alike. Leases are named by ids this server hands out.
    Commands (``op`` and its arguments): ``acquire`` (``name``, ``ttl``),
    ``acquire_many`` (``names``, ``ttl``), ``release`` (``id``), ``extend``
    (``id``, ``ttl``), ``locks``, ``close`` (closes the locker and opens a new
    one), ``reset`` (releases what is held and forgets every lease), ``states``.
    Every answer carries ``states``: each known lease's ``[held, lost]`` as of
    the answer; a call that raised answers ``error`` (its class), ``message``
    and ``lock_lost`` instead of its result.
    """

    def __init__(self, api: Api) -> None:
        self.api = api
        self._locker: Any = None
        self._leases: dict[int, Any] = {}
        self._ids = itertools.count(1)

    async def start(self) -> None:
        """Open the locker."""
        self._locker = await self.api.connect()

    async def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        """Carry out one command; its answer."""
        try:
            answer: dict[str, Any] = await getattr(self, "_" + command["op"])(command)
        except Exception as exc:
            answer = {
                "error": type(exc).__name__,
                "message": str(exc),
                "lock_lost": isinstance(exc, LockLost),
            }
        answer["states"] = {
            str(i): [lease.held, lease.lost.is_set()] for i, lease in self._leases.items()
        }
        return answer

    def _describe(self, lease: Any) -> dict[str, Any] | None:
        if lease is None:
            return None
        lease_id = next(self._ids)
        self._leases[lease_id] = lease
        expires = lease.expires_at
        return {
            "id": lease_id,
            "name": lease.name,
            "key": lease.key,
            "token": lease.token,
            "fence": lease.fencing_token,
            "expires_at": None if expires is None else expires.timestamp(),
        }

    async def _acquire(self, command: dict[str, Any]) -> dict[str, Any]:
        lease = await self.api.try_acquire(self._locker, command["name"], command["ttl"])
        return {"lease": self._describe(lease)}

    async def _acquire_many(self, command: dict[str, Any]) -> dict[str, Any]:
        got = await self.api.try_acquire_many(self._locker, command["names"], command["ttl"])
        return {"names": list(got), "leases": [self._describe(lease) for lease in got.values()]}

    async def _release(self, command: dict[str, Any]) -> dict[str, Any]:
        return {"released": await self.api.release(self._leases[command["id"]])}

    async def _extend(self, command: dict[str, Any]) -> dict[str, Any]:
        lease = self._leases[command["id"]]
        await self.api.extend(lease, command["ttl"])
        expires = lease.expires_at
        return {"expires_at": None if expires is None else expires.timestamp()}

    async def _locks(self, command: dict[str, Any]) -> dict[str, Any]:
        found = await self.api.locks(self._locker)
        return {"locks": [[info.name, info.key] for info in found]}

    async def _close(self, command: dict[str, Any]) -> dict[str, Any]:
        await self.api.close(self._locker)
        self._locker = await self.api.connect()
        return {}

    async def _reset(self, command: dict[str, Any]) -> dict[str, Any]:
        for lease in self._leases.values():
            if lease.held:
                with suppress(Exception):  # a failure here is the next command's to show
                    await self.api.release(lease)
        self._leases.clear()
        return {}

    async def _states(self, command: dict[str, Any]) -> dict[str, Any]:
        return {}


async def _serve(api: Api) -> None:
    server = LockerServer(api)
    await server.start()
    _say("ready")
    while True:
        line = (await in_thread(sys.stdin.readline)).strip()
        if not line or line == "exit":
            return
        _say("reply " + json.dumps(await server.handle(json.loads(line))))


async def _main(argv: list[str]) -> None:
    kind, url, command, *rest = argv
    if url == "-":
        url = sys.stdin.readline().strip()
    api = make_api(kind, url)
    try:
        if command == "serve":
            await _serve(api)
        elif command == "hold":
            name, *rest = rest
            await _hold(api, name, None if rest[0] == "-" else float(rest[0]))
        elif command == "claim":
            name, fire, count = rest
            await _claim(api, name, float(fire), int(count))
        elif command == "count":
            name, *rest = rest
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
