"""Faults on a private etcd: down, frozen, a lease revoked, members that fail, auth.

Nothing here touches the shared server: each test gets its own etcd on free ports
(the ``private_etcd`` fixture), which it may stop, freeze or kill.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

import multilock
from multilock.errors import BackendUnavailable, MultilockError
from multilock.testing import TcpProxy, apoll, poll
from multilock.testing._servers import checks
from multilock.testing._servers.etcd import PrivateEtcd
from multilock.testing._servers.process import free_port
from multilock_etcd import EtcdLease, EtcdLocker

pytestmark = pytest.mark.faults

TIMEOUT = 0.5  # request timeouts of the lockers under test: "never a hang" means this
PROMPT = TIMEOUT + 1.5  # what a failing call may take, with room for a loaded machine
SECRET = "s3cret-pa55"


def _url(server: PrivateEtcd, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"timeout": TIMEOUT, **options}.items())
    return f"{server.url}?{query}"


def _held(lease: object) -> EtcdLease:
    assert isinstance(lease, EtcdLease), f"expected a lease, got {lease!r}"
    return lease


def _raises_promptly(call: Callable[[], object]) -> BackendUnavailable:
    return checks.raises_promptly(call, PROMPT)


def _recovers(locker: Any, name: str) -> EtcdLease:
    return _held(poll("the locker recovering", lambda: locker.try_acquire(name), 20))


def test_server_down_raises_then_the_locker_recovers(
    private_etcd: Callable[..., PrivateEtcd],
) -> None:
    server = private_etcd(keep_data=True)
    with multilock.connect(_url(server)) as locker:
        _held(locker.try_acquire("before")).release()
        server.stop()
        error = _raises_promptly(lambda: locker.try_acquire("while-down"))
        assert "while acquiring" in str(error)
        server.start()
        _recovers(locker, "after").release()


def test_frozen_server_raises_instead_of_hanging(
    private_etcd: Callable[..., PrivateEtcd],
) -> None:
    server = private_etcd()
    checks.frozen_acquire_fails_promptly(_url(server), server, PROMPT)
    with multilock.connect(_url(server)) as locker:
        _held(locker.try_acquire("sync-warm-up")).release()
        server.freeze()
        try:
            _raises_promptly(lambda: locker.try_acquire("frozen"))
        finally:
            server.thaw()
        _recovers(locker, "thawed").release()


def test_a_revoked_etcd_lease_loses_every_lock_on_it(
    private_etcd: Callable[..., PrivateEtcd],
) -> None:
    server = private_etcd()
    with (
        multilock.connect(_url(server, ttl="3s")) as locker,
        multilock.connect(_url(server)) as other,
    ):
        leases = [_held(locker.try_acquire(f"job-{i}")) for i in range(3)]
        assert isinstance(locker, EtcdLocker)
        slot = locker._keeper.slot(3.0)
        assert slot is not None
        server.etcdctl("lease", "revoke", f"{slot.id:x}")
        for lease in leases:
            assert lease.lost.wait(5), f"{lease.name} not reported lost"
            assert "deleted" in (lease.lost.reason or "") or "lease" in (lease.lost.reason or "")
        assert other.try_acquire("job-0") is not None  # the keys went with the lease
        assert not leases[0].release()
        # The next acquire of that ttl gets a new etcd lease.
        _held(locker.try_acquire("job-again")).release()


def test_a_dead_member_is_skipped(private_etcd: Callable[..., PrivateEtcd]) -> None:
    server = private_etcd()
    dead = free_port()
    url = f"etcd://127.0.0.1:{dead},127.0.0.1:{server.port}/faults?timeout={TIMEOUT}"
    with multilock.connect(url) as locker:
        lease = _held(locker.try_acquire("failover"))
        assert lease.release()


def test_a_lost_answer_leaves_no_lock(private_etcd: Callable[..., PrivateEtcd]) -> None:
    """An acquire whose answer was lost may have been granted: the keeper deletes the key
    if it holds the acquire's token (the orphan path, driven here by hand)."""
    server = private_etcd()
    with multilock.connect(_url(server)) as locker, multilock.connect(_url(server)) as other:
        assert isinstance(locker, EtcdLocker)
        probe = _held(locker.try_acquire("probe"))  # makes the locker's etcd lease
        slot = probe._slot
        key, value = probe._wire_key, probe._value
        probe._released = True  # forget it as if its answer had been lost
        locker._untrack(probe)
        locker._keeper.orphan(key, value, slot.id)
        lease = poll("the orphaned key being deleted", lambda: other.try_acquire("probe"), 5)
        lease.release()


