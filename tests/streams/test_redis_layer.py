"""toolhub's Redis layer (toolhub/layers/redis_layer.py) sends in fewer round trips than
channels-redis and must keep its every rule: each test runs against both, on a real Redis, and
a process of one kind must read what a process of the other sent."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.client
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer

from apps.invocations import fanout
from tests.support.redis import redis_server
from tests.support.server import free_port
from toolhub.layers import redis_layer as layers
from toolhub.layers.redis_layer import DROPPED_KEY, RedisLayer, dropped_counts

KINDS = [RedisChannelLayer, RedisLayer]
each_layer = pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


def layer(kind: type[RedisChannelLayer], url: str, **config: Any) -> Any:
    return kind(hosts=[{"address": url, "socket_timeout": None}], **config)


async def receive(layer_obj: Any, channel: str) -> dict[str, Any]:
    return dict(await asyncio.wait_for(layer_obj.receive(channel), 5))


async def nothing_for(layer_obj: Any, channel: str) -> bool:
    try:
        await asyncio.wait_for(layer_obj.receive(channel), 0.3)
    except TimeoutError:
        return True
    return False


@each_layer
def test_a_group_message_reaches_every_member_once(
    kind: type[RedisChannelLayer], redis_url: str, raw: redis.Redis
) -> None:
    async def scenario() -> None:
        here = layer(kind, redis_url)
        # Two process-local channels share one Redis key; a general channel has its own.
        first, second = await here.new_channel(), await here.new_channel()
        general = "plain.general"
        for channel in (first, second, general):
            await here.group_add("run-a", channel)
        await here.group_send("run-a", {"type": "run.event", "n": 1})
        assert await receive(here, first) == {"type": "run.event", "n": 1}
        assert await receive(here, second) == {"type": "run.event", "n": 1}
        assert await receive(here, general) == {"type": "run.event", "n": 1}
        for channel in (first, second, general):
            assert await nothing_for(here, channel)
        await here.flush()

    asyncio.run(scenario())


@each_layer
def test_a_group_nobody_follows_takes_the_message_and_stores_nothing(
    kind: type[RedisChannelLayer], redis_url: str, raw: redis.Redis
) -> None:
    async def scenario() -> None:
        here = layer(kind, redis_url)
        await here.group_send("run-nobody", {"type": "run.event"})
        await here.flush()

    asyncio.run(scenario())
    assert raw.keys("*") == []


@each_layer
def test_a_full_channel_refuses_a_send_and_misses_a_group_message_others_get(
    kind: type[RedisChannelLayer], redis_url: str, raw: redis.Redis, caplog: Any
) -> None:
    async def scenario() -> None:
        here = layer(kind, redis_url, capacity=2)
        await here.send("slow.reader", {"type": "m", "n": 1})
        await here.send("slow.reader", {"type": "m", "n": 2})
        with pytest.raises(ChannelFull):
            await here.send("slow.reader", {"type": "m", "n": 3})
        await here.group_add("run-b", "slow.reader")
        await here.group_add("run-b", "quick.reader")
        with caplog.at_level(logging.INFO):
            await here.group_send("run-b", {"type": "m", "n": 4})
        assert [(await receive(here, "slow.reader"))["n"] for _ in range(2)] == [1, 2]
        assert await nothing_for(here, "slow.reader")
        assert (await receive(here, "quick.reader"))["n"] == 4
        if kind is RedisLayer:  # counted in Redis (test_drops_are_counted...)
            assert raw.hgetall("asgi" + DROPPED_KEY) == {b"direct": b"1", b"other": b"1"}
        await here.flush()

    asyncio.run(scenario())
    if kind is RedisChannelLayer:
        assert "1 of 2 channels over capacity in group run-b" in caplog.text
    else:  # and logged once per interval, summed
        assert "over capacity" not in caplog.text


@each_layer
def test_expired_messages_leave_room_and_expired_members_leave_the_group(
    kind: type[RedisChannelLayer], redis_url: str, raw: redis.Redis
) -> None:
    async def scenario() -> None:
        here = layer(kind, redis_url, capacity=2, expiry=30, group_expiry=60)
        await here.send("old.reader", {"type": "m", "n": 1})
        await here.send("old.reader", {"type": "m", "n": 2})
        # Both messages and a member now older than their expiries, as if time passed.
        key = "asgi" + "old.reader"
        members: list[bytes] = list(raw.zrange(key, 0, -1))  # type: ignore[arg-type]
        raw.zadd(key, dict.fromkeys(members, time.time() - 31))
        await here.group_add("run-c", "gone.member")
        await here.group_add("run-c", "live.member")
        raw.zadd(b"asgi:group:run-c", {b"gone.member": time.time() - 61})
        await here.send("old.reader", {"type": "m", "n": 3})  # room again: no ChannelFull
        await here.group_send("run-c", {"type": "m", "n": 4})
        assert 0 < raw.ttl("asgi" + "live.member") <= 30  # a message expires unread
        assert (await receive(here, "old.reader"))["n"] == 3
        assert (await receive(here, "live.member"))["n"] == 4
        assert await nothing_for(here, "gone.member")
        assert raw.zrange(b"asgi:group:run-c", 0, -1) == [b"live.member"]
        await here.flush()

    asyncio.run(scenario())


@pytest.mark.parametrize("sender_kind", KINDS, ids=lambda kind: f"from-{kind.__name__}")
def test_processes_of_either_kind_share_one_redis(
    sender_kind: type[RedisChannelLayer], redis_url: str, raw: redis.Redis
) -> None:
    receiver_kind = RedisChannelLayer if sender_kind is RedisLayer else RedisLayer

    async def scenario() -> None:
        sender, receiver = layer(sender_kind, redis_url), layer(receiver_kind, redis_url)
        local = await receiver.new_channel()
        await receiver.group_add("run-d", local)
        await sender.group_send("run-d", {"type": "m", "n": 1})
        await sender.send(local, {"type": "m", "n": 2})
        assert [(await receive(receiver, local))["n"] for _ in range(2)] == [1, 2]
        await receiver.flush()

    asyncio.run(scenario())


def test_scripts_lost_by_redis_are_loaded_again(redis_url: str, raw: redis.Redis) -> None:
    async def scenario() -> None:
        here = layer(RedisLayer, redis_url)
        await here.group_add("run-e", "a.reader")
        await here.group_send("run-e", {"type": "m", "n": 1})
        raw.script_flush()  # as a Redis restart does
        await here.group_send("run-e", {"type": "m", "n": 2})
        await here.send("a.reader", {"type": "m", "n": 3})
        assert [(await receive(here, "a.reader"))["n"] for _ in range(3)] == [1, 2, 3]
        await here.flush()

    asyncio.run(scenario())


def test_several_group_messages_go_in_two_round_trips_and_arrive_as_one_after_the_other(
    redis_url: str, raw: redis.Redis, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """group_send_many: every group's members in one pipeline, every delivery in another;
    what each channel gets, in what order, and the capacity rule are group_send's."""
    round_trips: list[int] = []
    pipelined = redis.asyncio.client.Pipeline.execute
    single = redis.asyncio.Redis.execute_command

    async def counted_pipeline(self: Any, *args: Any, **kwargs: Any) -> Any:
        round_trips.append(len(self.command_stack))
        return await pipelined(self, *args, **kwargs)

    async def counted_single(self: Any, *args: Any, **kwargs: Any) -> Any:
        round_trips.append(1)
        return await single(self, *args, **kwargs)

    async def scenario() -> None:
        here = layer(RedisLayer, redis_url, capacity=3)
        plain = layer(RedisChannelLayer, redis_url, capacity=3)  # a process of the other kind
        first, second = await here.new_channel(), await here.new_channel()
        for _ in range(3):
            await here.send("slow.reader", {"type": "m", "n": 0})  # full
        for channel in (first, second, "both.reader", "slow.reader"):
            await here.group_add("run-m1", channel)
        await here.group_add("run-m2", "both.reader")
        await here.group_send("run-warm", {"type": "m"})  # Redis has both scripts now
        monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", counted_pipeline)
        monkeypatch.setattr(redis.asyncio.Redis, "execute_command", counted_single)
        with caplog.at_level(logging.INFO):
            await here.group_send_many(
                [
                    ("run-m1", {"type": "m", "n": 1}),
                    ("run-m2", {"type": "m", "n": 2}),
                    ("run-nobody", {"type": "m", "n": 3}),
                    ("run-m1", {"type": "m", "n": 4}),
                ]
            )
        # Four reads; then three deliveries (run-m1's to three channel keys: its two
        # process-local channels share one), run-nobody's none.
        assert round_trips == [4, 3]
        monkeypatch.undo()
        for channel in (first, second):
            assert [(await receive(here, channel))["n"] for _ in range(2)] == [1, 4]
        assert [(await receive(plain, "both.reader"))["n"] for _ in range(3)] == [1, 2, 4]
        assert [(await receive(here, "slow.reader"))["n"] for _ in range(3)] == [0, 0, 0]
        for channel in (first, second, "both.reader", "slow.reader"):
            assert await nothing_for(here, channel)
        assert raw.hget("asgi" + DROPPED_KEY, "other") == b"2"
        await here.flush()

    asyncio.run(scenario())
    assert "over capacity" not in caplog.text  # summed once per interval, not per message
    assert not raw.keys("*nobody*")


