"""Faults on a private nats-server: down, frozen, restarted; credentials; KV interop.

Nothing here touches the shared server: each test gets its own ``nats-server`` with
JetStream on a free port (``private_nats``), which it may kill or freeze.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import nats
import pytest
from nats.js.api import KeyValueConfig

import multilock
from multilock.errors import BackendUnavailable, MultilockError
from multilock.testing import poll
from multilock.testing._servers import checks
from multilock.testing._servers.nats import PrivateNats
from multilock_nats import NatsLease

pytestmark = pytest.mark.faults

TIMEOUT = 0.5  # request timeouts of the lockers under test: "never a hang" means this
PROMPT = TIMEOUT + 1.5  # what a failing call may take, with room for a loaded machine
SECRET = "s3cret-pa55"


def _url(server: PrivateNats, userinfo: str = "", **options: object) -> str:
    base = {"timeout": TIMEOUT, "connect_timeout": TIMEOUT, **options}
    return server.url(userinfo=userinfo) + "?" + "&".join(f"{k}={v}" for k, v in base.items())


def _held(lease: object) -> NatsLease:
    assert isinstance(lease, NatsLease), f"expected a lease, got {lease!r}"
    return lease


def _raises_promptly(call: Callable[[], object]) -> BackendUnavailable:
    return checks.raises_promptly(call, PROMPT)


def test_server_down_raises_then_the_locker_recovers(
    private_nats: Callable[..., PrivateNats],
) -> None:
    server = private_nats()
    with multilock.connect(_url(server)) as locker:
        _held(locker.try_acquire("before")).release()
        server.stop()
        _raises_promptly(lambda: locker.try_acquire("while-down"))
        server.start()
        poll("the locker recovering", lambda: locker.try_acquire("after"), 20).release()


def test_frozen_server_raises_instead_of_hanging(
    private_nats: Callable[..., PrivateNats],
) -> None:
    server = private_nats()
    checks.frozen_acquire_fails_promptly(_url(server), server, PROMPT)


def test_a_lease_not_renewed_in_time_is_lost_by_its_expiry(
    private_nats: Callable[..., PrivateNats],
) -> None:
    server = private_nats()
    with multilock.connect(_url(server, ttl="1s")) as locker:
        start = time.monotonic()
        lease = _held(locker.try_acquire("unconfirmed"))
        server.freeze()  # renewals now time out: the lease cannot be confirmed
        try:
            assert lease.lost.wait(5)
            lost_after = time.monotonic() - start
        finally:
            server.thaw()
        assert lost_after <= 1.0 + 0.5, f"lost fired {lost_after:.2f}s after a 1s lease"
        assert "before its expiry" in (lease.lost.reason or "")


@pytest.mark.parametrize(
    ("flags", "good", "bad"),
    [
        (("--user", "app", "--pass", SECRET), f"app:{SECRET}", "app:wrong-password"),
        (("--auth", SECRET), f":{SECRET}", ":wrong-token"),
    ],
    ids=["user-password", "token"],
)
def test_credentials_work_and_a_refusal_is_not_an_outage(
    private_nats: Callable[..., PrivateNats], flags: tuple[str, ...], good: str, bad: str
) -> None:
    server = private_nats(*flags)
    with multilock.connect(_url(server, good)) as locker:
        _held(locker.try_acquire("authed")).release()
    with multilock.connect(_url(server, bad)) as locker:
        with pytest.raises(MultilockError) as raised:
            locker.try_acquire("refused")
        assert "wrong" not in str(raised.value)
        assert SECRET not in str(raised.value)


async def _kv(server: PrivateNats, bucket: str, ttl: float | None) -> Any:
    nc = await nats.connect(f"nats://127.0.0.1:{server.port}", allow_reconnect=False)
    return nc, await nc.jetstream().create_key_value(KeyValueConfig(bucket=bucket, ttl=ttl))


def test_a_bucket_without_ttl_is_refused(private_nats: Callable[..., PrivateNats]) -> None:
    server = private_nats()

    async def make() -> None:
        nc, _ = await _kv(server, "forever", None)
        await nc.close()

    asyncio.run(make())
    url = _url(server).replace("/faults?", "/forever?")
    with multilock.connect(url) as locker, pytest.raises(MultilockError, match="has no TTL"):
        locker.try_acquire("x")


def test_a_key_deleted_by_a_kv_client_is_free(private_nats: Callable[..., PrivateNats]) -> None:
    """``nats kv del`` leaves a delete marker: the next acquire takes the key anyway."""
    server = private_nats()
    with multilock.connect(_url(server)) as locker:
        lease = _held(locker.try_acquire("job"))

        async def delete() -> None:
            nc = await nats.connect(f"nats://127.0.0.1:{server.port}", allow_reconnect=False)
            kv = await nc.jetstream().key_value("faults")
            await kv.delete("job")
            await nc.close()

        asyncio.run(delete())
        again = _held(locker.try_acquire("job"))
        assert again.fencing_token > lease.fencing_token
        assert not lease.release()  # the first holder's purge cannot touch the new key
        assert again.release()


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("operation", ["connect", "release", "extend", "locks"])
def test_no_call_outlives_its_timeout_on_a_frozen_server(
    private_nats: Callable[..., PrivateNats], api: str, operation: checks.Operation
) -> None:
    """SIGSTOP: the kernel still completes TCP handshakes and takes bytes; nothing
    answers. A new connection, a release, an extend and ``locks()`` each give up within
    their timeout."""
    server = private_nats()
    assert checks.frozen_outcome(_url(server), server, api, operation, PROMPT) is BackendUnavailable


@pytest.mark.parametrize("api", ["sync", "async"])
def test_locks_lists_every_key_of_its_prefix_and_nothing_else(
    private_nats: Callable[..., PrivateNats], api: str
) -> None:
    """Many keys, another prefix's keys and a KV client's delete marker in one bucket."""
    server = private_nats()
    ours = [f"job-{i}" for i in range(300)]

    async def main() -> None:
        connect = multilock.connect if api == "sync" else multilock.connect_async
        mine: Any = connect(_url(server, prefix="app."))
        other: Any = connect(_url(server, prefix="other."))
        try:
            assert await checks.call(mine.locks()) == []  # an empty bucket: no wait for nothing
            held = await checks.call(mine.try_acquire_many(ours))
            assert await checks.call(other.try_acquire("job-0")) is not None
            assert await checks.call(mine.try_acquire("deleted")) is not None
            nc = await nats.connect(f"nats://127.0.0.1:{server.port}", allow_reconnect=False)
            await (await nc.jetstream().key_value("faults")).delete("app.deleted")
            await nc.close()
            start = time.monotonic()
            listed = await checks.call(mine.locks())
            assert time.monotonic() - start < PROMPT
            assert sorted(info.name for info in listed) == sorted(ours)
            tokens = {name: lease.fencing_token for name, lease in held.items()}
            for info in listed:
                assert info.details["fencing_token"] == tokens[info.name]
                assert info.expires_at is not None
        finally:
            for locker in (mine, other):
                await checks.call(locker.close() if api == "sync" else locker.aclose())

    asyncio.run(main())
