"""Running the scripts on a Redis Cluster, and the choice of a locker's link.

A cluster runs a script only on keys of one hash slot. A name's two keys share
its slot (the name is their hash tag), so a call for one name goes as it is;
calls for many names are split by slot before they reach the link (see
``_keys.calls``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import NoScriptError

from .._config import (
    CLUSTER,
    AsyncClusterClient,
    RedisConfig,
    async_client,
    async_cluster_client,
    async_forget_slots,
    async_learn_slots,
)
from .._scripts import Lua
from .._wire import wait_time_ms
from ._lua import AsyncLink, Request, reloading

__all__ = ["AsyncClusterLink", "new_link"]


def new_link(config: RedisConfig, timeout: float | None = None) -> AsyncLink | AsyncClusterLink:
    """The link to the Redis ``config`` names (it connects on first use);
    ``timeout`` caps its socket timeouts."""
    if config.topology == CLUSTER:
        return AsyncClusterLink(config, timeout)
    return AsyncLink(async_client(config, timeout))


class AsyncClusterLink:
    """A locker's way to a Redis Cluster: redis-py's cluster client, made on first use.

    redis-py sends each call to the primary of its slot, follows ``MOVED`` and
    ``ASK`` redirections (the command did not run) and, after a connection error
    or a timeout, reads the cluster's slots again before the next call. It does
    not send the call again itself (retries are off), but its pipelines send a
    command again after a connection error: the scripts are written so that
    running one twice answers as running it once (see ``_scripts``).
    """

    __slots__ = ("_client", "_config", "_making", "_timeout")

    def __init__(self, config: RedisConfig, timeout: float | None = None) -> None:
        self._config = config
        self._timeout = timeout
        self._client: AsyncClusterClient | None = None
        self._making = threading.Lock()  # two threads of a sync locker may call first

    def _cluster(self) -> Any:
        """The client (an ``AsyncClusterClient``; redis-py's sync one has no type
        hints). The sync one connects when it is made, and is made again after that
        failed."""
        with self._making:
            if self._client is None:
                self._client = async_cluster_client(self._config, self._timeout)
            return self._client

    async def run(self, script: Lua, keys: list[str], args: list[str | int]) -> Any:
        """Run ``script`` on ``keys`` (of one slot) with ``args``; its reply."""
        client = self._cluster()
        try:
            return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            # Only the primary that answered needs it (and all of them might not
            # answer during a failover).
            node = client.get_node_from_key(keys[0])
            await client.execute_command("SCRIPT", "LOAD", script.source, target_nodes=node)
            return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    async def run_pipelined(
        self, script: Lua, requests: Iterable[Request], answered: Callable[[int, Any], None]
    ) -> None:
        """Run ``script`` once per request (each on keys of one slot), every primary's
        requests sent before any answer is read, and hand each answer to
        ``answered(i, answer)``. An error answer does not stop the others; the first
        is raised once every answer is in."""
        requests = list(requests)
        answers, _ = await self._pipeline(script, requests, None)
        failed: BaseException | None = None
        for i, answer in enumerate(answers):
            if isinstance(answer, NoScriptError):  # that primary lacked it: load, run again
                try:
                    answer = await self.run(script, *requests[i])
                except Exception as exc:
                    answer = exc
            if isinstance(answer, BaseException):
                failed = failed or answer
                continue
            try:
                answered(i, answer)
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    async def run_waited(
        self, script: Lua, requests: list[Request], wait: tuple[int, float]
    ) -> tuple[list[Any], int]:
        """As ``AsyncLink.run_waited``: the answers, and the fewest replicas of any
        primary written to that acknowledged its writes (-1 when that is not known).

        Each primary's ``WAIT`` follows its requests on the same connection. Were a
        request redirected (its slot has moved), it ran on another primary than the
        one its ``WAIT`` asked: then nothing vouches for it, and -1 is answered.
        """
        client = self._cluster()

        async def load() -> None:
            primaries = {client.get_node_from_key(keys[0]).name: keys[0] for keys, _ in requests}
            for key in primaries.values():
                node = client.get_node_from_key(key)
                await client.execute_command("SCRIPT", "LOAD", script.source, target_nodes=node)

        return await reloading(lambda: self._pipeline(script, requests, wait), load)

    async def _pipeline(
        self, script: Lua, requests: list[Request], wait: tuple[int, float] | None
    ) -> tuple[list[Any], int]:
        """Send ``requests`` in one cluster pipeline (then, with ``wait``, a ``WAIT``
        on each primary written to); their answers, errors in place, and the fewest
        replicas that acknowledged (-1 without ``wait``, or when a slot moved)."""
        client = self._cluster()
        if wait is not None:
            await async_learn_slots(client)  # the primaries of the WAITs: known before sending
        pipe = client.pipeline(transaction=False)
        owners: list[Any] = []
        for keys, args in requests:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        if wait is not None:
            owners = [client.get_node_from_key(keys[0]) for keys, _ in requests]
            replicas, timeout = wait
            wait_ms = wait_time_ms(timeout, self._timeout or self._config.socket_timeout)
            primaries = {node.name: node for node in owners}
            for node in primaries.values():
                pipe.execute_command("WAIT", replicas, wait_ms, target_nodes=node)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except client.ERRORS_ALLOW_RETRY:
            await async_forget_slots(client)
            raise
        if any(isinstance(reply, client.ERRORS_ALLOW_RETRY) for reply in replies):
            await async_forget_slots(client)
        answers = replies[: len(requests)]
        if wait is None:
            return answers, -1
        acks = replies[len(requests) :]
        for ack in acks:
            if isinstance(ack, BaseException):
                raise ack
        moved = any(
            client.get_node_from_key(keys[0]).name != owner.name
            for (keys, _), owner in zip(requests, owners, strict=True)
        )
        return answers, -1 if moved else min(int(ack) for ack in acks)

    async def aclose(self) -> None:
        """Close the client's connections."""
        with self._making:
            client, self._client = self._client, None
        if client is not None:
            await client.aclose()
