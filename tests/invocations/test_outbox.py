"""Pushes from threads are handed to the server's loop without waiting, and still leave
in the order they were handed (apps/invocations/events.py, Outbox; issue 13)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from apps.invocations import events


@pytest.fixture
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


class SlowLayer(InMemoryChannelLayer):
    """A layer whose sends take a while and yield in between: a Redis stand-in that
    would reorder concurrent sends."""

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await asyncio.sleep(0.002 if message["event"]["seq"] % 2 else 0)
        await super().group_send(group, message)


def test_threads_hand_pushes_over_in_order_without_waiting_for_them(
    server_loop: asyncio.AbstractEventLoop,
) -> None:
    layer = SlowLayer()
    channel = asyncio.run_coroutine_threadsafe(layer.new_channel(), server_loop).result(5)
    asyncio.run_coroutine_threadsafe(layer.group_add("g", channel), server_loop).result(5)
    outbox = events.outbox(server_loop)

    started = time.monotonic()
    for seq in range(1, 101):
        outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": seq}})
    handed_in = time.monotonic() - started
    # 100 sends take at least 50 x 2 ms on the loop; handing them over does not wait.
    assert handed_in < 0.1

    async def receive_all() -> list[int]:
        return [(await layer.receive(channel))["event"]["seq"] for _ in range(100)]

    received = asyncio.run_coroutine_threadsafe(receive_all(), server_loop).result(10)
    assert received == list(range(1, 101))


def test_a_failing_send_is_logged_and_the_next_ones_still_go(
    server_loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    layer = InMemoryChannelLayer()
    channel = asyncio.run_coroutine_threadsafe(layer.new_channel(), server_loop).result(5)
    asyncio.run_coroutine_threadsafe(layer.group_add("g", channel), server_loop).result(5)
    outbox = events.outbox(server_loop)
    outbox.hand(layer, "bad group name!", {"type": "run.event", "event": {"seq": 1}})
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), server_loop).result(5)
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 2, "runId": "r"}})
    message = asyncio.run_coroutine_threadsafe(layer.receive(channel), server_loop).result(5)
    assert message["event"]["seq"] == 2
    assert "could not push event" in caplog.text


def test_a_full_outbox_drops_and_says_so(
    server_loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setattr(events, "OUTBOX_LIMIT", 3)
    outbox = events.Outbox(server_loop)
    gate = asyncio.Event()

    class Stuck(InMemoryChannelLayer):
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            await gate.wait()

    layer = Stuck()
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 0}})
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), server_loop).result(5)  # in flight
    for seq in range(1, 6):  # three waiting, two dropped
        outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": seq}})
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), server_loop).result(5)
    assert outbox.dropped == 2
    assert "push backlog full" in caplog.text
    server_loop.call_soon_threadsafe(gate.set)
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), server_loop).result(5)
    assert not outbox.pending  # the waiting sends went once the layer answered


def test_a_hanging_layer_drops_the_waiting_pushes_instead_of_holding_them(
    server_loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    """Redis restarting: a send that hangs must not hold every later event behind it."""
    monkeypatch.setattr(events, "SEND_TIMEOUT_S", 0.05)
    hang = True

    class Restarting(InMemoryChannelLayer):
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            if hang:
                await asyncio.sleep(10)
            await super().group_send(group, message)

    layer = Restarting()
    channel = asyncio.run_coroutine_threadsafe(layer.new_channel(), server_loop).result(5)
    asyncio.run_coroutine_threadsafe(layer.group_add("g", channel), server_loop).result(5)
    outbox = events.Outbox(server_loop)
    for seq in range(1, 4):
        outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": seq}})
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), server_loop).result(5)
    assert not outbox.pending and outbox.dropped == 2
    assert "waiting pushes dropped" in caplog.text
    hang = False  # the layer is back: the next event goes at once
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 4}})
    message = asyncio.run_coroutine_threadsafe(layer.receive(channel), server_loop).result(5)
    assert message["event"]["seq"] == 4
