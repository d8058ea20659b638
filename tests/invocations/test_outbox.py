"""Pushes from threads are handed to the server's loop without waiting, and still leave
in the order they were handed (apps/invocations/events.py, Outbox; issue 13)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from apps.invocations import events, fanout
from tests.support.redis import redis_server
from toolhub.layers.redis_layer import RedisLayer


@pytest.fixture
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def subscribed(layer: Any, loop: asyncio.AbstractEventLoop, *groups: str) -> str:
    """A new channel of `layer`, in each of `groups`."""
    channel = asyncio.run_coroutine_threadsafe(layer.new_channel(), loop).result(5)
    for group in groups:
        asyncio.run_coroutine_threadsafe(layer.group_add(group, channel), loop).result(5)
    return channel


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
    channel = subscribed(layer, server_loop, "g")
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


def counted_wake_ups(outbox: events.Outbox, monkeypatch: Any) -> list[Any]:
    """The outbox's wake-ups of its loop from other threads, from now on."""
    wake_ups: list[Any] = []
    real = outbox.loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any) -> Any:
        if callback == outbox._take_handed:
            wake_ups.append(callback)
        return real(callback, *args)

    monkeypatch.setattr(outbox.loop, "call_soon_threadsafe", counted)
    return wake_ups


def test_pushes_handed_before_the_loop_takes_them_share_one_wake_up(
    server_loop: asyncio.AbstractEventLoop, monkeypatch: Any
) -> None:
    """Each wake-up of the loop from another thread is a write to its self-pipe: pushes
    handed while the loop is busy ride on the one already asked for, in their order."""
    layer = InMemoryChannelLayer(capacity=1000)
    channel = subscribed(layer, server_loop, "g")
    outbox = events.Outbox(server_loop)
    real = server_loop.call_soon_threadsafe
    wake_ups = counted_wake_ups(outbox, monkeypatch)
    busy, release = threading.Event(), threading.Event()

    def occupied() -> None:
        busy.set()
        release.wait(5)

    real(occupied)  # the loop is busy with something else
    assert busy.wait(5)
    for seq in range(1, 51):
        outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": seq}})
    release.set()
    assert len(wake_ups) == 1

    async def receive_all(count: int) -> list[int]:
        return [(await layer.receive(channel))["event"]["seq"] for _ in range(count)]

    received = asyncio.run_coroutine_threadsafe(receive_all(50), server_loop).result(10)
    assert received == list(range(1, 51))
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 51}})  # taken: a new one
    assert asyncio.run_coroutine_threadsafe(receive_all(1), server_loop).result(5) == [51]
    assert len(wake_ups) == 2


def test_a_failing_send_is_logged_and_the_next_ones_still_go(
    server_loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    layer = InMemoryChannelLayer()
    channel = subscribed(layer, server_loop, "g")
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


def test_a_hanging_layer_drops_the_waiting_pushes_and_owes_their_group_a_catch_up(
    server_loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    """Redis restarting: a send that hangs must not hold every later event behind it, and
    the streams whose pushes were dropped are told to re-read once the layer answers."""
    monkeypatch.setattr(events, "SEND_TIMEOUT_S", 0.05)
    monkeypatch.setattr(events, "RETRY_MIN_S", 0.05)
    hang = True

    class Restarting(InMemoryChannelLayer):
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            if hang:
                await asyncio.sleep(10)
            await super().group_send(group, message)

    layer = Restarting()
    channel = subscribed(layer, server_loop, "g")
    outbox = events.Outbox(server_loop)
    for seq in range(1, 4):
        outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": seq}})
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), server_loop).result(5)
    assert not outbox.pending and outbox.dropped == 2
    assert outbox.missed == {"g": layer}  # retried meanwhile, in vain
    assert "waiting pushes dropped" in caplog.text
    hang = False  # the layer is back: the next event goes, then the catch-up
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 4}})

    def receive() -> dict[str, Any]:
        return asyncio.run_coroutine_threadsafe(layer.receive(channel), server_loop).result(5)

    assert receive()["event"]["seq"] == 4
    assert receive() == {"type": fanout.CATCH_UP_TYPE}
    # The catch-up can be read before the outbox's send returns.
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), server_loop).result(5)
    assert not outbox.missed


