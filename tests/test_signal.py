"""LostSignal: callbacks, blocking wait, await across threads, idempotent firing."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from multilock import LostSignal


def test_starts_unset() -> None:
    signal = LostSignal()
    assert not signal.is_set()
    assert signal.reason is None
    assert repr(signal) == "<LostSignal held>"


def test_callbacks_run_once_with_the_reason() -> None:
    signal = LostSignal()
    seen: list[str] = []
    signal.add_callback(seen.append)
    signal.add_callback(lambda reason: seen.append(reason.upper()))
    assert signal.set("session died") is True
    assert signal.set("again") is False
    assert seen == ["session died", "SESSION DIED"]
    assert signal.reason == "session died"
    assert repr(signal) == "<LostSignal lost: session died>"


def test_callback_added_after_firing_runs_at_once() -> None:
    signal = LostSignal()
    signal.set("gone")
    seen: list[str] = []
    signal.add_callback(seen.append)
    assert seen == ["gone"]


def test_empty_reason_still_fires() -> None:
    signal = LostSignal()
    assert signal.set("")
    assert signal.is_set()
    assert signal.reason == "lost"


def test_removed_callback_is_not_called() -> None:
    signal = LostSignal()
    seen: list[str] = []
    signal.add_callback(seen.append)
    signal.remove_callback(seen.append)
    signal.remove_callback(print)  # never added: no error
    signal.set("x")
    assert seen == []


def test_a_failing_callback_is_logged_and_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    signal = LostSignal()
    seen: list[str] = []

    def broken(reason: str) -> None:
        raise RuntimeError("listener bug")

    signal.add_callback(broken)
    signal.add_callback(seen.append)
    with caplog.at_level(logging.ERROR, logger="multilock"):
        assert signal.set("x")
    assert seen == ["x"]
    assert "lost-signal callback" in caplog.text
    assert "listener bug" in caplog.text


def test_wait_times_out_while_held() -> None:
    signal = LostSignal()
    start = time.monotonic()
    assert signal.wait(0.05) is False
    assert time.monotonic() - start >= 0.04


def test_wait_wakes_when_another_thread_fires() -> None:
    signal = LostSignal()
    waiter_result: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(signal.wait(10)))
    waiter.start()
    signal.set("from main")
    waiter.join(10)
    assert waiter_result == [True]


def test_wait_after_firing_returns_at_once() -> None:
    signal = LostSignal()
    signal.set("x")
    assert signal.wait(0) is True


def test_await_returns_the_reason_fired_from_another_thread() -> None:
    async def scenario() -> None:
        signal = LostSignal()
        firer = threading.Timer(0.02, signal.set, args=("killed by the server",))
        firer.start()
        try:
            reason = await asyncio.wait_for(signal, timeout=10)
        finally:
            firer.join()
        assert reason == "killed by the server"

    asyncio.run(scenario())


def test_await_fired_on_the_same_loop() -> None:
    async def scenario() -> None:
        signal = LostSignal()
        asyncio.get_running_loop().call_later(0.01, signal.set, "same loop")
        assert await asyncio.wait_for(signal, timeout=10) == "same loop"

    asyncio.run(scenario())


def test_await_after_firing_returns_at_once() -> None:
    async def scenario() -> None:
        signal = LostSignal()
        signal.set("early")
        assert await signal == "early"

    asyncio.run(scenario())


def test_cancelled_await_unregisters_its_callback() -> None:
    async def scenario() -> None:
        signal = LostSignal()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(signal, timeout=0.01)
        assert not signal._callbacks  # no waker left behind to leak per poll

    asyncio.run(scenario())