def test_authentication_and_an_expired_token(private_etcd: Callable[..., PrivateEtcd]) -> None:
    server = private_etcd(args="--auth-token simple --auth-token-ttl 1")
    # The password on stdin: never on a command line, even a test's.
    server.etcdctl("user", "add", "root", "--interactive=false", stdin=f"{SECRET}\n")
    server.etcdctl("auth", "enable")
    url = _url(server).replace("etcd://", f"etcd://root:{SECRET}@")
    with multilock.connect(url) as locker:
        _held(locker.try_acquire("authed")).release()
        time.sleep(2.5)  # the simple token expires after 1 s of disuse
        _held(locker.try_acquire("authed-again")).release()
    wrong = _url(server).replace("etcd://", "etcd://root:wrong-password@")
    with multilock.connect(wrong) as locker:
        with pytest.raises(MultilockError) as raised:
            locker.try_acquire("refused")
        assert not isinstance(raised.value, BackendUnavailable), "bad credentials are not an outage"
        assert "authentication failed" in str(raised.value)
        assert "wrong-password" not in str(raised.value)
    anonymous = _url(server)
    with multilock.connect(anonymous) as locker, pytest.raises(MultilockError):
        locker.try_acquire("anonymous")


def test_locks_lists_holders_with_their_expiry(private_etcd: Callable[..., PrivateEtcd]) -> None:
    server = private_etcd()

    async def main() -> None:
        async with multilock.connect_async(_url(server, ttl="5s")) as locker:
            lease = await locker.try_acquire("listed")
            assert lease is not None
            infos = locker.locks()  # type: ignore[attr-defined]
            [info] = [info for info in infos if info.name == "listed"]
            assert info.holder == lease.token
            assert info.details["fencing_token"] == lease.fencing_token
            assert info.expires_at is not None
            await lease.release()

            async def gone() -> bool:
                return not locker.locks()  # type: ignore[attr-defined]

            await apoll("the released lock leaving locks()", gone, 2)

    asyncio.run(main())


def test_every_request_keeps_json_shapes() -> None:
    """The bodies sent are JSON etcd's gateway takes (a smoke check of the builders)."""
    from multilock_etcd._wire import acquire_many_request, release_request

    body = json.loads(acquire_many_request(["YQ=="], ["dg=="], 7))
    assert body["success"][0]["request_txn"]["success"][0]["request_put"]["lease"] == "7"
    assert json.loads(release_request("YQ==", 5))["compare"][0]["create_revision"] == "5"


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("operation", ["connect", "release", "extend", "locks"])
def test_no_call_outlives_its_timeout_on_a_frozen_server(
    private_etcd: Callable[..., PrivateEtcd], api: str, operation: checks.Operation
) -> None:
    """SIGSTOP: the kernel still completes TCP handshakes and takes bytes; nothing
    answers. A new connection, a release, an extend and ``locks()`` each give up within
    ``timeout``."""
    server = private_etcd()
    lock_url = _url(server, connect_timeout=TIMEOUT)
    assert checks.frozen_outcome(lock_url, server, api, operation, PROMPT) is BackendUnavailable


@pytest.mark.parametrize("api", ["sync", "async"])
def test_an_answer_trickling_in_is_cut_at_timeout(
    private_etcd: Callable[..., PrivateEtcd],
    tcp_proxy: Callable[[tuple[str, int]], TcpProxy],
    api: str,
) -> None:
    """A byte every 0.1 s: each receive gets one before a per-receive timeout of 0.5 s
    would end it, and an answer of a few hundred bytes would take most of a minute."""
    proxy = tcp_proxy(("127.0.0.1", private_etcd().port))
    lock_url = f"etcd://127.0.0.1:{proxy.port}/faults?timeout={TIMEOUT}"

    async def main() -> None:
        locker: Any = (multilock.connect if api == "sync" else multilock.connect_async)(lock_url)
        try:
            await checks.call(locker.try_acquire("warm-up"))  # the lease granted, a connection kept
            proxy.trickle(0.1)
            start = time.monotonic()
            with pytest.raises(BackendUnavailable):
                await checks.call(locker.try_acquire("trickled"))
            elapsed = time.monotonic() - start
            assert elapsed < PROMPT, f"took {elapsed:.2f}s"
        finally:
            proxy.trickle(None)
            await checks.call(locker.close() if api == "sync" else locker.aclose())

    asyncio.run(main())
