"""In-process fan-out: one channel-layer subscription per run per process (apps.invocations.fanout).

These run toolhub's ASGI application in the test process with channels'
WebsocketCommunicator, so the channel layer's groups can be inspected. Events are
emitted with `events.emit` from a worker thread, the way the runner emits them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels import DEFAULT_CHANNEL_LAYER
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client
from guardian.shortcuts import assign_perm

from apps.approvals.consumers import ApprovalsConsumer
from apps.invocations import events, fanout
from apps.invocations.consumers import RunConsumer
from apps.invocations.events import emit, run_group, tenant_group
from apps.invocations.fanout import Feed, feeds_for
from apps.tools.models import Tool
from tests.conftest import allow
from tests.console.test_websocket_docs import payload_validator
from tests.support.feeds import listening
from toolhub.asgi import application
from toolhub.server import send_batches

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def layer() -> AsyncIterator[Any]:
    layer = get_channel_layer()
    await layer.flush()
    yield layer
    await layer.flush()


async def open_stream(agent, run_id: str, after: int | None = None) -> WebsocketCommunicator:
    path = f"/ws/v1/runs/{run_id}/" + ("" if after is None else f"?after={after}")
    stream = WebsocketCommunicator(
        application, path, headers=[(b"authorization", f"Bearer {agent.key}".encode())]
    )
    connected, _ = await stream.connect()
    assert connected
    return stream


@database_sync_to_async
def emit_calls(agent, run_id: str, count: int) -> list[int]:
    """`count` tool_call_start events on the run, committed and pushed one by one."""
    return [
        emit(agent.tenant, run_id, "tool_call_start", tool_call_id=f"c{i}", tool_id="t__x")["seq"]
        for i in range(count)
    ]


async def read(stream: WebsocketCommunicator, count: int) -> list[int]:
    return [(await stream.receive_json_from(timeout=5))["seq"] for _ in range(count)]


def members(layer: Any, group: str) -> set[str]:
    return set(layer.groups.get(group, {}))


# ------------------------------------------------------------ through the consumer


async def test_streams_of_one_run_share_one_group_member_and_all_get_every_event(acme, layer):
    group = run_group(acme.tenant.pk, "fan-share")
    streams = [await open_stream(acme, "fan-share") for _ in range(5)]
    other = await open_stream(acme, "fan-other")

    assert len(members(layer, group)) == 1
    assert len(members(layer, run_group(acme.tenant.pk, "fan-other"))) == 1

    assert await emit_calls(acme, "fan-share", 3) == [1, 2, 3]
    for stream in streams:
        assert await read(stream, 3) == [1, 2, 3]
        assert await stream.receive_nothing(0.1)
    assert await other.receive_nothing(0.1)  # another run's stream hears nothing

    # Streams leave one by one; the member stays until the last has gone.
    for stream in streams[:-1]:
        await stream.disconnect()
    assert len(members(layer, group)) == 1
    assert await emit_calls(acme, "fan-share", 1) == [4]
    assert await read(streams[-1], 1) == [4]

    await streams[-1].disconnect()
    assert members(layer, group) == set()
    assert group not in feeds_for(layer).by_group
    await other.disconnect()


async def test_a_stream_opened_after_the_feed_started_replays_then_goes_live(acme, layer):
    first = await open_stream(acme, "fan-late")
    await emit_calls(acme, "fan-late", 2)
    assert await read(first, 2) == [1, 2]

    late = await open_stream(acme, "fan-late", after=1)
    assert await read(late, 1) == [2]  # from the database
    await emit_calls(acme, "fan-late", 1)
    assert await read(late, 1) == [3]  # live, through the existing feed
    assert await read(first, 1) == [3]
    assert await late.receive_nothing(0.1)
    await first.disconnect()
    await late.disconnect()


async def test_a_paced_stream_that_overflows_its_queue_reads_the_rest_from_the_database(
    acme, layer, settings, monkeypatch
):
    # A budget of about three events, refilled at ~5 events a second, and room to
    # queue only two: most of the ten events are dropped from the queue and must be
    # read back from the database, in order, once.
    settings.TOOLHUB_WS_SEND_BURST = 600
    settings.TOOLHUB_WS_SEND_RATE = 1024
    settings.TOOLHUB_WS_QUEUED_EVENTS = 2
    refills = 0
    original = RunConsumer._send_from_database

    async def counted(self: RunConsumer) -> None:
        nonlocal refills
        refills += 1
        await original(self)

    monkeypatch.setattr(RunConsumer, "_send_from_database", counted)
    stream = await open_stream(acme, "fan-slow")
    refills = 0  # the replay at connect does not count

    assert await emit_calls(acme, "fan-slow", 10) == list(range(1, 11))
    assert await read(stream, 10) == list(range(1, 11))
    assert await stream.receive_nothing(0.3)
    assert refills >= 1
    await stream.disconnect()


async def test_a_stream_that_cannot_keep_up_is_told_where_to_resume_then_closed_with_4008(
    acme, layer, settings
):
    """A subscriber that reads nothing while the run goes on: once it has needed pacing for
    longer than TOOLHUB_WS_SLOW_CLIENT_SECONDS (small buffers here: a budget of about two
    events, refilled at about four a second) it gets `stream_lagging` with the seq to
    resume after, then 4008 with the same in its reason; resuming there loses nothing."""
    settings.TOOLHUB_WS_SEND_BURST = 600
    settings.TOOLHUB_WS_SEND_RATE = 1024
    settings.TOOLHUB_WS_SLOW_CLIENT_SECONDS = 0.3
    stream = await open_stream(acme, "fan-lagging")
    assert await emit_calls(acme, "fan-lagging", 30) == list(range(1, 31))

    seen: list[int] = []
    while True:  # what the stream got before it was closed, read only now
        output = await stream.receive_output(timeout=10)
        if output["type"] != "websocket.send":
            break
        message = json.loads(output["text"])
        if message["type"] == "stream_lagging":
            lagging = message
            continue
        seen.append(message["seq"])
    assert output == {
        "type": "websocket.close",
        "code": 4008,
        "reason": f"lagging: resume with ?after={seen[-1]}",
    }
    assert seen == list(range(1, len(seen) + 1)) and len(seen) < 30
    assert lagging == {
        "v": 1,
        "type": "stream_lagging",
        "runId": "fan-lagging",
        "resumeAfter": seen[-1],
        "detail": "This stream could not keep up with the run's events and is closed (4008): "
        f"reconnect with ?after={seen[-1]}.",
    }
    assert not list(payload_validator("streamLagging").iter_errors(lagging))

    settings.TOOLHUB_WS_SEND_BURST = 1024 * 1024
    again = await open_stream(acme, "fan-lagging", after=lagging["resumeAfter"])
    assert await read(again, 30 - len(seen)) == list(range(len(seen) + 1, 31))
    await again.disconnect()


# ------------------------------------------------------------ the feed itself


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[tuple[int, str]] = []
        self.caught_up = 0

    async def offer(self, event: dict[str, Any], text: str) -> None:
        if self.fail:
            raise RuntimeError("this subscriber is broken")
        self.seen.append((event["seq"], text))

    async def catch_up(self) -> None:
        self.caught_up += 1


async def until(condition, timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def run_event(seq: int) -> dict[str, Any]:
    return {"type": "run.event", "event": {"seq": seq, "type": "tool_call_start", "x": "é"}}


async def test_a_feed_encodes_once_and_a_failing_subscriber_does_not_stop_the_others(caplog):
    layer = InMemoryChannelLayer()
    feeds = fanout.Feeds()
    good, bad, also_good = Recorder(), Recorder(fail=True), Recorder()
    for subscriber in (good, bad, also_good):
        await feeds.subscribe(layer, "run.g", subscriber)

    await layer.group_send("run.g", run_event(1))
    await layer.group_send("run.g", run_event(2))
    await until(lambda: len(also_good.seen) == 2)

    assert good.seen == also_good.seen
    assert [seq for seq, _ in good.seen] == [1, 2]
    assert good.seen[0][1] == '{"seq":1,"type":"tool_call_start","x":"\\u00e9"}'
    assert good.seen[0][1] is also_good.seen[0][1]  # one encoding, shared
    assert "this subscriber is broken" in caplog.text

    for subscriber in (good, bad, also_good):
        await feeds.unsubscribe("run.g", subscriber)
    assert feeds.by_group == {}
    assert layer.groups.get("run.g", {}) == {}


async def test_a_feed_hands_a_batch_to_each_subscriber_in_turn():
    """Events committed together arrive as one message (events._push_all): the first
    subscriber has the whole batch before the next one gets its first event."""
    layer = InMemoryChannelLayer()
    feeds = fanout.Feeds()
    order: list[tuple[str, int | str]] = []

    class Named(Recorder):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        async def offer(self, event: dict[str, Any], text: str) -> None:
            order.append((self.name, event["seq"]))
            held = send_batches.hold(self, lambda held: order.append((held.name, "sent")))
            order.append((self.name, "held" if held else "sent"))
            await super().offer(event, text)

    first, second = Named("first"), Named("second")
    for subscriber in (first, second):
        await feeds.subscribe(layer, "run.b", subscriber)
    batch = [run_event(1)["event"], {**run_event(2)["event"], "type": "tool_call_result"}]
    await layer.group_send("run.b", {"type": "run.events", "events": batch})
    await layer.group_send("run.b", run_event(3))
    await until(lambda: len(second.seen) == 3)

    # A subscriber's sends of one batch are held and leave together at the end of its
    # turn (toolhub/server/send_batches.py); a lone event is sent as it comes.
    batch_order = [
        *[("first", 1), ("first", "held"), ("first", 2), ("first", "held"), ("first", "sent")],
        *[("second", 1), ("second", "held"), ("second", 2), ("second", "held")],
        ("second", "sent"),
    ]
    lone = [("first", 3), ("first", "sent"), ("second", 3), ("second", "sent")]
    assert order == [*batch_order, *lone]
    assert first.seen[1][1] is second.seen[1][1]  # still one encoding per event
    for subscriber in (first, second):
        await feeds.unsubscribe("run.b", subscriber)


async def test_a_feed_rejoins_its_group_when_the_membership_expires(monkeypatch):
    monkeypatch.setattr(fanout, "GROUP_REFRESH_S", 0.05)
    layer = InMemoryChannelLayer()
    feeds = fanout.Feeds()
    recorder = Recorder()
    await feeds.subscribe(layer, "run.r", recorder)
    feed: Feed = feeds.by_group["run.r"]

    await layer.group_discard("run.r", feed.channel)  # as group_expiry would
    await until(lambda: feed.channel in layer.groups.get("run.r", {}))
    await layer.group_send("run.r", run_event(1))
    await until(lambda: len(recorder.seen) == 1)
    await feeds.unsubscribe("run.r", recorder)


class FlakyLayer(InMemoryChannelLayer):
    """A real in-memory layer whose next receive fails, like a dropped Redis connection."""

    failures = 1

    async def receive(self, channel: str) -> dict[str, Any]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("connection reset")
        return await super().receive(channel)


async def test_a_feed_keeps_reading_after_the_layer_fails(monkeypatch, caplog):
    monkeypatch.setattr(fanout, "RETRY_S", 0.01)
    layer = FlakyLayer()
    feeds = fanout.Feeds()
    recorder = Recorder()
    await feeds.subscribe(layer, "run.f", recorder)
    await until(lambda: layer.failures == 0)
    await until(lambda: recorder.caught_up == 1)  # told it may have missed events
    await layer.group_send("run.f", run_event(1))
    await until(lambda: len(recorder.seen) == 1)
    assert "could not read (ConnectionError); retrying" in caplog.text
    await feeds.unsubscribe("run.f", recorder)


class RestartableLayer(InMemoryChannelLayer):
    """A real in-memory layer that can "restart" like Redis: it forgets every group and
    answers with a new server identity. Only the channel named in `fail_once` sees a
    failed read, as only the feed whose blocking read was waiting does on Redis; with
    `fail_once` None no read fails at all (Redis went away between two reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.run_id = "first"
        self.fail_once: str | None = None

    async def server_identity(self) -> tuple[str, ...]:
        return (self.run_id,)

    def restart(self, fail_once: str | None) -> None:
        self.groups.clear()
        self.run_id = f"{self.run_id}+"
        self.fail_once = fail_once

    async def receive(self, channel: str) -> dict[str, Any]:
        if channel == self.fail_once:
            self.fail_once = None
            raise ConnectionError("connection closed by server")
        return await super().receive(channel)


@pytest.mark.parametrize("seen_by", ["one feed", "no feed"])
async def test_a_restart_of_the_layer_rejoins_every_feed_of_the_process(monkeypatch, seen_by):
    monkeypatch.setattr(fanout, "RETRY_S", 0.01)
    monkeypatch.setattr(fanout, "WATCH_S", 0.05 if seen_by == "no feed" else 60)
    layer = RestartableLayer()
    feeds = fanout.Feeds()
    recorders = {group: Recorder() for group in ("run.a", "run.b", "run.c")}
    for group, recorder in recorders.items():
        await feeds.subscribe(layer, group, recorder)
    await asyncio.sleep(0.1)  # the watcher has learnt the first identity

    layer.restart(fail_once=feeds.by_group["run.b"].channel if seen_by == "one feed" else None)
    if seen_by == "one feed":
        await layer.send(feeds.by_group["run.b"].channel, {"type": "wake"})
    await until(lambda: all(recorder.caught_up == 1 for recorder in recorders.values()))
    for n, group in enumerate(recorders, start=1):
        await layer.group_send(group, run_event(n))
    await until(lambda: all(len(recorder.seen) == 1 for recorder in recorders.values()))
    assert [recorder.seen[0][0] for recorder in recorders.values()] == [1, 2, 3]

    for group, recorder in recorders.items():
        await feeds.unsubscribe(group, recorder)
    assert feeds._watcher is None


class DownLayer(InMemoryChannelLayer):
    """A real in-memory layer that refuses to join groups until it is `up` again."""

    up = True

    async def group_add(self, group: str, channel: str) -> None:
        if not self.up:
            raise ConnectionError("redis is down")
        await super().group_add(group, channel)


async def test_a_feed_stopped_during_a_repair_stops_trying_and_stays_out_of_its_group(
    monkeypatch,
):
    monkeypatch.setattr(fanout, "RETRY_S", 0.01)
    layer = DownLayer()
    feeds = fanout.Feeds()
    recorder = Recorder()
    await feeds.subscribe(layer, "run.s", recorder)
    feed = feeds.by_group["run.s"]
    layer.up = False
    layer.groups.clear()  # the restart forgot the group
    repair = asyncio.ensure_future(feeds.repair(layer))
    await asyncio.sleep(0.05)  # the repair retries the join
    await feeds.unsubscribe("run.s", recorder)
    await asyncio.wait_for(repair, 1)  # it gives up on a stopped feed...
    layer.up = True
    await asyncio.sleep(0.05)
    assert feed.channel not in layer.groups.get("run.s", {})  # ...and never joins again
    assert recorder.caught_up == 0


async def test_a_layer_that_cannot_say_which_server_answers_is_not_watched():
    feeds = fanout.Feeds()
    recorder = Recorder()
    await feeds.subscribe(InMemoryChannelLayer(), "run.w", recorder)
    assert feeds._watcher is None
    await feeds.unsubscribe("run.w", recorder)


# ------------------------------------------------------------ the operators' stream


@pytest.fixture
def operator_of_acme(acme, test_tools):
    user = User.objects.create_user("op", password="pw-for-tests-only", is_staff=True)
    acme.tenant.members.add(user)
    assign_perm("tools.decide_approval", user, Tool.objects.get(pk="test__confirm"))
    return user


async def open_approvals(user) -> WebsocketCommunicator:
    stream = WebsocketCommunicator(ApprovalsConsumer.as_asgi(), "/ws/v1/approvals/")
    stream.scope["user"] = user
    stream.scope["session"] = await database_sync_to_async(logged_in)(user)
    connected, _ = await stream.connect()
    assert connected
    return stream


def logged_in(user) -> SessionStore:
    """The user's session, as the auth stack puts it in a stream's scope: the stream is
    re-checked against it (apps.invocations.revocations.SessionWatch)."""
    client = Client()
    client.force_login(user)
    return SessionStore(client.cookies[settings.SESSION_COOKIE_NAME].value)


@database_sync_to_async
def emit_approvals(agent, tool_id: str, count: int) -> None:
    for i in range(count):
        emit(
            agent.tenant,
            "fan-approvals",
            "approval_required",
            tool_call_id=f"a{i}",
            tool_id=tool_id,
            approvalId=f"ap-{i}",
        )


async def test_operators_streams_share_the_tenants_feed_and_see_only_decidable_tools(
    acme, operator_of_acme, layer
):
    streams = [await open_approvals(operator_of_acme) for _ in range(3)]
    await listening(tenant_group(acme.tenant.pk), subscribers=3)  # bare events: no re-read
    assert len(members(layer, tenant_group(acme.tenant.pk))) == 1

    await emit_approvals(acme, "test__echo", 1)  # not decidable by this operator
    await emit_approvals(acme, "test__confirm", 2)
    for stream in streams:
        got = [await stream.receive_json_from(timeout=5) for _ in range(2)]
        assert [(e["type"], e["toolId"], e["seq"]) for e in got] == [
            ("approval_required", "test__confirm", 2),
            ("approval_required", "test__confirm", 3),
        ]
        assert await stream.receive_nothing(0.1)
        await stream.disconnect()
    assert members(layer, tenant_group(acme.tenant.pk)) == set()


async def test_an_approval_pushed_between_the_handshake_and_the_subscription_still_arrives(
    acme, operator_of_acme, layer, monkeypatch
):
    """The client sees the handshake (the console then reads its list) before the stream's
    feed has joined the tenant's group: a push in between reaches nobody here, yet the
    event is stored, and the stream's first re-read sends it."""
    await database_sync_to_async(allow)(acme.tenant, "test__confirm")
    subscribe = fanout.Feeds.subscribe
    held: list[str] = []

    def hold_a_call() -> None:
        body = acme.invoke("test__confirm", args={}, runId="fan-late").json()
        held.append(body["approvalId"])

    async def late(self: fanout.Feeds, layer: Any, group: str, subscriber: Any) -> None:
        if group == tenant_group(acme.tenant.pk):
            await database_sync_to_async(hold_a_call)()  # pushed to a group with no member
        await subscribe(self, layer, group, subscriber)

    monkeypatch.setattr(fanout.Feeds, "subscribe", late)
    stream = await open_approvals(operator_of_acme)
    got = await stream.receive_json_from(timeout=5)
    assert (got["type"], got["approvalId"]) == ("approval_required", held[0])
    assert await stream.receive_nothing(0.2)  # once
    await stream.disconnect()


async def test_an_approvals_stream_that_cannot_keep_up_is_closed_with_4008(
    acme, operator_of_acme, layer, settings, monkeypatch
):
    settings.TOOLHUB_WS_QUEUED_EVENTS = 2
    checking = asyncio.Event()

    async def stuck(self: ApprovalsConsumer, tenant_id: int, tool_id: str) -> bool:
        checking.set()
        await asyncio.sleep(30)  # a permission check that never comes back
        return True

    monkeypatch.setattr(ApprovalsConsumer, "_may_decide", stuck)
    stream = await open_approvals(operator_of_acme)
    await listening(tenant_group(acme.tenant.pk))  # bare events: no re-read would find them
    await emit_approvals(acme, "test__confirm", 1)
    await asyncio.wait_for(checking.wait(), 5)  # one being checked...
    await emit_approvals(acme, "test__confirm", 3)  # ...at most two queued: one too many
    assert (await stream.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4008}
    await stream.disconnect()


class RefusingLayer(InMemoryChannelLayer):
    """A real in-memory layer that refuses group membership, like an unreachable Redis."""

    async def group_add(self, group: str, channel: str) -> None:
        await asyncio.sleep(0.05)
        raise ConnectionError("redis is down")


async def test_subscribers_to_a_feed_that_cannot_start_all_get_the_error():
    feeds = fanout.Feeds()
    layer = RefusingLayer()
    results = await asyncio.gather(
        feeds.subscribe(layer, "run.x", Recorder()),
        feeds.subscribe(layer, "run.x", Recorder()),
        return_exceptions=True,
    )
    assert isinstance(results[0], ConnectionError)
    assert isinstance(results[1], fanout.FeedUnavailable)
    assert feeds.by_group == {}


@pytest.fixture
def refusing_layer():
    previous = channel_layers.set(DEFAULT_CHANNEL_LAYER, RefusingLayer())
    yield
    channel_layers.set(DEFAULT_CHANNEL_LAYER, previous)


async def test_a_stream_that_cannot_subscribe_is_closed_with_4011_and_frees_its_slot(
    acme, refusing_layer, settings, caplog
):
    settings.TOOLHUB_WS_MAX_PER_PRINCIPAL = 1
    for _ in range(2):  # the second would get 4429 if the first kept its slot
        stream = WebsocketCommunicator(
            application,
            "/ws/v1/runs/fan-down/",
            headers=[(b"authorization", f"Bearer {acme.key}".encode())],
        )
        connected, _ = await stream.connect()
        assert connected
        assert await stream.receive_output(timeout=5) == {"type": "websocket.close", "code": 4011}
        await stream.disconnect()
    assert "could not subscribe to live events" in caplog.text


# ------------------------------------------------------------ the session, read-only


@pytest.fixture
def staff_session(acme):
    user = User.objects.create_user("ops", password="pw-for-tests-only", is_staff=True)
    acme.tenant.members.add(user)
    client = Client()
    client.force_login(user)
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    return key, Session.objects.get(pk=key).expire_date


def with_cookie(path: str, cookie: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application,
        path,
        headers=[(b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode())],
    )


async def test_a_session_stream_reads_the_session_and_never_writes_it(acme, staff_session, layer):
    key, expires = staff_session
    stream = with_cookie("/ws/v1/runs/fan-session/", key)
    connected, _ = await stream.connect()
    assert connected
    await emit_calls(acme, "fan-session", 2)
    assert await read(stream, 2) == [1, 2]
    await stream.disconnect()
    session = await database_sync_to_async(Session.objects.get)(pk=key)
    assert session.expire_date == expires


@pytest.mark.parametrize("cookie", ["", "not-a-session-key", "x" * 40])
async def test_a_stream_with_a_bad_session_cookie_and_nothing_else_is_refused(acme, cookie):
    stream = with_cookie("/ws/v1/runs/fan-session/", cookie)
    connected, _ = await stream.connect()
    assert connected
    assert await stream.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    await stream.disconnect()


class BreakableLayer(InMemoryChannelLayer):
    """A real in-memory layer whose reader fails when told to, like a Redis that restarts."""

    async def receive(self, channel: str) -> dict[str, Any]:
        message = await super().receive(channel)
        if message["type"] == "test.break":
            raise ConnectionError("connection reset by peer")
        return message


@pytest.fixture
def breakable_layer(monkeypatch):
    monkeypatch.setattr(fanout, "RETRY_S", 0.01)
    layer = BreakableLayer()
    previous = channel_layers.set(DEFAULT_CHANNEL_LAYER, layer)
    yield layer
    channel_layers.set(DEFAULT_CHANNEL_LAYER, previous)


async def test_events_whose_push_was_lost_while_the_layer_failed_reach_the_stream(
    acme, breakable_layer, monkeypatch
):
    stream = await open_stream(acme, "fan-outage")
    assert await emit_calls(acme, "fan-outage", 1) == [1]
    assert await read(stream, 1) == [1]

    # The layer is down: two events are stored but their pushes go nowhere.
    with monkeypatch.context() as patch:
        patch.setattr(events, "_push_all", lambda *args: None)
        assert await emit_calls(acme, "fan-outage", 2) == [2, 3]
    assert await stream.receive_nothing(0.2)

    # The feed's read fails, it re-joins, and the stream re-reads what it missed.
    await breakable_layer.group_send(
        run_group(acme.tenant.pk, "fan-outage"), {"type": "test.break"}
    )
    assert await read(stream, 2) == [2, 3]
    assert await emit_calls(acme, "fan-outage", 1) == [4]
    assert await read(stream, 1) == [4]
    assert await stream.receive_nothing(0.2)
    await stream.disconnect()