def test_several_group_messages_arrive_in_order_also_after_redis_lost_the_scripts(
    redis_url: str, raw: redis.Redis
) -> None:
    async def scenario() -> None:
        here = layer(RedisLayer, redis_url)
        await here.group_add("run-f", "a.reader")
        await here.group_send_many([("run-f", {"type": "m", "n": 1})])
        raw.script_flush()  # as a Redis restart does
        # Ten adds to one channel in one pipeline, read back in the order sent.
        await here.group_send_many([("run-f", {"type": "m", "n": n}) for n in range(2, 12)])
        assert [(await receive(here, "a.reader"))["n"] for _ in range(11)] == list(range(1, 12))
        await here.flush()

    asyncio.run(scenario())


def test_several_group_messages_to_a_bad_group_name_send_nothing(
    redis_url: str, raw: redis.Redis
) -> None:
    async def scenario() -> None:
        here = layer(RedisLayer, redis_url)
        await here.group_add("run-h", "a.reader")
        with pytest.raises(TypeError):
            await here.group_send_many([("run-h", {"type": "m"}), ("bad name!", {"type": "m"})])
        assert await nothing_for(here, "a.reader")
        await here.flush()

    asyncio.run(scenario())


class Recorder:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.caught_up = 0

    async def offer(self, event: dict[str, Any], text: str) -> None:
        self.seen.append(event["seq"])

    async def catch_up(self) -> None:
        self.caught_up += 1


