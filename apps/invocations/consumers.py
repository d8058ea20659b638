"""The run stream: /ws/v1/runs/{runId}/?after=<seq>.

Replays persisted events after `after`, then continues live with no gap and no
duplicate at the seam: the consumer subscribes to the run's feed before replaying,
drops live events it already sent, and fills any gap it sees from the database.
Subscribing first means every event committed after the replay's query is offered
live; filling a gap from the database works because emit numbers and commits a
run's events in order, so the events before any pushed one are already committed.
Replay filters by tenant as the feed's group does (events.run_group).

Live events come from this process's Feed of the run (apps.invocations.fanout),
already encoded; an up-to-date stream writes them to its socket at once.

Memory stays bounded for clients that do not read: the ASGI server buffers what
it is handed without limit, so the consumer hands it at most a byte budget per
second (replay included), and a stream that has needed pacing for longer than
TOOLHUB_WS_SLOW_CLIENT_SECONDS is closed with 4008; the client may reconnect with
?after=<last seq>. While a stream waits, live events queue for it, at most
TOOLHUB_WS_QUEUED_EVENTS of them; past that it drops the queue and reads the
events from the database when it can send again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from apps.invocations.events import remember_server_loop, run_group
from apps.invocations.fanout import encode, feeds_for
from apps.invocations.models import RunEvent
from apps.invocations.revocations import StaffAccess, key_watch, session_watch
from apps.invocations.streams import (
    CLOSE_BAD_REQUEST,
    CLOSE_FORBIDDEN,
    CLOSE_GONE,
    CLOSE_INTERNAL,
    CLOSE_TOO_SLOW,
    NO_CHANNEL,
    OneWayStream,
    StreamAccess,
    connection_slots,
    is_run_id,
    refuse,
)
from toolhub.ops.metrics import CountedStream

logger = logging.getLogger(__name__)

REPLAY_BATCH = 100


class SendBudget:
    """A token bucket over bytes sent: how long to wait before sending `size` more."""

    def __init__(self, rate: int, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def take(self, size: int) -> bool:
        """Spend `size` now if the budget has it; otherwise spend nothing."""
        self._refill()
        if self.tokens < size:
            return False
        self.tokens -= size
        return True

    def wait_for(self, size: int) -> float:
        self._refill()
        self.tokens -= size
        return max(0.0, -self.tokens / self.rate)


class RunConsumer(CountedStream, OneWayStream):
    stream_kind = "runs"  # toolhub_open_streams
    # Live events arrive through the process's Feed for the run, not through a
    # channel of the consumer's own: no per-stream channel is created.
    channel_layer_alias = NO_CHANNEL

    tenant_id: int
    run_id: str
    api_key_id: int | None = None
    staff_watched: bool = False  # opened with a staff session (revocations.SessionWatch)
    group: str | None = None
    last_seq: int = 0
    slot: Any = None
    paced_since: float | None = None
    gone: bool = False
    # While `sending` runs (catching up, pacing, filling a gap), live events
    # wait in `queued`; otherwise `offer` writes them to the socket at once.
    sending: asyncio.Future[None] | None = None
    overflowed: bool = False

    async def connect(self) -> None:
        remember_server_loop()
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        after = StreamAccess.parse_after(self.scope)
        if after is None or not is_run_id(self.run_id):
            await refuse(self, CLOSE_BAD_REQUEST)
            return
        access = await database_sync_to_async(StreamAccess.for_run)(self.scope, self.run_id)
        if access is None:
            await refuse(self, CLOSE_FORBIDDEN)
            return
        pruned = await _pruned(access.tenant_id, self.run_id, after)
        if pruned is not None:
            await self.accept()
            await self._close_pruned(pruned)
            return
        self.slot = await connection_slots.acquire(access.principal_key)
        if self.slot is None:
            await refuse(self, settings.TOOLHUB_WS_CLOSE_TOO_MANY)
            return
        self.tenant_id = access.tenant_id
        self.api_key_id = access.api_key_id
        self.last_seq = after
        self.budget = SendBudget(settings.TOOLHUB_WS_SEND_RATE, settings.TOOLHUB_WS_SEND_BURST)
        self.queued: deque[tuple[int, str]] = deque()
        await self.accept()
        # Subscribe first, then replay: live events that arrive meanwhile queue
        # behind the replay and are dropped there if the replay already sent them.
        self.sending = asyncio.get_running_loop().create_future()
        self.group = run_group(self.tenant_id, self.run_id)
        layer = get_channel_layer()
        try:
            await feeds_for(layer).subscribe(layer, self.group, self)
        except Exception:
            logger.exception("run stream %s could not subscribe to live events", self.run_id)
            self.group = None
            await self.end_stream(CLOSE_INTERNAL)
            return
        self.sending = asyncio.ensure_future(self._send_queued(replay=True))
        if self.api_key_id is not None:
            await key_watch().watch(self.api_key_id, self)
        elif access.staff_user_id is not None:
            self.staff_watched = True
            session_watch().watch(
                StaffAccess(access.staff_user_id, access.session_key, (self.tenant_id,)), self
            )

    async def disconnect(self, code: int) -> None:
        self.gone = True
        if self.sending is not None:
            self.sending.cancel()
        if self.api_key_id is not None:
            key_id, self.api_key_id = self.api_key_id, None
            await key_watch().unwatch(key_id, self)
        if self.staff_watched:
            self.staff_watched = False
            session_watch().unwatch(self)
        if self.slot is not None:
            slot, self.slot = self.slot, None
            await slot.release()
        if self.group is not None:
            group, self.group = self.group, None
            await feeds_for(get_channel_layer()).unsubscribe(group, self)

    async def offer(self, event: dict[str, Any], text: str) -> None:
        """A live event from the run's feed (see apps.invocations.fanout)."""
        seq = int(event["seq"])
        if self.gone or seq <= self.last_seq:
            return  # closed, or already replayed
        if self.sending is None and seq == self.last_seq + 1 and self.budget.take(len(text)):
            self.paced_since = None
            self.last_seq = seq
            await self.base_send({"type": "websocket.send", "text": text})
            return
        if len(self.queued) >= settings.TOOLHUB_WS_QUEUED_EVENTS:
            # Bounded: forget the queue and re-read it from the database.
            self.queued.clear()
            self.overflowed = True
        self.queued.append((seq, text))
        self._start_sending()

    async def key_revoked(self) -> None:
        """Its API key was revoked (apps.invocations.revocations): 4403, as at a handshake."""
        if not self.gone:
            await self.end_stream(CLOSE_FORBIDDEN)

    async def access_revoked(self) -> None:
        """Its staff session ended or its user lost access (revocations.SessionWatch)."""
        await self.key_revoked()

    async def catch_up(self) -> None:
        """The feed may have missed events: read the database once the queue is sent."""
        if self.gone:
            return
        self.overflowed = True
        self._start_sending()

    def _start_sending(self) -> None:
        if self.sending is None:
            self.sending = asyncio.ensure_future(self._send_queued())

    async def _send_queued(self, replay: bool = False) -> None:
        try:
            if replay:
                await self._send_from_database()
            while not self.gone:
                if self.overflowed:
                    self.overflowed = False
                    await self._send_from_database()
                    continue
                if not self.queued:
                    break
                seq, text = self.queued.popleft()
                if seq <= self.last_seq:
                    continue
                if seq > self.last_seq + 1:
                    # A push overtook another, or one was dropped: the database has both.
                    await self._send_from_database()
                    if seq <= self.last_seq:
                        continue
                await self._deliver(seq, text)
        except Exception:
            logger.exception("run stream %s failed; closing it", self.run_id)
            await self.end_stream(CLOSE_INTERNAL)
        finally:
            if not self.gone and self.sending is asyncio.current_task():
                self.sending = None

    async def _send_from_database(self) -> None:
        while not self.gone:
            events = await self._events_after(self.last_seq)
            if events and int(events[0]["seq"]) > self.last_seq + 1:
                pruned = await _pruned(self.tenant_id, self.run_id, self.last_seq)
                if pruned is not None:  # pruned while the stream lagged behind
                    self.gone = True
                    self.queued.clear()
                    await self._close_pruned(pruned)
                    return
            for event in events:
                if not await self._deliver(int(event["seq"]), encode(event)):
                    return
            if len(events) < REPLAY_BATCH:
                return

    async def _deliver(self, seq: int, text: str) -> bool:
        """Send one event within the byte budget; False once the stream is closed."""
        if self.gone:
            return False
        wait = self.budget.wait_for(len(text))
        if wait > 0:
            now = time.monotonic()
            self.paced_since = self.paced_since or now
            if now - self.paced_since > settings.TOOLHUB_WS_SLOW_CLIENT_SECONDS:
                logger.info("closing a run stream that cannot keep up (%s)", self.run_id)
                await self._close_lagging()
                return False
            await asyncio.sleep(wait)
            if self.gone:
                return False
        else:
            self.paced_since = None
        await self.send(text_data=text)
        self.last_seq = seq
        return True

    async def _close_lagging(self) -> None:
        """It cannot keep up: a `stream_lagging` message says where to resume (the last
        event handed to it), then 4008 (docs/asyncapi.yaml). Sent past the byte budget:
        two small frames, once."""
        self.gone = True
        self.queued.clear()
        await self.send(text_data=encode(lagging_message(self.run_id, self.last_seq)))
        await self.close(code=CLOSE_TOO_SLOW, reason=f"lagging: resume with ?after={self.last_seq}")

    async def _close_pruned(self, message: dict[str, Any]) -> None:
        """Retention pruned the events asked for: say so, then close with 4410."""
        await self.send_json(message)
        await self.close(code=CLOSE_GONE)

    async def end_stream(self, code: int) -> None:
        self.gone = True
        self.queued.clear()
        await self.close(code=code)

    @database_sync_to_async
    def _events_after(self, seq: int) -> list[dict[str, Any]]:
        return list(
            RunEvent.objects.filter(tenant_id=self.tenant_id, run_id=self.run_id, seq__gt=seq)
            .order_by("seq")
            .values_list("message", flat=True)[:REPLAY_BATCH]
        )


def lagging_message(run_id: str, resume_after: int) -> dict[str, Any]:
    """The `stream_lagging` message (not an event: no `seq`), sent before 4008."""
    return {
        "v": 1,
        "type": "stream_lagging",
        "runId": run_id,
        "resumeAfter": resume_after,
        "detail": "This stream could not keep up with the run's events and is closed (4008): "
        f"reconnect with ?after={resume_after}.",
    }


@database_sync_to_async
def _pruned(tenant_id: int, run_id: str, after: int) -> dict[str, Any] | None:
    from apps.retention import gone

    return gone.run_events(tenant_id, run_id, after)