def test_a_message_the_layer_refuses_is_not_retried_and_owes_no_catch_up(
    server_loop: asyncio.AbstractEventLoop,
) -> None:
    layer = InMemoryChannelLayer()
    outbox = events.Outbox(server_loop)
    outbox.hand(layer, "bad group name!", {"type": "run.event", "event": {"seq": 1}})
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), server_loop).result(5)
    assert not outbox.pending and not outbox.missed and outbox.dropped == 0


class BatchingLayer(InMemoryChannelLayer):
    """An in-memory layer that also takes several group messages at once, as RedisLayer
    does (toolhub/layers/redis_layer.py): it checks every group name before it sends anything."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[int] = []
        self.down = False

    async def group_send_many(self, sends: list[tuple[str, dict[str, Any]]]) -> None:
        self.batches.append(len(sends))
        if self.down:
            raise ConnectionError("the layer is restarting")
        for group, _ in sends:
            assert self.require_valid_group_name(group)
        for group, message in sends:
            await super().group_send(group, message)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if self.down:
            raise ConnectionError("the layer is restarting")
        await super().group_send(group, message)


def busy_while(loop: asyncio.AbstractEventLoop, hand: Any) -> None:
    """Hand pushes over while the loop is busy with something else: they wait together."""
    busy, release = threading.Event(), threading.Event()

    def occupied() -> None:
        busy.set()
        release.wait(5)

    loop.call_soon_threadsafe(occupied)
    assert busy.wait(5)
    hand()
    release.set()


def run_events(layer: Any, loop: asyncio.AbstractEventLoop, channel: str, count: int) -> list:
    async def receive_all() -> list[Any]:
        return [(await layer.receive(channel)).get("event", {}).get("seq") for _ in range(count)]

    return asyncio.run_coroutine_threadsafe(receive_all(), loop).result(10)


def test_pushes_waiting_behind_each_other_leave_together_in_their_order(
    server_loop: asyncio.AbstractEventLoop, monkeypatch: Any
) -> None:
    monkeypatch.setattr(events, "SEND_BATCH", 40)
    layer = BatchingLayer(capacity=1000)
    channel = subscribed(layer, server_loop, "g1", "g2")
    outbox = events.Outbox(server_loop)

    def hand() -> None:
        for seq in range(1, 51):
            group = "g1" if seq % 2 else "g2"
            outbox.hand(layer, group, {"type": "run.event", "event": {"seq": seq}})

    busy_while(server_loop, hand)
    assert run_events(layer, server_loop, channel, 50) == list(range(1, 51))
    assert layer.batches == [40, 10]  # SEND_BATCH at a time


def test_a_batch_with_a_message_the_layer_refuses_goes_again_one_by_one_losing_only_it(
    server_loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    layer = BatchingLayer()
    channel = subscribed(layer, server_loop, "g")
    outbox = events.Outbox(server_loop)

    def hand() -> None:
        outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 1}})
        outbox.hand(layer, "bad group name!", {"type": "run.event", "event": {"seq": 2}})
        outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 3}})

    busy_while(server_loop, hand)
    assert run_events(layer, server_loop, channel, 2) == [1, 3]
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), server_loop).result(5)
    assert layer.batches == [3]  # then each alone, through group_send
    assert caplog.text.count("could not push event") == 1
    assert not outbox.pending and not outbox.missed and outbox.dropped == 0
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 4}})  # batches again
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 5}})
    assert run_events(layer, server_loop, channel, 2) == [4, 5]


def test_a_batch_the_layer_fails_owes_each_of_its_groups_a_catch_up(
    server_loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setattr(events, "RETRY_MIN_S", 0.05)
    layer = BatchingLayer()
    channels = {group: subscribed(layer, server_loop, group) for group in ("g1", "g2")}
    outbox = events.Outbox(server_loop)
    layer.down = True

    def hand() -> None:
        outbox.hand(layer, "g1", {"type": "run.event", "event": {"seq": 1, "runId": "r1"}})
        outbox.hand(layer, "g2", {"type": "run.event", "event": {"seq": 1, "runId": "r2"}})

    busy_while(server_loop, hand)
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.1), server_loop).result(5)
    assert set(outbox.missed) == {"g1", "g2"}
    assert "could not push event r1#1 and 1 more pushes" in caplog.text
    layer.down = False  # back: each group's feeds are told to re-read
    for channel in channels.values():
        message = asyncio.run_coroutine_threadsafe(layer.receive(channel), server_loop).result(5)
        assert message == {"type": fanout.CATCH_UP_TYPE}


class CuttableProxy:
    """A real TCP relay to Redis for one process's layer: `cut()` closes its sockets and
    turns new ones away (that process alone loses Redis), `mend()` lets them through."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.cut_off = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_off:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.cut_off = True
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.open = []

    def mend(self) -> None:
        self.cut_off = False

    def close(self) -> None:
        self.cut()
        self.listener.close()