async def eventually(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_every_feed_of_a_process_hears_again_after_redis_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The feeds of a process share one blocking read: a restart fails only the feed
    whose read was waiting, yet Redis forgot every group. Each must hear again."""
    monkeypatch.setattr(fanout, "RETRY_S", 0.05)
    monkeypatch.setattr(fanout, "WATCH_S", 0.2)
    port = free_port()

    async def scenario(restart: Any) -> None:
        here, sender = layer(RedisLayer, url), layer(RedisLayer, url)
        feeds = fanout.Feeds()
        recorders = {f"run-{n}": Recorder() for n in range(4)}
        for group, recorder in recorders.items():
            await feeds.subscribe(here, group, recorder)
        await asyncio.sleep(0.3)
        restart()
        await eventually(lambda: all(r.caught_up >= 1 for r in recorders.values()))
        for n, group in enumerate(recorders):
            for _attempt in range(50):  # the sender's pooled connection may be stale once
                try:
                    await sender.group_send(group, {"type": "e", "event": {"seq": n}})
                    break
                except redis.ConnectionError:
                    await asyncio.sleep(0.05)
        await eventually(lambda: all(len(r.seen) == 1 for r in recorders.values()))
        assert [r.seen for r in recorders.values()] == [[0], [1], [2], [3]]
        for group, recorder in recorders.items():
            await feeds.unsubscribe(group, recorder)

    with ExitStack() as stack:
        url = stack.enter_context(redis_server(port))

        def restart() -> None:
            stack.close()
            stack.enter_context(redis_server(port))

        asyncio.run(scenario(restart))


def test_a_deployment_with_redis_uses_toolhubs_layer() -> None:
    """The settings a process loads with REDIS_URL (no Redis is contacted to load them)."""
    probe = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.CHANNEL_LAYERS['default']['BACKEND'])"
    )
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "toolhub.layers.redis_layer.RedisLayer"


def test_drops_are_counted_by_group_kind_and_logged_once_per_interval_summed(
    redis_url: str, raw: redis.Redis, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A channel over capacity: every drop counted in Redis by the group's kind (a bounded
    label, whatever the group), every process's; one WARNING line per interval with the
    sum, none per message."""
    monkeypatch.setattr(layers, "DROP_LOG_INTERVAL_S", 0.3)
    monkeypatch.setattr(layers, "drop_log", layers.DropLog())
    caplog.set_level(logging.INFO, logger="toolhub.layers.redis_layer")

    async def scenario() -> None:
        here, other_process = (
            layer(RedisLayer, redis_url, capacity=2),
            layer(RedisLayer, redis_url, capacity=2),
        )
        for group in ("run.aaa", "run.bbb", "tenant.7", "odd-group"):
            await here.group_add(group, "full.reader")
        for n in range(2):
            await here.send("full.reader", {"type": "m", "n": n})
        for n in range(3):
            await here.group_send("run.aaa", {"type": "m", "n": n})
        await other_process.group_send_many(
            [("run.bbb", {"type": "m"}), ("tenant.7", {"type": "m"}), ("odd-group", {"type": "m"})]
        )
        with pytest.raises(ChannelFull):
            await here.send("full.reader", {"type": "m"})
        await eventually(lambda: any(r.levelno == logging.WARNING for r in caplog.records))
        assert dropped_counts(redis_url) == {"run": 4, "tenant": 1, "other": 1, "direct": 1}
        await here.flush()

    asyncio.run(scenario())
    lines = [r for r in caplog.records if "over capacity" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    # The direct send is counted but not logged: its sender got ChannelFull.
    assert (
        lines[0]
        .getMessage()
        .startswith(
            "channel layer over capacity: 6 messages dropped in the last 0.3 s "
            "(other: 1, run: 4, tenant: 1)"
        )
    )


def test_a_process_reads_its_channels_in_batches_in_order_and_a_lost_batch_is_read_again(
    redis_url: str, raw: redis.Redis
) -> None:
    """Messages waiting for a process's channels (its feeds) are taken in one round trip
    each batch and reach each channel in the order sent; a batch taken by a read that never
    finished (cancelled, or its process died) is put back and read by the next one."""

    async def scenario() -> None:
        here, sender = layer(RedisLayer, redis_url), layer(RedisLayer, redis_url, capacity=500)
        channels = [await here.new_channel(prefix="feed") for _ in range(3)]
        for n in range(40):
            for c, channel in enumerate(channels):
                await sender.send(channel, {"type": "m", "n": n, "c": c})

        async def read_all(channel: str) -> list[dict[str, Any]]:  # one reader, as a feed
            return [await receive(here, channel) for _ in range(40)]

        got = await asyncio.gather(*(read_all(channel) for channel in channels))
        for c, messages in enumerate(got):
            assert [(m["c"], m["n"]) for m in messages] == [(c, n) for n in range(40)]
        assert not here.receive_waiting(channels[0])

        await sender.send(channels[0], {"type": "m", "n": "lost"})
        key = here.prefix + here.non_local_name(channels[0])
        taken = await here._script(here.connection(0), layers._TAKE)(
            keys=[key, key + "$inflight"], args=[10]
        )
        assert len(taken) == 1  # as a read that then died would have
        assert (await receive(here, channels[0]))["n"] == "lost"
        assert await nothing_for(here, channels[0])
        await here.flush()

    asyncio.run(scenario())
