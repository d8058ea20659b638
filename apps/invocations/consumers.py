"""The run stream: /ws/v1/runs/{runId}/?after=<seq>.

Replays persisted events after `after`, then continues live with no gap and no
duplicate at the seam: the consumer joins the run's group before replaying,
drops live events it already sent, and fills any gap it sees from the database.

Memory stays bounded for clients that do not read: the ASGI server buffers what
it is handed without limit, so the consumer hands it at most a byte budget per
second (replay included), and a stream that has needed pacing for longer than
TOOLHUB_WS_SLOW_CLIENT_SECONDS is closed with 4008; the client may reconnect with
?after=<last seq>. While a consumer waits, new events queue in the channel layer,
which holds a bounded number per channel and drops the rest; the gap is then
filled from the database.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from apps.invocations.events import remember_server_loop, run_group
from apps.invocations.models import RunEvent
from apps.invocations.streams import (
    CLOSE_BAD_REQUEST,
    CLOSE_FORBIDDEN,
    StreamAccess,
    connection_slots,
    refuse,
)

logger = logging.getLogger(__name__)

REPLAY_BATCH = 100
GROUP_REFRESH_S = 3600
CLOSE_TOO_SLOW = 4008


class SendBudget:
    """A token bucket over bytes sent: how long to wait before sending `size` more."""

    def __init__(self, rate: int, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def wait_for(self, size: int) -> float:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= size
        return max(0.0, -self.tokens / self.rate)


class RunConsumer(AsyncJsonWebsocketConsumer):
    tenant_id: int
    run_id: str
    last_seq: int = 0
    slot: Any = None
    paced_since: float | None = None
    gone: bool = False
    refresher: asyncio.Future[None] | None = None

    async def connect(self) -> None:
        remember_server_loop()
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        after = StreamAccess.parse_after(self.scope)
        if after is None:
            await refuse(self, CLOSE_BAD_REQUEST)
            return
        access = await database_sync_to_async(StreamAccess.for_run)(self.scope, self.run_id)
        if access is None:
            await refuse(self, CLOSE_FORBIDDEN)
            return
        self.slot = connection_slots.acquire(access.principal_key)
        if self.slot is None:
            await refuse(self, settings.TOOLHUB_WS_CLOSE_TOO_MANY)
            return
        self.tenant_id = access.tenant_id
        self.last_seq = after
        self.budget = SendBudget(settings.TOOLHUB_WS_SEND_RATE, settings.TOOLHUB_WS_SEND_BURST)
        await self.accept()
        await self.channel_layer.group_add(
            run_group(self.tenant_id, self.run_id), self.channel_name
        )
        self.refresher = asyncio.ensure_future(self._keep_membership())
        await self._send_from_database()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Live events skip channels' per-message database-connection cleanup (a
        thread hop per subscriber per event): their handler touches the database only
        through database_sync_to_async, which cleans up after itself."""
        if message.get("type") == "run.event":
            await self.run_event(message)
        else:
            await super().dispatch(message)

    async def _keep_membership(self) -> None:
        """Group membership expires (channel layer group_expiry): re-join hourly so a
        stream open for days keeps receiving live events."""
        group = run_group(self.tenant_id, self.run_id)
        while not self.gone:
            await asyncio.sleep(GROUP_REFRESH_S)
            await self.channel_layer.group_add(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        self.gone = True
        if self.refresher is not None:
            self.refresher.cancel()
        if self.slot is not None:
            self.slot.release()
            self.slot = None
        if hasattr(self, "tenant_id"):
            await self.channel_layer.group_discard(
                run_group(self.tenant_id, self.run_id), self.channel_name
            )

    async def run_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        seq = int(event["seq"])
        if self.gone or seq <= self.last_seq:
            return  # closed, or already replayed
        if seq > self.last_seq + 1:
            await self._send_from_database()  # a push overtook another, or one was dropped
            if self.gone or seq <= self.last_seq:
                return
        await self._deliver(event)

    async def _send_from_database(self) -> None:
        while not self.gone:
            events = await self._events_after(self.last_seq)
            for event in events:
                if not await self._deliver(event):
                    return
            if len(events) < REPLAY_BATCH:
                return

    async def _deliver(self, event: dict[str, Any]) -> bool:
        """Send one event within the byte budget; False once the stream is closed."""
        text = json.dumps(event, separators=(",", ":"))
        wait = self.budget.wait_for(len(text))
        if wait > 0:
            now = time.monotonic()
            self.paced_since = self.paced_since or now
            if now - self.paced_since > settings.TOOLHUB_WS_SLOW_CLIENT_SECONDS:
                logger.info("closing a run stream that cannot keep up (%s)", self.run_id)
                self.gone = True
                await self.close(code=CLOSE_TOO_SLOW)
                return False
            await asyncio.sleep(wait)
            if self.gone:
                return False
        else:
            self.paced_since = None
        await self.send(text_data=text)
        self.last_seq = int(event["seq"])
        return True

    @database_sync_to_async
    def _events_after(self, seq: int) -> list[dict[str, Any]]:
        return list(
            RunEvent.objects.filter(tenant_id=self.tenant_id, run_id=self.run_id, seq__gt=seq)
            .order_by("seq")
            .values_list("message", flat=True)[:REPLAY_BATCH]
        )

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The stream is one-way; anything a client sends is ignored."""
