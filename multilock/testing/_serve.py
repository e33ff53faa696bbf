"""A process of lockers the conformance suite drives with JSON lines (stale holders).

    python -m multilock.testing._serve sync|async URL

A URL of ``-`` is read from the first line of stdin (how the suite passes it).
Each stdin line is one JSON request, answered by one JSON line on stdout:

* ``{"do": "take", "locker": L, "names": [...], "ttl": T, "within": S}``: locker
  ``L`` (opened on first use) takes each name in order, polling up to ``S``
  seconds for each; answers ``{"fences": {name: fencing_token}}``.
* ``{"do": "ops", "locker": L, "plan": {name: [op, ...]}}``: runs each name's
  operations on ``L``'s lease of it (see :func:`run_ops`); answers
  ``{"outcomes": {name: [outcome, ...]}}``.
* ``{"do": "release", "locker": L}``: releases every lease ``L`` took; answers
  ``{"released": {name: bool}}``.
* ``{"do": "exit"}`` (or end of input) ends the process.

Failures answer ``{"error": message}``. The first locker used is the process's
first: a check that wants a freshly started process's first acquisitions (tokens
drawn from a per-process counter) asks this process to take them first.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from multilock.errors import LockLost

from ._api import Api, in_thread, make_api

__all__ = ["EXTEND_TTL", "OPS", "main", "run_ops"]

EXTEND_TTL = 30.0
"""The ttl of the ``extend(ttl)`` operation: long, so a stale extend that takes over
the name would keep it well past the check."""

OPS = ("release", "extend", "extend(ttl)")
"""The lease operations a stale holder tries."""


async def run_ops(api: Api, lease: Any, ops: list[str]) -> list[str]:
    """Run ``ops`` on ``lease`` in order. Outcomes: ``release`` gives ``"True"`` or
    ``"False"``; an extend gives ``"extended"``, ``"LockLost"`` (or a subclass), or
    the class name of any other error."""
    outcomes = []
    for op in ops:
        if op == "release":
            outcomes.append(str(await api.release(lease)))
            continue
        try:
            await api.extend(lease, EXTEND_TTL if op == "extend(ttl)" else None)
        except LockLost:
            outcomes.append("LockLost")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
        else:
            outcomes.append("extended")
    return outcomes


class _Server:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.lockers: dict[str, Any] = {}
        self.leases: dict[str, dict[str, Any]] = {}

    async def _locker(self, label: str) -> Any:
        if label not in self.lockers:
            self.lockers[label] = await self.api.connect()
            self.leases[label] = {}
        return self.lockers[label]

    async def take(
        self, label: str, names: list[str], ttl: float | None, within: float
    ) -> dict[str, Any]:
        locker = await self._locker(label)
        fences = {}
        for name in names:
            deadline = time.monotonic() + within
            while (lease := await self.api.try_acquire(locker, name, ttl)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not take {name!r} within {within:g} s")
                await asyncio.sleep(0.02)
            self.leases[label][name] = lease
            fences[name] = lease.fencing_token
        return {"fences": fences}

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        do, label = request["do"], request.get("locker", "")
        if do == "take":
            return await self.take(label, request["names"], request["ttl"], request["within"])
        if do == "ops":
            leases = self.leases[label]
            return {
                "outcomes": {
                    name: await run_ops(self.api, leases[name], ops)
                    for name, ops in request["plan"].items()
                }
            }
        if do == "release":
            leases = self.leases.pop(label, {})
            return {"released": {name: await self.api.release(v) for name, v in leases.items()}}
        raise ValueError(f"unknown request {do!r}")


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


async def _main(kind: str, url: str) -> None:
    server = _Server(make_api(kind, url))
    try:
        while True:
            line = (await in_thread(sys.stdin.readline)).strip()
            if not line:
                return
            request = json.loads(line)
            if request["do"] == "exit":
                return
            try:
                _say(await server.handle(request))
            except Exception as exc:
                _say({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        await server.api.close_all()


def main(argv: list[str] | None = None) -> int:
    """Serve requests until told to exit (see the module docstring)."""
    kind, url = sys.argv[1:3] if argv is None else argv
    if url == "-":  # the suite's way: a password must not show in the process list
        url = sys.stdin.readline().strip()
    asyncio.run(_main(kind, url))
    return 0


if __name__ == "__main__":
    os._exit(main())  # daemon threads of a hung backend call must not delay the exit
