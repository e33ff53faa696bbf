"""``multilock.testing.TcpProxy``: each fault does what it says, against a real echo
server on loopback, and closing leaves no thread or socket behind."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

import pytest

from multilock.testing import TcpProxy, poll

DELAY = 0.2
QUIET = 0.3  # how long "nothing arrives" is watched


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A TCP server on loopback that sends back what it gets, until the client closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    threads: list[threading.Thread] = []

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass  # a reset: what some tests do on purpose

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=answer, args=(conn,), daemon=True)
            threads.append(thread)
            thread.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    yield listener.getsockname()
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    acceptor.join(5)
    for thread in threads:
        thread.join(5)


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[TcpProxy]:
    with TcpProxy(echo) as proxy:
        yield proxy


@pytest.fixture
def client(proxy: TcpProxy) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        yield sock


def _receive(sock: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        if not chunk:
            break
        got += chunk
    return got


def _round_trip(sock: socket.socket, data: bytes) -> float:
    start = time.monotonic()
    sock.sendall(data)
    assert _receive(sock, len(data)) == data
    return time.monotonic() - start


def _silent(sock: socket.socket) -> bool:
    sock.settimeout(QUIET)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)
    return False


def test_forwards_and_records_what_clients_sent(proxy: TcpProxy, client: socket.socket) -> None:
    assert _round_trip(client, b"hello") < DELAY
    assert bytes(proxy.sent) == b"hello"


@pytest.mark.parametrize(("direction", "trips"), [("both", 2), ("answers", 1), ("requests", 1)])
def test_delay_each_way_or_one(
    proxy: TcpProxy,
    client: socket.socket,
    direction: Literal["both", "requests", "answers"],
    trips: int,
) -> None:
    proxy.delay(DELAY, direction)
    took = _round_trip(client, b"x")
    assert trips * DELAY <= took < (trips + 1) * DELAY
    proxy.heal()
    assert _round_trip(client, b"y") < DELAY


def test_delays_do_not_add_up_within_an_answer(proxy: TcpProxy, client: socket.socket) -> None:
    proxy.delay(DELAY, "answers")
    start = time.monotonic()
    for part in (b"a", b"b", b"c"):
        client.sendall(part)
    assert _receive(client, 3) == b"abc"
    assert time.monotonic() - start < 2 * DELAY


def test_freeze_holds_bytes_until_the_thaw(proxy: TcpProxy, client: socket.socket) -> None:
    proxy.freeze()
    client.sendall(b"held")
    assert _silent(client)
    proxy.freeze(False)
    assert _receive(client, 4) == b"held"


def test_freeze_holds_a_new_connection_too(proxy: TcpProxy) -> None:
    proxy.freeze()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as late:
        late.sendall(b"hi")
        assert _silent(late)
        proxy.heal()
        assert _receive(late, 2) == b"hi"


def test_blackhole_drops_bytes_for_good(proxy: TcpProxy, client: socket.socket) -> None:
    proxy.blackhole()
    client.sendall(b"lost")
    assert _silent(client)
    proxy.heal()
    assert _silent(client)  # not held: gone
    assert _round_trip(client, b"back") < DELAY


def test_reset_resets_open_and_new_connections(proxy: TcpProxy, client: socket.socket) -> None:
    _round_trip(client, b"open")
    proxy.reset()
    with pytest.raises(ConnectionResetError):
        client.recv(1)

    def connect_and_read() -> None:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as late:
            late.recv(1)

    with pytest.raises(ConnectionResetError):  # at connect, or at the first read
        connect_and_read()
    proxy.heal()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as healed:
        assert _round_trip(healed, b"ok") < DELAY


def test_drop_connections_resets_once(proxy: TcpProxy, client: socket.socket) -> None:
    _round_trip(client, b"open")
    proxy.drop_connections()
    with pytest.raises(ConnectionResetError):
        client.recv(1)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as again:
        assert _round_trip(again, b"ok") < DELAY


def test_trickle_sends_answers_a_byte_at_a_time(proxy: TcpProxy, client: socket.socket) -> None:
    gap = 0.05
    proxy.trickle(gap)
    took = _round_trip(client, b"abcd")
    assert 4 * gap <= took
    proxy.trickle(None)
    assert _round_trip(client, b"abcd") < 4 * gap


def test_a_close_passes_through(proxy: TcpProxy, client: socket.socket) -> None:
    client.shutdown(socket.SHUT_WR)
    assert client.recv(1) == b""  # the echo server saw the end and closed its side


def test_url_rewrites_the_server_only(echo: tuple[str, int]) -> None:
    host, port = echo
    with TcpProxy.before(f"redis://user:pw@{host}:{port}/3?ttl=1s") as proxy:
        assert proxy.upstream == (host, port)
        assert proxy.url("redis://user:pw@db:6379/3?ttl=1s") == (
            f"redis://user:pw@127.0.0.1:{proxy.port}/3?ttl=1s"
        )


def test_close_ends_connections_and_threads(echo: tuple[str, int]) -> None:
    before = set(threading.enumerate())
    proxy = TcpProxy(echo)
    frozen = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    slow = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    with frozen, slow:
        _round_trip(slow, b"warm")
        proxy.freeze()
        frozen.sendall(b"stuck")
        proxy.close()
        assert frozen.recv(1) == b""
        assert slow.recv(1) == b""
    poll("the proxy's threads gone", lambda: set(threading.enumerate()) <= before, 5)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()


def test_the_plugin_fixture_takes_an_address_or_a_url(
    tcp_proxy: Callable[[tuple[str, int] | str], TcpProxy], echo: tuple[str, int]
) -> None:
    by_address = tcp_proxy(echo)
    by_url = tcp_proxy(f"postgresql://u@{echo[0]}:{echo[1]}/db")
    assert by_address.upstream == by_url.upstream == echo
    for proxy in (by_address, by_url):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            assert _round_trip(sock, b"ok") < DELAY