class Recorder:
    """A feed's subscriber that writes down what it is handed."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    async def offer(self, event: dict[str, Any], text: str) -> None:
        self.seen.append(event["seq"])

    async def catch_up(self) -> None:
        self.seen.append("catch up")


def test_pushes_lost_by_one_process_make_the_groups_feeds_elsewhere_catch_up(
    server_loop: asyncio.AbstractEventLoop, monkeypatch: Any
) -> None:
    """The run's last events were committed by a process that could not reach Redis: no
    later event will show the gap, so without a catch-up the stream would wait forever."""
    monkeypatch.setattr(events, "RETRY_MIN_S", 0.05)

    def on_loop(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, server_loop).result(10)

    def wait_for(recorder: Recorder, count: int) -> list[object]:
        deadline = time.monotonic() + 10
        while len(recorder.seen) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return recorder.seen

    with redis_server() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        proxy = CuttableProxy(port)
        try:
            here = RedisLayer(hosts=[{"address": url, "socket_timeout": None}])
            there = RedisLayer(
                hosts=[{"address": f"redis://127.0.0.1:{proxy.port}/0", "socket_timeout": None}]
            )
            recorder = Recorder()

            async def subscribe() -> None:
                await fanout.feeds_for(here).subscribe(here, "run-g", recorder)

            async def unsubscribe() -> None:
                await fanout.feeds_for(here).unsubscribe("run-g", recorder)

            on_loop(subscribe())
            outbox = events.Outbox(server_loop)
            outbox.hand(there, "run-g", {"type": "run.event", "event": {"seq": 1}})
            assert wait_for(recorder, 1) == [1]

            proxy.cut()
            outbox.hand(there, "run-g", {"type": "run.event", "event": {"seq": 2}})
            on_loop(asyncio.sleep(0.3))  # tried, and retried, in vain
            assert recorder.seen == [1] and "run-g" in outbox.missed
            proxy.mend()
            assert wait_for(recorder, 2) == [1, "catch up"]
            # The feed can read the catch-up before the outbox's send returns.
            deadline = time.monotonic() + 5
            while outbox.missed and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not outbox.missed
            on_loop(unsubscribe())
            on_loop(here.flush())
            on_loop(there.close_pools())
        finally:
            proxy.close()


def just_sent(
    loop: asyncio.AbstractEventLoop, monkeypatch: Any, coalesce_s: float, *groups: str
) -> tuple[BatchingLayer, str, events.Outbox]:
    """COALESCE_S set, and an outbox that has just sent a first push (alone: after a quiet
    spell a push leaves at once) to a channel in `groups`."""
    monkeypatch.setattr(events, "COALESCE_S", coalesce_s)
    layer = BatchingLayer(capacity=1000)
    channel = subscribed(layer, loop, *groups)
    outbox = events.Outbox(loop)
    outbox.hand(layer, groups[0], {"type": "run.event", "event": {"seq": 1}})
    assert run_events(layer, loop, channel, 1) == [1]
    assert layer.batches == []  # through group_send
    return layer, channel, outbox


def test_under_sustained_pushes_a_push_waits_for_others_to_share_its_round_trip(
    server_loop: asyncio.AbstractEventLoop, monkeypatch: Any
) -> None:
    """A worker hands a push or two per call: sent as they come, each paid Redis's round
    trip. Right after a send, the next push waits COALESCE_S, and those handed meanwhile
    leave with it, in their order."""
    layer, channel, outbox = just_sent(server_loop, monkeypatch, 1.0, "g1", "g2")
    wake_ups = counted_wake_ups(outbox, monkeypatch)
    for seq in range(2, 6):  # handed one by one, as the loop is free to take each
        outbox.hand(layer, "g1" if seq % 2 else "g2", {"type": "run.event", "event": {"seq": seq}})
        time.sleep(0.01)
    assert run_events(layer, server_loop, channel, 4) == [2, 3, 4, 5]
    assert layer.batches == [4]  # the first went alone (group_send), the rest together
    # The second woke the loop; those handed while it waited did not need to.
    assert len(wake_ups) == 1


def test_a_push_after_a_quiet_spell_does_not_wait(
    server_loop: asyncio.AbstractEventLoop, monkeypatch: Any
) -> None:
    layer, channel, outbox = just_sent(server_loop, monkeypatch, 1.0, "g")
    time.sleep(1.05)  # longer than COALESCE_S since that send
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 2}})
    time.sleep(0.1)
    assert outbox.sender is not None and outbox.sender.done()  # sent: it did not wait
    outbox.hand(layer, "g", {"type": "run.event", "event": {"seq": 3}})  # right after: waits
    time.sleep(0.1)
    assert outbox.sender is not None and not outbox.sender.done()
    assert run_events(layer, server_loop, channel, 2) == [2, 3]


def test_a_full_batch_and_a_layer_that_sends_one_at_a_time_do_not_wait(
    server_loop: asyncio.AbstractEventLoop, monkeypatch: Any
) -> None:
    monkeypatch.setattr(events, "SEND_BATCH", 5)
    batching, channel, outbox = just_sent(server_loop, monkeypatch, 30.0, "g")

    def hand() -> None:
        for seq in range(2, 7):
            outbox.hand(batching, "g", {"type": "run.event", "event": {"seq": seq}})

    busy_while(server_loop, hand)  # SEND_BATCH waiting: they leave without the 30 s wait
    assert run_events(batching, server_loop, channel, 5) == [2, 3, 4, 5, 6]
    assert batching.batches == [5]

    plain = InMemoryChannelLayer(capacity=1000)  # no group_send_many: nothing to share
    plain_channel = subscribed(plain, server_loop, "g")
    plain_outbox = events.Outbox(server_loop)
    for seq in range(1, 4):
        plain_outbox.hand(plain, "g", {"type": "run.event", "event": {"seq": seq}})
        assert run_events(plain, server_loop, plain_channel, 1) == [seq]


def test_a_push_after_the_server_loop_stopped_does_not_wait_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request thread finishing while the server stops: the loop it came from stopped
    (not closed). Its push used to be handed to that loop by async_to_sync and waited for
    ever, and the process, which joins its threads at exit, never exited. It is sent on a
    loop of its own."""
    from asgiref.sync import SyncToAsync

    stopped = asyncio.new_event_loop()  # the server's loop, stopped under the request
    monkeypatch.setattr(events, "_server_loop", stopped)
    layer = InMemoryChannelLayer()
    channel = asyncio.run(layer.new_channel())
    asyncio.run(layer.group_add("g", channel))
    done: list[BaseException | None] = []

    def request_thread() -> None:
        # What SyncToAsync sets in the threads it runs a request's work on.
        SyncToAsync.threadlocal.main_event_loop = stopped
        SyncToAsync.threadlocal.main_event_loop_pid = os.getpid()
        try:
            events._group_send(layer, "g", {"type": "run.event", "event": {"seq": 1}})
        except BaseException as error:  # reported below
            done.append(error)
        else:
            done.append(None)

    thread = threading.Thread(target=request_thread, daemon=True)
    thread.start()
    thread.join(10)
    try:
        assert not thread.is_alive(), "the push waited for the stopped loop"
        assert done == [None]
        received = asyncio.run(asyncio.wait_for(layer.receive(channel), 5))
        assert received == {"type": "run.event", "event": {"seq": 1}}
    finally:
        stopped.close()
